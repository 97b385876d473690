"""OME-Zarr labels (issue 51, item 3): an annotation channel that names an image channel among its
sources is a label image of it: its own group carries `image-label` metadata, and the image's
group has a `labels/` group listing it, under which the label image is served again (the layout
napari and ome-zarr look for)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from tests.api.conftest import Dataset, client_for, make_dataset
from tests.api.test_precomputed import served  # noqa: F401  (the live server fixture)

BOX = ((0, 200), (0, 150), (0, 20))


@pytest.fixture
def labelled(admin: APIClient) -> tuple[Dataset, np.ndarray]:
    ds = make_dataset(admin, name="lbl", frame=(200, 150, 20), levels=1, channels={"img8": "uint8"})
    for name, sources in (("cells", ["img8"]), ("loose", [])):
        r = admin.post(f"/v1/collection/lbl/experiment/e1/channel/{name}/",
                       {"type": "annotation", "datatype": "uint64", "sources": sources}, format="json")
        assert r.status_code == 201, r.content
    labels = np.random.default_rng(2).integers(0, 5, (20, 150, 200)).astype(np.uint64) * 1000
    r = admin.generic("POST", "/v1/cutout/lbl/e1/cells/0/0:200/0:150/0:20/", labels.tobytes(),
                      content_type="application/octet-stream")
    assert r.status_code == 201, r.content
    return ds, labels


def _ome(client: APIClient, path: str) -> dict:  # type: ignore[type-arg]
    r = client.get(f"/zarr/lbl/e1/{path}")
    assert r.status_code == 200, (path, r.content)
    return json.loads(r.content)["attributes"]["ome"]  # type: ignore[no-any-return]


def test_an_image_lists_its_labels_and_each_says_it_is_one(admin: APIClient, labelled: tuple) -> None:  # type: ignore[type-arg]
    assert _ome(admin, "img8/labels/zarr.json") == {"version": "0.5", "labels": ["cells"]}
    assert _ome(admin, "cells/zarr.json")["image-label"] == {"version": "0.5", "source": {"image": "../img8"}}
    under = _ome(admin, "img8/labels/cells/zarr.json")
    assert under["image-label"] == {"version": "0.5", "source": {"image": "../../"}}
    assert under["multiscales"] == _ome(admin, "cells/zarr.json")["multiscales"]
    assert _ome(admin, "loose/zarr.json")["image-label"] == {"version": "0.5"}
    assert "image-label" not in _ome(admin, "img8/zarr.json")
    for missing in ("img8/labels/loose/zarr.json", "img8/labels/img8/zarr.json", "img8/labels/nothing/zarr.json"):
        assert admin.get(f"/zarr/lbl/e1/{missing}").status_code == 404, missing


def test_zarr_python_reads_a_label_image_under_its_image(served: str, admin: APIClient,  # noqa: F811
                                                         labelled: tuple) -> None:  # type: ignore[type-arg]
    zarr = pytest.importorskip("zarr")
    _, labels = labelled
    assert admin.put("/v1/collection/lbl/", {"public": True}, format="json").status_code == 200
    image = zarr.open_group(f"{served}/zarr/lbl/e1/img8", mode="r")
    assert image["labels"].attrs["ome"]["labels"] == ["cells"]
    cells = image["labels"]["cells"]
    assert cells.attrs["ome"]["image-label"]["source"]["image"] == "../../"
    np.testing.assert_array_equal(cells["0"][0], labels)


def test_a_label_the_caller_may_not_read_is_neither_listed_nor_served(admin: APIClient,
                                                                       labelled: tuple) -> None:  # type: ignore[type-arg]
    viewer = client_for(User.objects.create(username="img-only"))
    r = admin.post("/v1/permissions/", {"user": "img-only", "collection": "lbl", "experiment": "e1",
                                        "channel": "img8", "level": "read"}, format="json")
    assert r.status_code == 201, r.content
    assert _ome(viewer, "img8/labels/zarr.json")["labels"] == []
    for path in ("img8/labels/cells/zarr.json", "img8/labels/cells/0/zarr.json", "img8/labels/cells/0/c/0/0/0/0"):
        assert viewer.get(f"/zarr/lbl/e1/{path}").status_code == 403, path
    assert APIClient().get("/zarr/lbl/e1/img8/labels/zarr.json").status_code == 401



def test_ome_zarr_reads_the_image_and_finds_its_label_as_a_label(served: str, admin: APIClient,  # noqa: F811
                                                                  labelled: tuple) -> None:  # type: ignore[type-arg]
    """ome-zarr's Reader (what napari's ome-zarr plugin uses) over HTTP: the image node with its
    voxels, the labels group, and the label image as a Label of that image, with its voxels;
    opened at the label itself, it finds its image through `image-label.source`."""
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Label, Labels, Multiscales, Reader

    _, labels = labelled
    image = np.random.default_rng(3).integers(0, 256, (20, 150, 200)).astype(np.uint8)
    r = admin.generic("POST", "/v1/cutout/lbl/e1/img8/0/0:200/0:150/0:20/", image.tobytes(),
                      content_type="application/octet-stream")
    assert r.status_code == 201, r.content
    assert admin.put("/v1/collection/lbl/", {"public": True}, format="json").status_code == 200
    location = parse_url(f"{served}/zarr/lbl/e1/img8")
    assert location is not None, "ome-zarr found no OME-Zarr group at the image"
    assert location.version == "0.5"
    nodes = {node.zarr.path.rstrip("/").rsplit("/zarr/lbl/e1/", 1)[1]: node for node in Reader(location)()}
    assert list(nodes) == ["img8", "img8/labels", "img8/labels/cells"]
    assert [type(s) for s in nodes["img8"].specs] == [Multiscales]
    np.testing.assert_array_equal(nodes["img8"].data[0].compute()[0], image)
    assert [type(s) for s in nodes["img8/labels"].specs] == [Labels]
    cells = nodes["img8/labels/cells"]
    assert [type(s) for s in cells.specs] == [Label, Multiscales] and cells.metadata["name"] == "cells"
    np.testing.assert_array_equal(cells.data[0].compute()[0], labels)
    from_label = parse_url(f"{served}/zarr/lbl/e1/img8/labels/cells")
    assert from_label is not None
    first, *rest = Reader(from_label)()
    assert first.zarr.path.rstrip("/").endswith("/zarr/lbl/e1/img8") and not first.visible  # its image, behind
    assert any(isinstance(s, Label) for node in rest for s in node.specs)
