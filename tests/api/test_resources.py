"""Boss v1 resource endpoints: shapes, create/update/delete, and clear errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ndstore.api.models import Collection
from tests.api.conftest import Dataset, make_dataset


def test_boss_shapes(admin: Any, dataset: Dataset) -> None:
    coll = admin.get("/v1/collection/c1/").json()
    assert coll == {"name": "c1", "description": "test", "experiments": ["e1"], "creator": "root", "public": False}
    exp = admin.get("/v1/collection/c1/experiment/e1/").json()
    assert exp["coord_frame"] == "c1_frame" and exp["hierarchy_method"] == "anisotropic"
    assert exp["num_hierarchy_levels"] == 3 and sorted(exp["channels"]) == sorted(dataset.channels)
    chan = admin.get("/v1/collection/c1/experiment/e1/channel/ann64/").json()
    assert {k: chan[k] for k in ("type", "datatype", "base_resolution", "sources", "experiment")} == {
        "type": "annotation", "datatype": "uint64", "base_resolution": 0, "sources": [], "experiment": "e1"}
    frame = admin.get("/v1/coord/c1_frame/").json()
    assert (frame["x_stop"], frame["y_stop"], frame["z_stop"], frame["voxel_unit"]) == (1100, 700, 100, "nanometers")
    assert admin.get("/v1/collection/").json() == {"collections": ["c1"]}
    assert admin.get("/v1/collection/c1/experiment/e1/channel/").json()["channels"] == sorted(dataset.channels)
    assert admin.get("/v1/coord/").json() == {"coords": ["c1_frame"]}


def test_update_description_and_refuse_layout_changes(admin: Any, dataset: Dataset) -> None:
    url = "/v1/collection/c1/experiment/e1/channel/img8/"
    r = admin.put(url, {"description": "new"}, format="json")
    assert r.status_code == 200 and r.json()["description"] == "new"
    r = admin.put(url, {"datatype": "uint16"}, format="json")
    assert r.status_code == 400 and "datatype cannot be changed" in r.json()["message"]
    r = admin.put("/v1/coord/c1_frame/", {"x_stop": 5}, format="json")
    assert r.status_code == 400 and "x_stop cannot be changed" in r.json()["message"]
    r = admin.put("/v1/collection/c1/", {"name": "renamed"}, format="json")
    assert r.status_code == 400 and "renaming" in r.json()["message"]


@pytest.mark.parametrize("url,body,message", [
    ("/v1/collection/c1/experiment/e1/channel/bad/", {"type": "annotation", "datatype": "uint8"},
     "annotation channels store one of uint32, uint64"),
    ("/v1/collection/c1/experiment/e1/channel/bad/", {"datatype": "int7"}, "datatype"),
    ("/v1/collection/c1/experiment/e1/channel/bad/", {"base_resolution": 9}, "base_resolution"),
    ("/v1/collection/c1/experiment/e1/channel/bad/", {"sources": ["ghost"]},
     "no such channel in this experiment: ghost"),
    ("/v1/collection/c1/experiment/e2/", {"coord_frame": "nope"}, "coord_frame"),
    ("/v1/collection/c1/experiment/e2/", {"coord_frame": "c1_frame", "num_hierarchy_levels": 0},
     "num_hierarchy_levels"),
    ("/v1/collection/c1/experiment/e2/", {"coord_frame": "c1_frame", "hierarchy_method": "magic"}, "hierarchy_method"),
    ("/v1/coord/f2/", {"x_start": 10, "x_stop": 10, "y_stop": 1, "z_stop": 1}, "x_stop must be greater"),
    ("/v1/coord/f2/", {"x_stop": 1, "y_stop": 1}, "z_stop"),
    ("/v1/collection/c1/experiment/e2/", [1, 2], "JSON object"),
])
def test_invalid_resources_name_the_field(admin: Any, dataset: Dataset, url: str, body: Any, message: str) -> None:
    r = admin.post(url, body, format="json")
    assert r.status_code == 400, r.content
    assert message in r.json()["message"]


def test_names_outside_the_pattern_are_refused_naming_the_rule(admin: Any) -> None:
    for name in ("bad name", "-dash"):
        r = admin.post(f"/v1/collection/{name.replace(' ', '%20')}/", {}, format="json")
        assert r.status_code == 400, r.content
        assert r.json()["message"] == (f"invalid name {name!r} in '/v1/collection/{name}/': names are 1-64 letters, "
                                       "digits, '_' or '-', not starting with '-'")
    assert Collection.objects.count() == 0


def test_duplicates_conflict(admin: Any, dataset: Dataset) -> None:
    r = admin.post("/v1/collection/c1/", {}, format="json")
    assert r.status_code == 409 and "already exists" in r.json()["message"]
    r = admin.post("/v1/collection/c1/experiment/e1/channel/img8/", {}, format="json")
    assert r.status_code == 409


def test_delete_order_is_enforced(admin: Any, dataset: Dataset) -> None:
    r = admin.delete("/v1/collection/c1/")
    assert r.status_code == 409 and "still has experiments" in r.json()["message"]
    r = admin.delete("/v1/coord/c1_frame/")
    assert r.status_code == 409 and "experiments using it" in r.json()["message"]
    admin.post("/v1/collection/c1/experiment/e1/channel/ann2/", {"type": "annotation", "datatype": "uint64",
                                                                  "sources": ["img8"]}, format="json")
    r = admin.delete("/v1/collection/c1/experiment/e1/channel/img8/")
    assert r.status_code == 409 and "source of ann2" in r.json()["message"]


def test_deleting_a_channel_deletes_its_data(admin: Any) -> None:
    from ndstore import wiring
    from ndstore.api import lookups
    from ndstore.api.models import Channel

    ds = make_dataset(admin, name="gone")
    url = ds.cutout("img8", 0, (0, 600), (0, 100), (0, 70))
    admin.generic("POST", url, np.ones((70, 100, 600), np.uint8).tobytes(), content_type="application/octet-stream")
    volume = lookups.channel_volume(Channel.objects.get(name="img8", experiment__collection__name="gone"))
    key = volume.volume_key(0, 0)
    index = wiring.services().index
    assert index.mortons(key) == []  # still only in the cache tier
    assert wiring.services().cache_tier.upkeep.flush_all() == 4
    assert len(index.mortons(key)) == 4
    assert admin.delete("/v1/collection/gone/experiment/e1/channel/img8/").status_code == 204
    assert index.mortons(key) == []
    objects = [key.supercuboid(m).object_key for m in range(8)]
    config = wiring.services().config
    store = wiring.OBJECT_STORES[config.object_store](config)  # the base tier's store, on its own
    assert all(blob is None for _, blob in store.get_many(objects))
    assert wiring.services().cache_tier.upkeep.occupancy() == (0, 0)
    for path in ("/v1/collection/gone/experiment/e1/", "/v1/collection/gone/", "/v1/coord/gone_frame/"):
        assert admin.delete(path).status_code == 204
    assert admin.get("/v1/collection/gone/").status_code == 404


def test_metadata_database_follows_database_url(db: Any) -> None:
    import os

    from django.db import connection

    expected = "postgresql" if os.environ.get("DATABASE_URL", "").startswith("postgres") else "sqlite"
    assert connection.vendor == expected
