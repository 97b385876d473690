"""The data routes' short path (ndstore/api/data_routes.py: cutouts, slice images, the standard
views' files) answers exactly what DRF's dispatch answers: the same requests -- a user's and an
attacker's -- are sent both ways and their answers compared byte for byte (status, every header,
body). Also: the short resolver routes no path that the whole URLconf gives to another view, and
the short path is the one taken."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import blosc
import numpy as np
import pytest
from django.urls import get_resolver
from django.urls.exceptions import Resolver404
from rest_framework.test import APIClient

from ndstore.api import data_routes
from tests.api.conftest import Dataset, client_for

Send = Callable[[APIClient, Dataset], Any]
BLOSC = {"HTTP_ACCEPT": "application/blosc"}
BOX = ((0, 64), (0, 32), (0, 4))  # x, y, z


def box_body(value: int = 7) -> bytes:
    return blosc.compress(np.full((4, 32, 64), value, np.uint8).tobytes(), typesize=1)


def cut(d: Dataset, tier: str = "", **kw: Any) -> str:
    path = d.cutout(kw.pop("channel", "img8"), kw.pop("res", 0), *kw.pop("box", BOX), **kw)
    return path.replace("/v1/cutout/", f"/v1/{tier}cutout/") if tier else path


def image(d: Dataset, tail: str) -> str:
    return f"/v1/image/{d.collection}/{d.experiment}/img8/{tail}"


def view(d: Dataset, kind: str, tail: str, channel: str = "img8") -> str:
    return f"/{kind}/{d.collection}/{d.experiment}/{channel}/{tail}"


READS: dict[str, Send] = {
    "blosc": lambda c, d: c.get(cut(d), **BLOSC),
    "raw": lambda c, d: c.get(cut(d), HTTP_ACCEPT="application/octet-stream"),
    "npygz by ?format": lambda c, d: c.get(cut(d) + "?format=npygz"),
    "blosc-python": lambda c, d: c.get(cut(d), HTTP_ACCEPT="application/blosc-python"),
    "anything accepted": lambda c, d: c.get(cut(d), HTTP_ACCEPT="*/*"),
    "no Accept": lambda c, d: c.get(cut(d)),
    "HEAD": lambda c, d: c.head(cut(d), **BLOSC),
    "Range": lambda c, d: c.get(cut(d), HTTP_RANGE="bytes=3-40", **BLOSC),
    "If-None-Match": lambda c, d: c.get(cut(d), HTTP_IF_NONE_MATCH=c.get(cut(d), **BLOSC)["ETag"], **BLOSC),
    "time range": lambda c, d: c.get(cut(d, t=(0, 1)), **BLOSC),
    "no_cache": lambda c, d: c.get(cut(d) + "?access-mode=no-cache", **BLOSC),
    "raw mode": lambda c, d: c.get(cut(d) + "?access-mode=raw", **BLOSC),
    "direct": lambda c, d: c.get(cut(d, "direct/"), **BLOSC),
    "blaze": lambda c, d: c.get(cut(d, "blaze/"), **BLOSC),
    "labels filtered": lambda c, d: c.get(cut(d, channel="ann64") + "?filter=1,2", **BLOSC),
    "PNG tile": lambda c, d: c.get(image(d, "xy/0/0:64/0:32/1/")),
    "JPEG tile with a window": lambda c, d: c.get(image(d, "xy/0/0:64/0:32/1/?format=jpeg&window=0,9&quality=50")),
    "xz and yz planes": lambda c, d: (c.get(image(d, "xz/0/0:64/3/0:4/")), c.get(image(d, "yz/0/3/0:32/0:4/"))),
    "precomputed info": lambda c, d: c.get(view(d, "precomputed", "info")),
    "precomputed chunk": lambda c, d: c.get(view(d, "precomputed", "0/0-512_0-512_0-16")),
    "precomputed chunk, HEAD": lambda c, d: c.head(view(d, "precomputed", "0/0-512_0-512_0-16")),
    "precomputed labels, raw": lambda c, d: c.get(view(d, "precomputed", "raw/0/0-512_0-512_0-16", "ann64")),
    "zarr group and array": lambda c, d: (c.get(view(d, "zarr", "zarr.json")), c.get(view(d, "zarr", "0/zarr.json"))),
    "zarr chunk": lambda c, d: c.get(view(d, "zarr", "0/c/0/0/0/0")),
    "sharded info": lambda c, d: c.get(view(d, "precomputed-sharded", "info")),
    "a shard's index": lambda c, d: c.get(view(d, "precomputed-sharded", "0/0.shard"), HTTP_RANGE="bytes=0-15"),
}
REFUSED_READS: dict[str, Send] = {
    "Range past the end": lambda c, d: c.get(cut(d), HTTP_RANGE="bytes=999999-", **BLOSC),
    "unknown ?format": lambda c, d: c.get(cut(d) + "?format=pickle"),
    "Accept nothing offered": lambda c, d: c.get(cut(d), HTTP_ACCEPT="application/json"),
    "bad access-mode": lambda c, d: c.get(cut(d) + "?access-mode=everything", **BLOSC),
    "outside the frame": lambda c, d: c.get(cut(d, box=((0, 64), (0, 32), (99, 101))), **BLOSC),
    "empty range": lambda c, d: c.get(cut(d, box=((5, 5), (0, 32), (0, 4))), **BLOSC),
    "no such level": lambda c, d: c.get(cut(d, res=9), **BLOSC),
    "no such channel": lambda c, d: c.get(cut(d, channel="nope"), **BLOSC),
    "filter on an image channel": lambda c, d: c.get(cut(d) + "?filter=1", **BLOSC),
    "bad filter": lambda c, d: c.get(cut(d, channel="ann64") + "?filter=1,x", **BLOSC),
    "past the time samples": lambda c, d: c.get(cut(d, t=(0, 5)), **BLOSC),
    "bad quality": lambda c, d: c.get(image(d, "xy/0/0:64/0:32/1/?format=jpeg&quality=0")),
    "bad window": lambda c, d: c.get(image(d, "xy/0/0:64/0:32/1/?window=9")),
    "a zarr chunk of zeros": lambda c, d: c.get(view(d, "zarr", "0/c/0/5/1/1")),
    "a zarr level not built": lambda c, d: c.get(view(d, "zarr", "2/zarr.json")),
    "a precomputed chunk outside the level": lambda c, d: c.get(view(d, "precomputed", "0/0-512_0-512_96-112")),
    "an unknown encoding": lambda c, d: c.get(view(d, "precomputed", "png/info")),
    "no such shard": lambda c, d: c.get(view(d, "precomputed-sharded", "0/ff.shard")),
    "a standard view of a missing channel": lambda c, d: c.get(view(d, "zarr", "zarr.json", "nope")),
}
WRITES: dict[str, Send] = {
    "cache": lambda c, d: c.post(cut(d), box_body(), content_type="application/blosc"),
    "direct": lambda c, d: c.post(cut(d, "direct/"), box_body(), content_type="application/blosc"),
    "blaze": lambda c, d: c.post(cut(d, "blaze/"), box_body(), content_type="application/blosc"),
    "raw bytes": lambda c, d: c.post(cut(d), bytes(4 * 32 * 64), content_type="application/octet-stream"),
}
REFUSED_WRITES: dict[str, Send] = {
    "a type no parser speaks": lambda c, d: c.post(cut(d), box_body(), content_type="application/json"),
    "a wildcard type": lambda c, d: c.post(cut(d), box_body(), content_type="application/*"),
    "no Content-Type": lambda c, d: c.generic("POST", cut(d), box_body(), content_type=""),
    "empty body": lambda c, d: c.post(cut(d), b"", content_type="application/blosc"),
    "the wrong size": lambda c, d: c.post(cut(d), box_body()[:-3], content_type="application/blosc"),
    "not blosc": lambda c, d: c.post(cut(d), b"\x00" * 64, content_type="application/blosc"),
    "blaze, not blosc": lambda c, d: c.post(cut(d, "blaze/"), b"\x00" * 64, content_type="application/blosc"),
    "blaze, empty": lambda c, d: c.post(cut(d, "blaze/"), b"", content_type="application/blosc"),
    "a body past the limit": lambda c, d: c.generic("POST", cut(d), b"x", content_type="application/blosc",
                                                     CONTENT_LENGTH=str(1 << 40)),
    "outside the frame": lambda c, d: c.post(cut(d, box=((0, 64), (0, 32), (99, 101))), box_body(),
                                             content_type="application/blosc"),
    "to a file of a standard view": lambda c, d: c.post(view(d, "precomputed", "info"), b"{}",
                                                        content_type="application/json"),
}


@pytest.fixture
def both_ways(settings: Any) -> Callable[[Callable[[], Any]], tuple[Any, Any]]:
    """Call ``send`` through the short path, then through DRF's dispatch."""
    def run(send: Callable[[], Any]) -> tuple[Any, Any]:
        settings.NDSTORE_LEAN_DATA_ROUTES = True
        short = send()
        settings.NDSTORE_LEAN_DATA_ROUTES = False
        framework = send()
        settings.NDSTORE_LEAN_DATA_ROUTES = True
        return short, framework
    return run


