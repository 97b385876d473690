"""Writes into the NDBlaze buffer, and reads that see them before they are merged.

Write: validate the body against the box (every check its decode makes, so what is acknowledged
can always be applied), then append it, as it arrived, under every supercuboid it touches. No
lock is taken.
Read: under the read locks of the touched supercuboids (the merger takes their write locks),
read the base tier (after writing back dirty cache data, as direct reads do) and snapshot the
pending blobs; then apply the blobs that overlap the box, in sequence order.
Loss: supercuboids marked lost are refused (DataLost) both ways; a buffer Redis found without
the mark of a checked run is checked against its record (or ledger) first. Every write is
recorded in the cache's Redis before it is acknowledged (its supercuboids and seq, with the
buffer's run that took it), and a request on any path that touches a recorded supercuboid first
checks that the buffer is still that run (ndstore/engine/ledger.py, "the record").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy.typing as npt

from blaze.blob import BlobHeader, apply_to, supercuboid_names
from ndstore.core import morton, wire
from ndstore.core.errors import RedisUnverified, StorageError
from ndstore.core.keys import SupercuboidKey
from ndstore.core.observe import NULL, Observer
from ndstore.engine.cache.ports import BufferRecord
from ndstore.engine.direct import CoherentDirect
from ndstore.engine.ledger import LedgerKeeper
from ndstore.engine.volume import Cutout
from ndstore.storage.interfaces import BlazeBuffer, PendingBlob

Array = npt.NDArray[Any]
T = TypeVar("T")
log = logging.getLogger(__name__)


def buffer_ledger(buffer: BlazeBuffer, record: BufferRecord, observer: Observer = NULL) -> LedgerKeeper:
    """The ledger of what the buffer's Redis holds unmerged, next to the base tier; what it lost is
    refused by the cache tier (every path reads the lost supercuboids through it), and it is
    checked against the record of NDBlaze writes kept in the cache (``record``: `CacheTier.loss`)."""
    return record.ledger_for("blaze", buffer, buffer.drop_all_but, observer)


class BlazeTier:
    def __init__(self, buffer: BlazeBuffer, direct: CoherentDirect, ledger: LedgerKeeper):
        """Reads the base tier through ``direct``, and records its writes in the cache tier's
        record (`CacheTier.loss`, its BufferRecord port), which it also makes check the buffer's
        run for the supercuboids it has recorded writes to (`watch_buffer`): every path reads
        them through it."""
        self.buffer = buffer
        self.direct = direct
        self.ledger = ledger
        self.record: BufferRecord = direct.tier.loss
        self.record.watch_buffer(self.check_run)

    def check_run(self, run: str) -> bool:
        """Make sure the buffer is still ``run`` (the one the record of writes describes): otherwise
        it is checked against the record now, what it lost marked lost and the record brought to
        it (True). One GET when it is. "": there is no record (the cache's Redis lost it): it is
        rebuilt now if the buffer answers; if not, the request goes on as it would without NDBlaze
        (nothing names its supercuboids), and the next write, merger round or request rebuilds it."""
        if not run:
            try:
                self.ledger.verify()
            except StorageError as exc:
                log.warning("the record of NDBlaze writes is missing and the buffer did not answer to rebuild it: "
                            "%s", exc)
                return False
            return True
        if self.buffer.mark() == run:
            return False
        self.ledger.verify()
        return True

    def _checked(self, call: Callable[[], T]) -> T:
        """``call()``, once more after checking the buffer's Redis if it had not been."""
        try:
            return call()
        except RedisUnverified:
            self.ledger.verify()
            return call()

    def write_body(self, cutout: Cutout, body: bytes, media_type: str, has_time: bool) -> int:
        """Buffer a request body for the cutout's box and record it; returns its sequence number."""
        header = BlobHeader.for_cutout(cutout, media_type, has_time)
        header.validate(body)
        names = supercuboid_names(header)

        def append() -> tuple[int, str]:  # guarded again after a check: it may have marked them lost
            self.record.guard(names)
            return self.buffer.append_in_run(header.to_json(), body, names)

        seq, run = self._checked(append)
        self._record(run, dict.fromkeys(names, seq))
        return seq

    def _record(self, run: str, seqs: dict[str, int]) -> None:
        """Record a write taken in the buffer's ``run`` before it is acknowledged. A record of
        another run, or none: the buffer is checked (which rebuilds a missing record from what it
        holds, this write included), then tried once more; still another run means the buffer
        was checked since it took the write, which it may have lost: not acknowledged."""
        if self.record.record_buffered(run, seqs):
            return
        self.ledger.verify()
        if not self.record.record_buffered(run, seqs):
            raise RedisUnverified("the NDBlaze buffer was checked against its record while this write was taken "
                                  "(it restarted); the write may not have been stored: retry it")

    def write(self, cutout: Cutout, data: Array) -> None:
        """An array write (the engine's Tier interface): buffered as an application/blosc body."""
        fmt = wire.FORMATS["application/blosc"]
        self.write_body(cutout, fmt.encode(data.reshape(cutout.shape)), fmt.media_type, has_time=True)

    def has_pending(self, names: Sequence[str]) -> bool:
        """Whether any NDBlaze write to these supercuboids is still pending (one snapshot)."""
        return self._checked(lambda: any(self.buffer.pending_seqs(names).values()))

    def pending_names(self, prefix: str) -> list[str]:
        """The supercuboids with pending writes whose names start with ``prefix``."""
        return self._checked(lambda: self.buffer.pending_names(prefix))

    def discard(self, prefix: str) -> int:
        """Drop every pending blob of the supercuboids whose names start with ``prefix`` (a
        channel being deleted), each under its write lock so no merge is half way through it.
        Returns how many (supercuboid, blob) entries were dropped."""
        dropped = 0
        for name in self.buffer.pending_names(prefix):
            with self.direct.tier.exclusive([name]):
                seqs = self.buffer.pending_seqs([name])[name]
                if seqs:
                    self.record.forget_buffered({name: seqs[-1]})
                dropped += self.buffer.release(name, seqs)
        return dropped

    def read(self, cutout: Cutout) -> Array:
        """Base data plus, in each supercuboid, the blobs still pending *in that supercuboid*, in
        seq order. A blob spanning two supercuboids may be merged into one and pending in the
        other (a merge round in progress); applying it to both would overwrite newer writes
        already merged into the first."""
        out, (blobs, pending_in) = self._checked(lambda: self.direct.tier.read_base(cutout, self._pending))
        grid = cutout.channel.grid(cutout.resolution)
        for blob in blobs:
            header = BlobHeader.from_json(blob.header)
            data = header.decode_stored(blob.seq, blob.body)
            for name in pending_in[blob.seq]:
                key = SupercuboidKey.from_name(name)
                clip = grid.supercuboid_box(morton.decode_one(key.morton))
                apply_to(out, cutout.box, cutout.times, header, data, clip, key.volume.time)
        return out

    def _pending(self, names: Sequence[str]) -> tuple[list[PendingBlob], dict[int, list[str]]]:
        by_name = self.buffer.pending_seqs(names)
        pending_in: dict[int, list[str]] = {}
        for name, seqs in by_name.items():
            for seq in seqs:
                pending_in.setdefault(seq, []).append(name)
        return self.buffer.blobs(sorted(pending_in)), pending_in
