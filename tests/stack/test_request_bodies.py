"""Request bodies through the real front and gunicorn (one worker thread, so every request rides
the same kept-alive upstream connections): writes of every media type and of awkward sizes, one
after another with a refused body between them, each read back voxel for voxel. A connection
must come out of each request -- answered or refused -- exactly at the next one."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import requests

from ndstore.core import wire
from ndstore.ops.localstack import LocalStack, free_port
from tests.conftest import own_stack_env
from tests.security.conftest import admin_session, public_dataset

FRAME = (700, 600, 70)
BOXES = [((0, 64), (0, 64), (0, 8)), ((0, 512), (0, 512), (0, 64)), ((3, 103), (5, 42), (7, 10)),
         ((600, 700), (500, 600), (69, 70))]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with LocalStack(tmp_path_factory.mktemp("bodies"), port=free_port(), workers=1, threads=1,
                    with_merger=False, with_runner=False, extra_env=own_stack_env({"NDSTORE_DEMO": "0"})) as local:
        yield local


@pytest.fixture(scope="module")
def session(stack: LocalStack) -> requests.Session:
    s = admin_session(stack.data_dir)
    public_dataset(s, stack.url, "bodies", FRAME, {"c": {"datatype": "uint16"}})
    return s


def box_url(stack: LocalStack, box: tuple[tuple[int, int], ...]) -> str:
    (x0, x1), (y0, y1), (z0, z1) = box
    return f"{stack.url}/v1/cutout/bodies/e/c/0/{x0}:{x1}/{y0}:{y1}/{z0}:{z1}/"


def test_writes_of_every_media_type_and_size_read_back_exactly_over_one_connection(
        stack: LocalStack, session: requests.Session) -> None:
    rng = np.random.default_rng(7)
    for turn, media_type in enumerate(wire.FORMATS):
        for box in BOXES:
            (x0, x1), (y0, y1), (z0, z1) = box
            data = rng.integers(0, 4000 + turn, (z1 - z0, y1 - y0, x1 - x0), dtype=np.uint16)
            body = wire.format_for(media_type).encode(data)
            put = session.post(box_url(stack, box), data=body, headers={"Content-Type": media_type}, timeout=60)
            assert put.status_code == 201, (media_type, box, put.text)
            refused = session.post(box_url(stack, box), data=body[:-7], headers={"Content-Type": media_type},
                                   timeout=60)
            assert refused.status_code == 400 and "body" in refused.json()["message"], refused.text
            got = session.get(box_url(stack, box), headers={"Accept": "application/octet-stream"}, timeout=60)
            assert got.status_code == 200, got.text
            assert np.array_equal(np.frombuffer(got.content, np.uint16).reshape(data.shape), data), (media_type, box)
