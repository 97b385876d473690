"""Scoped tokens as their user meets them: minted, listed and revoked through /v1/tokens/; a
read token on one channel reads it through every kind of route (precomputed, zarr, cutout, the
Boss's /latest/), writes nothing; an expired token is a 401 on the next request; a revoked one
too, on every web worker of a running stack."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from ndstore.api.models import ApiToken, Collection, Grant
from ndstore.core import precomputed
from ndstore.core.geometry import Box
from ndstore.ops.localstack import LocalStack, free_port
from tests.api.conftest import bearer, client_for, make_dataset
from tests.conftest import own_stack_env

VOXELS = ((np.arange(4 * 64 * 64) * 7) % 251 + 1).astype(np.uint8).reshape(4, 64, 64)
CUTOUT = "/v1/cutout/sc/e1/img8/0/0:64/0:64/0:4/"


@pytest.fixture
def owner(admin: APIClient) -> APIClient:
    """A user who may write collection `sc` (experiment e1: img8, img16), whose img8 holds VOXELS."""
    make_dataset(admin, name="sc", channels={"img8": "uint8", "img16": "uint16"})
    assert admin.generic("POST", CUTOUT, VOXELS.tobytes(), content_type="application/octet-stream").status_code == 201
    user = User.objects.create(username="owner")
    Grant.objects.create(user=user, collection=Collection.objects.get(name="sc"), level="write")
    return client_for(user)


def mint(client: APIClient, **body: Any) -> Any:
    return client.post("/v1/tokens/", {"level": "read", "expires_in": 3600, **body}, format="json")


def test_mint_list_and_revoke_ones_own_tokens(owner: APIClient) -> None:
    r = mint(owner, label="for Ann", scope="sc/e1/img8")
    assert r.status_code == 201, r.content
    minted = r.json()
    assert minted["scope"] == "sc/e1/img8" and minted["level"] == "read" and minted["label"] == "for Ann"
    assert minted["expires"] and not minted["expired"] and len(minted["key"]) == 40 and "share_url" not in minted
    listed = owner.get("/v1/tokens/").json()["tokens"]
    assert [t["id"] for t in listed if t["scope"] == "sc/e1/img8"] == [minted["id"]]
    assert all("key" not in t for t in listed)
    assert [t["current"] for t in listed] == [t["scope"] is None for t in listed]  # the owner's own, unscoped
    assert ApiToken.objects.get(pk=minted["id"]).key_hash != minted["key"]  # only its hash is kept

    reader = bearer(minted["key"])
    assert reader.get(CUTOUT, HTTP_ACCEPT="application/octet-stream").status_code == 200
    assert owner.delete(f"/v1/tokens/{minted['id']}/").status_code == 204
    refused = reader.get(CUTOUT, HTTP_ACCEPT="application/octet-stream")
    assert refused.status_code == 401 and "invalid or revoked" in refused.json()["message"]
    assert owner.delete(f"/v1/tokens/{minted['id']}/").status_code == 404


def test_a_read_token_on_a_channel_reads_it_through_every_kind_of_route(owner: APIClient) -> None:
    reader = bearer(mint(owner, scope="sc/e1/img8").json()["key"])
    chunk = precomputed.chunk_name(Box.from_ranges((0, 64), (0, 64), (0, 4)))
    got = reader.get(CUTOUT, HTTP_ACCEPT="application/octet-stream")
    assert got.status_code == 200 and np.array_equal(np.frombuffer(got.content, np.uint8).reshape(4, 64, 64), VOXELS)
    latest = reader.get(CUTOUT.replace("/v1/", "/latest/"), HTTP_ACCEPT="application/octet-stream")
    assert latest.status_code == 200 and latest.content == got.content
    assert reader.get("/precomputed/sc/e1/img8/info").status_code == 200
    raw = reader.get(f"/precomputed/sc/e1/img8/0/{chunk}")
    assert raw.status_code == 200
    assert np.array_equal(np.frombuffer(raw.content, np.uint8).reshape(4, 64, 64), VOXELS)  # x fastest, as cut
    assert reader.get("/zarr/sc/e1/img8/zarr.json").status_code == 200
    assert reader.get("/zarr/sc/e1/img8/0/c/0/0/0/0").status_code == 200
    assert reader.get("/v1/image/sc/e1/img8/xy/0/0:64/0:64/1/").status_code == 200
    assert reader.get("/v1/collection/sc/experiment/e1/channel/img8/").status_code == 200


def test_a_read_token_writes_nothing_and_a_write_token_only_its_channel(owner: APIClient) -> None:
    reader = bearer(mint(owner, scope="sc/e1/img8").json()["key"])
    refused = reader.generic("POST", CUTOUT, VOXELS.tobytes(), content_type="application/octet-stream")
    assert refused.status_code == 403 and "limited to read" in refused.json()["message"]
    writer = bearer(mint(owner, scope="sc/e1/img8", level="write").json()["key"])
    assert writer.generic("POST", CUTOUT, VOXELS.tobytes(),
                          content_type="application/octet-stream").status_code == 201
    other = writer.generic("POST", CUTOUT.replace("img8", "img16"), VOXELS.astype(np.uint16).tobytes(),
                           content_type="application/octet-stream")
    assert other.status_code == 403 and "scoped to sc/e1/img8" in other.json()["message"]


def test_an_expired_token_is_refused_on_its_next_request(owner: APIClient) -> None:
    r = mint(owner, scope="sc/e1/img8", expires_in=1)
    reader = bearer(r.json()["key"])
    assert reader.get("/precomputed/sc/e1/img8/info").status_code == 200  # the token row is cached now
    time.sleep(1.2)
    for path in ("/precomputed/sc/e1/img8/info", CUTOUT, "/v1/tokens/"):
        refused = reader.get(path)
        assert refused.status_code == 401 and refused.json()["message"] == "token expired", (path, refused.content)
    listed = owner.get("/v1/tokens/").json()["tokens"]
    assert [t["expired"] for t in listed if t["id"] == r.json()["id"]] == [True]


def test_a_scoped_token_mints_narrower_tokens_that_go_with_it(owner: APIClient) -> None:
    experiment = mint(owner, scope="sc/e1", expires_in=600).json()
    as_experiment = bearer(experiment["key"])
    channel = mint(as_experiment, scope="sc/e1/img16", expires_in=60)
    assert channel.status_code == 201, channel.content
    assert {t["id"] for t in as_experiment.get("/v1/tokens/").json()["tokens"]} == {experiment["id"],
                                                                                   channel.json()["id"]}
    assert bearer(channel.json()["key"]).get("/precomputed/sc/e1/img16/info").status_code == 200
    assert owner.delete(f"/v1/tokens/{experiment['id']}/").status_code == 204
    assert bearer(channel.json()["key"]).get("/precomputed/sc/e1/img16/info").status_code == 401


def test_a_share_link_carries_the_token_in_its_fragment(owner: APIClient) -> None:
    r = mint(owner, scope="sc/e1/img8", share=True)
    assert r.status_code == 201, r.content
    url = r.json()["share_url"]
    assert url == f"http://testserver/share/#token={r.json()['key']}&view=sc/e1/img8&layer=image"
    page = APIClient().get("/share/")
    assert page.status_code == 200 and r.json()["key"] not in page.content.decode()
    wider = mint(owner, scope="sc/e1", share=True, view="sc/e1/img16")
    assert wider.status_code == 201 and wider.json()["share_url"].endswith("&view=sc/e1/img16&layer=image")


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with LocalStack(tmp_path_factory.mktemp("scoped-tokens"), port=free_port(), workers=2, threads=2,
                    with_merger=False, with_runner=False,
                    extra_env=own_stack_env({"NDSTORE_ANON_READ_RATE": "0", "NDSTORE_DEMO": "0"})) as stack:
        yield stack


def web_workers(stack: LocalStack) -> list[int]:
    """gunicorn's worker processes: the children of the stack's gunicorn."""
    [master] = [p.pid for p in stack.procs if "gunicorn" in " ".join(map(str, p.args))]
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == master:
            children.append(int(stat.parent.name))
    return sorted(children)


def written(pids: list[int]) -> dict[int, int]:
    """Bytes each process has written so far (its answers and its request log lines among them)."""
    return {pid: int(re.search(r"wchar: (\d+)", Path(f"/proc/{pid}/io").read_text()).group(1))  # type: ignore[union-attr]
            for pid in pids}


def burst(stack: LocalStack, url: str, headers: dict[str, str]) -> tuple[set[int], set[int]]:
    """40 requests, 8 at a time (so the front opens several connections to gunicorn, which its
    workers share): the statuses answered, and the workers that answered some."""
    workers = web_workers(stack)
    before = written(workers)
    with ThreadPoolExecutor(8) as pool:
        statuses = set(pool.map(lambda _: requests.get(url, headers=headers, timeout=30).status_code, range(40)))
    after = written(workers)
    return statuses, {pid for pid in workers if after[pid] > before[pid]}


def test_a_revoked_token_is_refused_at_once_by_every_web_worker(two_workers: LocalStack) -> None:
    """Both of gunicorn's workers answer with the token cached, then the token is revoked: the
    metadata generation (Redis) drops it in both at once."""
    stack = two_workers
    admin = {"Authorization": f"Token {(stack.data_dir / 'admin_token').read_text().strip()}"}
    for path, body in [("/v1/coord/w_frame/", {"x_stop": 64, "y_stop": 64, "z_stop": 4}), ("/v1/collection/w/", {}),
                       ("/v1/collection/w/experiment/e/", {"coord_frame": "w_frame"}),
                       ("/v1/collection/w/experiment/e/channel/c/", {"datatype": "uint8"})]:
        assert requests.post(f"{stack.url}{path}", json=body, headers=admin, timeout=30).status_code == 201
    owner = subprocess.run([sys.executable, "-m", "ndstore.cli", "token", "--data-dir", str(stack.data_dir),
                            "--user", "w-owner"], capture_output=True, text=True, check=True).stdout.split()[-1]
    assert requests.post(f"{stack.url}/v1/permissions/", json={"user": "w-owner", "collection": "w", "level": "read"},
                         headers=admin, timeout=30).status_code == 201
    minted = requests.post(f"{stack.url}/v1/tokens/", json={"scope": "w/e/c", "level": "read", "expires_in": 600},
                           headers={"Authorization": f"Token {owner}"}, timeout=30).json()
    info = f"{stack.url}/precomputed/w/e/c/info"
    shared = {"Authorization": f"Bearer {minted['key']}"}
    assert len(web_workers(stack)) == 2
    idle = written(web_workers(stack))
    time.sleep(1)
    assert written(web_workers(stack)) == idle  # what a worker writes is its answers: the measure below
    assert burst(stack, info, shared) == ({200}, set(web_workers(stack)))
    r = requests.delete(f"{stack.url}/v1/tokens/{minted['id']}/", headers={"Authorization": f"Token {owner}"},
                        timeout=30)
    assert r.status_code == 204, r.text
    assert burst(stack, info, shared) == ({401}, set(web_workers(stack)))
