"""The project's Redis client (ndstore.storage.redis_client) against a real redis-server: large
values go out and come back whole, and the socket is told to acknowledge at once (TCP_QUICKACK)
before every read, so a multi-MiB reply does not wait on the receiver's delayed ACKs
(docs/design/serving.md, "Redis commands and replies"), in reads of up to 256 KiB."""

from __future__ import annotations

import socket
from typing import Any

import numpy as np
import pytest

from ndstore.storage import redis_client

pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="TCP_QUICKACK is Linux's")


def test_every_read_of_a_large_reply_asks_for_quick_acks(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    client = redis_client.connect(redis_url)
    blobs = {f"t-quickack-{i}": np.random.default_rng(i).bytes(256 << 10) for i in range(64)}  # 16 MiB
    client.mset(blobs)
    reads: list[int] = []
    quick: list[int] = []
    real_setsockopt, real_recv_into = socket.socket.setsockopt, socket.socket.recv_into

    def setsockopt(sock: socket.socket, level: int, option: int, *value: Any) -> None:
        if level == socket.IPPROTO_TCP and option == socket.TCP_QUICKACK:
            quick.append(len(reads))
        real_setsockopt(sock, level, option, *value)

    def recv_into(sock: socket.socket, buffer: Any, *args: Any) -> int:
        reads.append(len(buffer))
        return real_recv_into(sock, buffer, *args)

    monkeypatch.setattr(socket.socket, "setsockopt", setsockopt)
    monkeypatch.setattr(socket.socket, "recv_into", recv_into)
    got = client.mget(list(blobs))

    assert got == list(blobs.values())
    assert len(reads) > 64 and quick == list(range(len(reads)))  # set before each read, none skipped
    assert set(reads) == {redis_client.READ_SIZE}  # up to 256 KiB a read: ~87 reads for 16 MiB, not ~455
    client.delete(*blobs)