def answer(response: Any) -> tuple[int, dict[str, str], bytes]:
    responses = response if isinstance(response, tuple) else (response,)
    return tuple((r.status_code, dict(r.headers), r.content) for r in responses)  # type: ignore[return-value]


def written(dataset: Dataset, admin: APIClient) -> None:
    admin.post(cut(dataset), box_body(3), content_type="application/blosc")
    labels = np.zeros((4, 32, 64), np.uint64)
    labels[0, :4, :4] = 2
    admin.post(cut(dataset, channel="ann64"), blosc.compress(labels.tobytes(), typesize=8),
               content_type="application/blosc")


@pytest.mark.django_db
@pytest.mark.parametrize("case", sorted({**READS, **REFUSED_READS}))
def test_a_read_is_answered_the_same_both_ways(case: str, dataset: Dataset, admin: APIClient,
                                               both_ways: Any) -> None:
    written(dataset, admin)
    send = {**READS, **REFUSED_READS}[case]
    short, framework = both_ways(lambda: send(admin, dataset))
    assert answer(short) == answer(framework)
    statuses = [r.status_code for r in (short if isinstance(short, tuple) else (short,))]
    assert all(s < 400 for s in statuses) if case in READS else all(s >= 400 for s in statuses)


@pytest.mark.django_db
@pytest.mark.parametrize("case", sorted({**WRITES, **REFUSED_WRITES}))
def test_a_write_is_answered_the_same_both_ways(case: str, dataset: Dataset, admin: APIClient,
                                                both_ways: Any) -> None:
    short, framework = both_ways(lambda: {**WRITES, **REFUSED_WRITES}[case](admin, dataset))
    if case == "blaze":  # each write takes the next place in NDBlaze's order
        assert int(framework["X-NDBlaze-Sequence"]) == int(short["X-NDBlaze-Sequence"]) + 1
        framework.headers["X-NDBlaze-Sequence"] = short["X-NDBlaze-Sequence"]
    assert answer(short) == answer(framework)
    assert (short.status_code == 201) == (case in WRITES)


