"""Writes into the NDBlaze buffer, and reads that see them before they are merged.

Write: check the body's framing against the box (no decompression), then append it, as it
arrived, under every supercuboid it touches. No lock is taken.
Read: under the read locks of the touched supercuboids (the merger takes their write locks),
read the base tier (after writing back dirty cache data, as direct reads do) and snapshot the
pending blobs; then apply the blobs that overlap the box, in sequence order.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy.typing as npt

from blaze.blob import BlobHeader, apply_to, supercuboid_names
from blaze.buffer import PendingBlob, RedisBlazeBuffer
from ndstore.core import wire
from ndstore.core.errors import InvalidBody
from ndstore.engine.direct import CoherentDirect
from ndstore.engine.volume import Cutout

Array = npt.NDArray[Any]
log = logging.getLogger(__name__)


class BlazeTier:
    def __init__(self, buffer: RedisBlazeBuffer, direct: CoherentDirect):
        self.buffer = buffer
        self.direct = direct

    def write_body(self, cutout: Cutout, body: bytes, media_type: str, has_time: bool) -> int:
        """Buffer a request body for the cutout's box; returns its sequence number."""
        header = BlobHeader.for_cutout(cutout, media_type, has_time)
        header.check_framing(body)
        return self.buffer.append(header.to_json(), body, supercuboid_names(header))

    def write(self, cutout: Cutout, data: Array) -> None:
        """An array write (the engine's Tier interface): buffered as an application/blosc body."""
        fmt = wire.FORMATS["application/blosc"]
        self.write_body(cutout, fmt.encode(data.reshape(cutout.shape)), fmt.media_type, has_time=True)

    def read(self, cutout: Cutout) -> Array:
        out, blobs = self.direct.read_with(cutout, self._pending)
        for blob in blobs:
            header = BlobHeader.from_json(blob.header)
            try:
                data = header.decode(blob.body)
            except InvalidBody as exc:
                log.warning("skipping undecodable NDBlaze blob %d: %s", blob.seq, exc)
                continue
            apply_to(out, cutout.box, cutout.times, header, data)
        return out

    def _pending(self, names: Sequence[str]) -> list[PendingBlob]:
        by_name = self.buffer.pending_seqs(names)
        seqs = set().union(*by_name.values()) - self.buffer.bad_seqs() if by_name else set()
        return self.buffer.blobs(sorted(seqs))
