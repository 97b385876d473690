"""The real `intern` client (the Boss's Python SDK, unmodified) against this service over real
HTTP (pytest-django's live server), wired to moto's S3/DynamoDB and a real redis-server.

BossRemote: resource create/get/list/update/delete, cutouts (uint8, uint64, time ranges, access
modes, id filters), cutout_to_black, reserve_ids, get_ids_in_region, get_bounding_box, metadata;
and `intern.array` slicing reads and assignment writes. Every read is checked voxel for voxel.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
from django.contrib.auth.models import User
from intern import array
from intern.remote.boss import BossRemote
from intern.resource.boss.resource import (
    ChannelResource,
    CollectionResource,
    CoordinateFrameResource,
    ExperimentResource,
)
from intern.service.boss.httperrorlist import HTTPErrorList
from intern.service.boss.v1.volume import CacheMode
from requests import HTTPError

from ndstore.api.models import ApiToken

FRAME = (600, 400, 40)  # x, y, z


@pytest.fixture
def config(live_server: Any, transactional_db: Any, monkeypatch: pytest.MonkeyPatch,
           tmp_path: Any) -> Iterator[dict[str, str]]:
    """A staff user's token and the live server, as intern's config dict. `intern.array` builds
    its own BossRemote() (ignoring boss_config for bossdb:// URIs), which reads ~/.intern or the
    INTERN_* environment: point both at this server."""
    user = User.objects.create(username="intern-user", is_staff=True)
    _, key = ApiToken.mint(user)
    cfg = {"protocol": "http", "host": live_server.url.removeprefix("http://"), "token": key}
    monkeypatch.setenv("HOME", str(tmp_path))
    for name, value in cfg.items():
        monkeypatch.setenv(f"INTERN_{name.upper()}", value)
    yield cfg
    gc.collect()  # the BossRemotes intern.array made for itself close their keep-alive connections


def close(remote: BossRemote) -> None:
    """Close a remote's keep-alive connections now: the live server's request threads then end
    inside the test, not after the session stopped sharing the test database with them."""
    for service in (remote.project_service, remote.metadata_service, remote.volume_service):
        service.session.close()


@pytest.fixture
def boss(config: dict[str, str]) -> Iterator[BossRemote]:
    remote = BossRemote(config)
    yield remote
    close(remote)


def http(config: dict[str, str], method: str, route: str, **kw: Any) -> requests.Response:
    """A plain request with the same token, for routes intern has no method for."""
    url = f"{config['protocol']}://{config['host']}/v1/{route}"
    return requests.request(method, url, headers={"Authorization": f"Token {config['token']}"}, timeout=60, **kw)


def make_project(boss: BossRemote, coll: str = "ic", times: int = 3, levels: int = 2) -> dict[str, ChannelResource]:
    boss.create_project(CollectionResource(coll, "made by intern"))
    boss.create_project(CoordinateFrameResource(f"{coll}_frame", "frame", 0, FRAME[0], 0, FRAME[1], 0, FRAME[2],
                                                4, 4, 40, "nanometers"))
    boss.create_project(ExperimentResource("exp", coll, f"{coll}_frame", "an experiment", num_hierarchy_levels=levels,
                                           hierarchy_method="anisotropic", num_time_samples=times))
    img = boss.create_project(ChannelResource("img", coll, "exp", "image", datatype="uint8"))
    ann = boss.create_project(ChannelResource("ann", coll, "exp", "annotation", datatype="uint64", sources=["img"]))
    return {"img": img, "ann": ann}


def test_resources_round_trip_through_intern(boss: BossRemote) -> None:
    chans = make_project(boss)
    coll = boss.get_project(CollectionResource("ic"))
    assert coll.name == "ic" and coll.description == "made by intern" and coll.creator == "intern-user"
    frame = boss.get_coordinate_frame("ic_frame")
    assert (frame.x_stop, frame.y_stop, frame.z_stop, frame.z_voxel_size, frame.voxel_unit) == \
        (600, 400, 40, 40, "nanometers")
    exp = boss.get_experiment("ic", "exp")
    assert (exp.coord_frame, exp.num_hierarchy_levels, exp.hierarchy_method, exp.num_time_samples) == \
        ("ic_frame", 2, "anisotropic", 3)
    chan = boss.get_channel("ann", "ic", "exp")
    assert (chan.type, chan.datatype, chan.sources, chan.downsample_status) == \
        ("annotation", "uint64", ["img"], "NOT_DOWNSAMPLED")
    assert chans["img"].datatype == "uint8" and chans["img"].cutout_ready

    assert boss.list_collections() == ["ic"]
    assert "ic_frame" in boss.list_coordinate_frames()
    assert boss.list_experiments("ic") == ["exp"]
    assert boss.list_channels("ic", "exp") == ["ann", "img"]
    assert boss.get_extents(exp) == [[0, 600], [0, 400], [0, 40]]

    updated = boss.update_project("img", ChannelResource("img", "ic", "exp", "image", "new words", datatype="uint8"))
    assert updated.description == "new words"
    assert boss.get_channel("img", "ic", "exp").description == "new words"
    boss.set_project_public_visibility(coll, True)
    assert boss.get_project(CollectionResource("ic")).public is True
    frame.description = "renamed frame"
    assert boss.update_project("ic_frame", frame).description == "renamed frame"

    with pytest.raises(HTTPError, match=r"\(409\)"):
        boss.create_project(CollectionResource("ic"))
    with pytest.raises(HTTPError, match=r"\(409\).*still has experiments"):
        boss.delete_project(coll)
    for name in ("ann", "img"):
        boss.delete_project(ChannelResource(name, "ic", "exp"))
    boss.delete_project(exp)
    boss.delete_project(coll)
    boss.delete_project(frame)
    assert boss.list_collections() == []
    with pytest.raises(HTTPError, match=r"\(404\)"):
        boss.get_project(CollectionResource("ic"))


def test_uint8_and_uint64_cutouts_read_back_exactly(boss: BossRemote) -> None:
    chans = make_project(boss)
    rng = np.random.default_rng(7)
    img = rng.integers(1, 256, (20, 150, 300), dtype=np.uint8)
    boss.create_cutout(chans["img"], 0, [100, 400], [50, 200], [10, 30], img)
    ann = rng.integers(1, 2**64 - 1, (8, 70, 90), dtype=np.uint64, endpoint=True)
    ann[0, 0, 0] = 2**64 - 1
    boss.create_cutout(chans["ann"], 0, [510, 600], [330, 400], [32, 40], ann)

    for mode in (CacheMode.cache, CacheMode.no_cache, CacheMode.raw):  # raw: after no_cache wrote it back
        got = boss.get_cutout(chans["img"], 0, [100, 400], [50, 200], [10, 30], access_mode=mode)
        assert got.dtype == np.uint8 and np.array_equal(got, img), mode
    got = boss.get_cutout(chans["ann"], 0, [510, 600], [330, 400], [32, 40])
    assert got.dtype == np.uint64 and np.array_equal(got, ann)

    # A wider box: the written part, zeros around it (sparse regions read as zeros).
    wide = boss.get_cutout(chans["img"], 0, [90, 410], [40, 210], [5, 35])
    expect = np.zeros((30, 170, 320), np.uint8)
    expect[5:25, 10:160, 10:310] = img
    assert np.array_equal(wide, expect)

    with pytest.raises(HTTPError, match=r"\(400\).*outside the coordinate frame"):
        boss.get_cutout(chans["img"], 0, [0, 601], [0, 10], [0, 1])


def test_time_ranges_filters_and_to_black(boss: BossRemote) -> None:
    chans = make_project(boss)
    series = np.arange(2 * 4 * 30 * 40, dtype=np.uint8).reshape(2, 4, 30, 40) % 251 + 1
    boss.create_cutout(chans["img"], 0, [0, 40], [0, 30], [0, 4], series, time_range=[1, 3])
    got = boss.get_cutout(chans["img"], 0, [0, 40], [0, 30], [0, 4], time_range=[0, 3])
    assert got.shape == (3, 4, 30, 40)
    assert not got[0].any() and np.array_equal(got[1:], series)
    assert not boss.get_cutout(chans["img"], 0, [0, 40], [0, 30], [0, 4]).any()  # default_time_sample 0

    labels = np.zeros((4, 32, 32), np.uint64)
    labels[0:2, 0:8, 0:8] = 5
    labels[2:4, 20:32, 10:30] = 9
    labels[3, 31, 31] = 2**40
    boss.create_cutout(chans["ann"], 0, [0, 32], [0, 32], [0, 4], labels)
    only9 = boss.get_cutout(chans["ann"], 0, [0, 32], [0, 32], [0, 4], id_list=[9, 2**40])
    assert np.array_equal(only9, np.where(labels == 5, 0, labels))

    boss.create_cutout_to_black(chans["ann"], 0, [0, 16], [0, 16], [0, 4])
    labels[:, 0:16, 0:16] = 0
    assert np.array_equal(boss.get_cutout(chans["ann"], 0, [0, 32], [0, 32], [0, 4]), labels)
    boss.create_cutout_to_black(chans["img"], 0, [10, 20], [0, 30], [0, 4], time_range=[2, 3])
    series[1, :, :, 10:20] = 0
    got = boss.get_cutout(chans["img"], 0, [0, 40], [0, 30], [0, 4], time_range=[1, 3])
    assert np.array_equal(got, series)


def test_reserve_ids_regions_and_bounding_boxes(boss: BossRemote, config: dict[str, str]) -> None:
    chans = make_project(boss)
    first = boss.reserve_ids(chans["ann"], 10)
    second = boss.reserve_ids(chans["ann"], 5)
    assert first == 1 and second == 11
    assert boss.reserve_ids(boss.get_channel("ann", "ic", "exp"), 1) == 16

    labels = np.zeros((6, 100, 300), np.uint64)
    labels[1:3, 10:20, 5:7] = first
    labels[5, 99, 299] = first  # across a supercuboid boundary: x 512 is the next supercuboid
    labels[2:4, 40:60, 100:120] = second
    boss.create_cutout(chans["ann"], 0, [250, 550], [300, 400], [30, 36], labels)
    # the region ids of a box that holds the first label only partly, and of the whole box
    assert boss.get_ids_in_region(chans["ann"], 0, [250, 260], [300, 330], [30, 40]) == [first]
    assert boss.get_ids_in_region(chans["ann"], 0, [0, 600], [0, 400], [0, 40]) == [first, second]
    assert boss.get_ids_in_region(chans["ann"], 0, [0, 10], [0, 10], [0, 1]) == []

    tight = boss.get_bounding_box(chans["ann"], 0, first, "tight")
    assert tight == {"x_range": [255, 550], "y_range": [310, 400], "z_range": [31, 36], "t_range": [0, 1]}
    loose = boss.get_bounding_box(chans["ann"], 0, second, "loose")  # cuboids of uint64: 128 x 128 x 2
    assert loose == {"x_range": [256, 384], "y_range": [256, 384], "z_range": [32, 34], "t_range": [0, 1]}
    with pytest.raises(HTTPError, match=r"\(404\).*does not occur"):
        boss.get_bounding_box(chans["ann"], 0, 12345)

    # What intern checks on its side never reaches the server; the server checks the rest.
    assert "annotation channels only" in http(config, "GET", "reserve/ic/exp/img/3").json()["message"]
    assert http(config, "GET", "reserve/ic/exp/ann/0").status_code == 400
    bad = http(config, "GET", "reserve/ic/exp/ann/many")
    assert bad.status_code == 400 and "reserve/{collection}" in bad.json()["message"]
    bad = http(config, "GET", f"boundingbox/ic/exp/ann/0/{first}/?type=snug")
    assert bad.status_code == 400 and "loose or tight" in bad.json()["message"]
    bad = http(config, "GET", "boundingbox/ic/exp/ann/2/1/")
    assert bad.status_code == 400 and "resolution 2 does not exist" in bad.json()["message"]
    bad = http(config, "GET", "ids/ic/exp/img/0/0:10/0:10/0:1/")
    assert bad.status_code == 400 and "annotation channels only" in bad.json()["message"]
    bad = http(config, "PUT", "cutout/to_black/ic/exp/img/0/0:700/0:10/0:1/")
    assert bad.status_code == 400 and "outside the coordinate frame" in bad.json()["message"]


def test_metadata_on_collections_experiments_and_channels(boss: BossRemote, config: dict[str, str]) -> None:
    chans = make_project(boss)
    coll, exp = CollectionResource("ic"), ExperimentResource("exp", "ic")
    boss.create_metadata(chans["img"], {"stain": "osmium", "note": "two words", "n": 3})
    boss.create_metadata(coll, {"stain": "collection-level"})
    boss.create_metadata(exp, {"microscope": "Zeiss"})
    assert boss.list_metadata(chans["img"]) == ["n", "note", "stain"]
    assert boss.get_metadata(chans["img"], ["note", "n"]) == {"note": "two words", "n": "3"}
    assert boss.get_metadata(coll, ["stain"]) == {"stain": "collection-level"}
    assert boss.list_metadata(exp) == ["microscope"] and boss.list_metadata(chans["ann"]) == []
    boss.update_metadata(chans["img"], {"stain": "uranyl"})
    assert boss.get_metadata(chans["img"], ["stain"]) == {"stain": "uranyl"}
    boss.delete_metadata(chans["img"], ["n"])
    assert boss.list_metadata(chans["img"]) == ["note", "stain"]

    with pytest.raises(HTTPErrorList) as dup:
        boss.create_metadata(chans["img"], {"note": "again"})
    assert "(409)" in str(dup.value.http_errors[0])
    with pytest.raises(HTTPErrorList) as missing:
        boss.get_metadata(chans["img"], ["n"])
    assert "(404)" in str(missing.value.http_errors[0])
    bad = http(config, "POST", "meta/ic/exp/img/?key=x")
    assert bad.status_code == 400 and "value query parameter is required" in bad.json()["message"]
    bad = http(config, "GET", "meta/ic/exp/nope/")
    assert bad.status_code == 404 and "ic/exp/nope does not exist" in bad.json()["message"]

    # a channel's metadata goes with it
    boss.create_metadata(chans["ann"], {"k": "v"})
    boss.delete_project(chans["ann"])
    boss.create_project(ChannelResource("ann", "ic", "exp", "annotation", datatype="uint64"))
    assert boss.list_metadata(chans["ann"]) == []


def test_intern_array_reads_and_writes(config: dict[str, str], boss: BossRemote) -> None:
    make_project(boss)
    arr = array("bossdb://ic/exp/img", boss_config=config)
    assert arr.shape == (40, 400, 600) and arr.dtype == "uint8"
    assert arr.voxel_size == (4, 4, 40) and arr.available_resolutions == [0, 1]
    assert arr.downsample_status == "NOT_DOWNSAMPLED"

    data = np.random.default_rng(1).integers(1, 255, (6, 70, 130), dtype=np.uint8)
    arr[3:9, 100:170, 200:330] = data
    assert np.array_equal(arr[3:9, 100:170, 200:330], data)
    assert np.array_equal(arr[5, 100:170, 200:330], data[2])  # one z slice comes back 2-D
    assert np.array_equal(arr[3:9, 120, 200:330], data[:, 20])
    plane = np.full((50, 60), 7, np.uint8)
    arr[20, 0:50, 0:60] = plane  # a 2-D value writes one z slice
    assert np.array_equal(arr[20:21, 0:50, 0:60], plane)  # intern drops length-1 axes

    # create_new builds the collection, frame, experiment and channel through the resource routes
    made = array("bossdb://fresh/exp/labels", create_new=True, dtype="uint64", extents=(8, 64, 64),
                 voxel_size=(40, 4, 4), boss_config=config)
    assert made.shape == (8, 64, 64) and made.dtype == "uint64"
    labels = np.arange(1, 2 * 64 * 64 + 1, dtype=np.uint64).reshape(2, 64, 64) << np.uint64(33)
    made[2:4, 0:64, 0:64] = labels
    assert np.array_equal(made[2:4, 0:64, 0:64], labels)
    assert boss.get_channel("labels", "fresh", "exp").type == "annotation"
    for used in (arr, made):
        close(used.volume_provider.get_remote())


@pytest.mark.usefixtures("ingest_env")
def test_downsample_through_the_boss_routes(boss: BossRemote, config: dict[str, str]) -> None:
    """intern has no downsample call; the Boss routes serve it, and intern sees the status and
    reads the built level."""
    from lambdas.runner import QueuePoller
    from ndstore.wiring import services

    chans = make_project(boss, times=1)
    data = np.random.default_rng(5).integers(0, 255, (4, 400, 600), dtype=np.uint8)
    boss.create_cutout(chans["img"], 0, [0, 600], [0, 400], [0, 4], data)
    status = http(config, "GET", "downsample/ic/exp/img/")
    assert status.status_code == 200 and status.json()["status"] == "NOT_DOWNSAMPLED"
    assert status.json()["extent"]["1"] == [300, 200, 40]
    started = http(config, "POST", "downsample/ic/exp/img/")
    assert started.status_code == 201, started.text
    assert boss.get_channel("img", "ic", "exp").downsample_status == "IN_PROGRESS"

    runs = services().downsample_runs
    poller = QueuePoller(runs.queues, runs.queue_prefix, refresh_s=0.2)
    deadline = time.monotonic() + 120
    while http(config, "GET", "downsample/ic/exp/img/").json()["status"] == "IN_PROGRESS":
        assert time.monotonic() < deadline, "the build did not finish"
        if not poller.poll_once():
            time.sleep(0.2)
    assert boss.get_channel("img", "ic", "exp").downsample_status == "DOWNSAMPLED"
    level1 = boss.get_cutout(chans["img"], 1, [0, 300], [0, 200], [0, 4])
    sums = data.reshape(4, 200, 2, 300, 2).astype(np.uint32).sum(axis=(2, 4))
    assert np.array_equal(level1, ((sums + 2) // 4).astype(np.uint8))  # the mean, rounded half up