@pytest.mark.django_db
@pytest.mark.parametrize("who", ["anonymous", "a bad token", "no grant", "read only"])
def test_a_caller_without_the_grant_is_refused_the_same_both_ways(who: str, dataset: Dataset, grant: Any,
                                                                  both_ways: Any) -> None:
    client = {"anonymous": lambda: client_for(None), "no grant": lambda: grant("nobody", dataset.collection, None),
              "read only": lambda: grant("reader", dataset.collection, "read"),
              "a bad token": lambda: client_for(None)}[who]()
    if who == "a bad token":
        client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    for send in (READS["blosc"], READS["PNG tile"], WRITES["cache"], WRITES["blaze"]):
        short, framework = both_ways(lambda s=send: s(client, dataset))
        assert answer(short) == answer(framework)
        if who != "read only" or send in (WRITES["cache"], WRITES["blaze"]):
            assert short.status_code in (401, 403), short.content
            assert (short.status_code == 401) == ("WWW-Authenticate" in short.headers)


@pytest.mark.django_db
def test_the_short_path_serves_the_data_routes(dataset: Dataset, admin: APIClient,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[str] = []
    real = data_routes._dispatch
    monkeypatch.setattr(data_routes, "_dispatch", lambda view, request, kw: served.append(request.path)
                        or real(view, request, kw))
    admin.get(cut(dataset), **BLOSC)
    admin.post(cut(dataset, "blaze/"), box_body(), content_type="application/blosc")
    admin.get(image(dataset, "xy/0/0:64/0:32/1/"))
    admin.options(cut(dataset))  # other methods: DRF's dispatch
    admin.get(f"/v1/ids/{dataset.collection}/{dataset.experiment}/ann64/0/0:8/0:8/0:1/")  # other routes too
    admin.get("/latest/" + cut(dataset)[len("/v1/"):], **BLOSC)  # the Boss's prefix is rewritten first
    admin.get(view(dataset, "zarr", "zarr.json"))
    admin.post(view(dataset, "zarr", "zarr.json"), b"{}", content_type="application/json")  # no POST: DRF's 405
    assert served == [cut(dataset), cut(dataset, "blaze/"), image(dataset, "xy/0/0:64/0:32/1/"), cut(dataset),
                      view(dataset, "zarr", "zarr.json")]


@pytest.mark.parametrize("path", [
    "/v1/cutout/c/e/ch/0/0:1/0:1/0:1/", "/v1/cutout/c/e/ch/0/0:1/0:1/0:1/0:2/",
    "/v1/blaze/cutout/c/e/ch/0/0:1/0:1/0:1/",
    "/v1/direct/cutout/c/e/0/0/0:1/0:1/0:1/", "/v1/cutout/to_black/c/e/ch/0/0:1/0:1/0:1/",
    "/v1/cutout/to_black/c/e/0/0/0:1/0:1/0:1/", "/v1/cutout/to_black/0/0/0/0/0:1/0:1/0:1/0:1/",
    "/v1/cutout/to_black/c/e/ch/0/0:1/0:1/0:1/0:1/", "/v1/cutout/c/e/ch/x/0:1/0:1/0:1/", "/v1/cutout/c/e/ch/0/0:1/",
    "/v1/image/c/e/ch/xy/0/0:1/0:1/0/", "/v1/image/c/e/ch/xz/0/0:1/0/0:1/3/", "/v1/image/c/e/ch/yz/0/0/0:1/0:1/",
    "/v1/image/c/e/ch/zz/0/0:1/0:1/0/", "/v1/ids/c/e/ch/0/0:1/0:1/0:1/", "/v1/cutout/c/e/ch/0/0:1/0:1/0:1",
    "/precomputed/c/e/ch/info", "/precomputed/c/e/ch/raw/0/0-1_0-1_0-1", "/precomputed/c/e/ch/provenance",
    "/precomputed-sharded/c/e/ch/0/0.shard", "/zarr/c/e/ch/0/c/0/0/0/0", "/zarr/c/e/ch/.zgroup",
])
def test_the_short_resolver_gives_no_path_to_another_view(path: str) -> None:
    try:
        short = data_routes.short_resolver().resolve(path)
    except Resolver404:
        return  # the whole URLconf routes it, as before
    whole = get_resolver().resolve(path)
    assert short.func.view_class is whole.func.view_class  # type: ignore[attr-defined]
    assert short.kwargs == whole.kwargs
    assert hasattr(short.func.view_class, "read")  # type: ignore[attr-defined]
