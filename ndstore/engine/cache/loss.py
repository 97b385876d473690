"""Loss in the cache tier: the cache Redis's checked mark, its ledger, the supercuboids refused
as lost, and the record of NDBlaze writes kept in the cache's store (ndstore/engine/ledger.py).

Reads and writes first check that the cache carries its checked mark and that none of their
supercuboids is marked lost (`guard`, one round trip); a cache found without its mark is checked
against its ledger by whoever finds it (`verify`). A cached cuboid that fails its checksum is
dropped and paged in again when it was clean, marked lost when it was dirty (`repair`). A request
touching a supercuboid with an NDBlaze write recorded has the NDBlaze buffer's run checked too
(`watch_buffer`), so no path answers for it from a buffer that came back without it.

Callers get narrow ports of this part (ndstore/engine/cache/ports.py): operators `LossAdmin`,
NDBlaze `BufferRecord`; the request path, the write-back and the daemons use the rest.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from functools import partial

from ndstore.core.errors import DamagedInCache, DataLost
from ndstore.core.observe import NULL, Observer
from ndstore.engine.ledger import NAMES_IN_MESSAGES, LedgerBook, LedgerKeeper, Verdict
from ndstore.storage.interfaces import CuboidCache, Holdings, ObjectStore, RWLocks

log = logging.getLogger(__name__)


class Loss:
    def __init__(self, cache: CuboidCache, locks: RWLocks, objects: ObjectStore,
                 clock: Callable[[], float] = time.time, observer: Observer = NULL):
        """``objects``: the base tier's object store, where the ledgers are kept."""
        self._cache = cache
        self._locks = locks
        self._objects = objects
        self._observer = observer
        self._buffer_check: Callable[[str], bool] | None = None  # see `watch_buffer`
        self.ledger = LedgerKeeper("cache", cache, LedgerBook(objects, "cache"), self.ledger_lock("cache"),
                                   self._drop_all_but, cache.mark_lost, cache.lost, clock, observer)

    # -- the request path's check ----------------------------------------------------------------
    def guard(self, names: Sequence[str]) -> str:
        """Raise DataLost when one of ``names`` is marked lost. A Redis without its checked mark
        (it restarted empty, or is another one) is checked against its ledger first. Returns the
        mark (the run), "" when there still is none: what the caller's page-ins are stored under.
        When one of ``names`` has an NDBlaze write recorded, the buffer is checked to be the run
        the record describes first (`watch_buffer`: what it lost is then marked lost)."""
        run, lost, buffered = self._cache.loss_marks(names)
        if run is None:
            self.verify()
            run, lost, buffered = self._cache.loss_marks(names)
        if buffered is not None and self._buffer_check is not None and self._buffer_check(buffered):
            run, lost, _ = self._cache.loss_marks(names)
        if lost:
            raise DataLost(lost_message(lost), sorted(lost))
        return run or ""

    def run(self) -> str:
        """The cache's checked mark now ("" when there is none), for copies stored outside a request."""
        return self._cache.loss_marks([])[0] or ""

    def repair(self, damage: DamagedInCache) -> None:
        """A cached copy failed its checksum: a clean one is dropped (the base tier has it), a
        dirty one is lost."""
        name = damage.name
        with self._locks.write([name]):
            if self._cache.is_dirty([name])[0]:
                self.found_lost({name: f"{damage} (found {time.strftime('%Y-%m-%d %H:%M:%S')})"})
            self._cache.evict(name)
        self._observer.count("cache_repairs_total", outcome="lost" if self._cache.lost().get(name) else "paged again")
        self.guard([name])

    def found_lost(self, reasons: dict[str, str]) -> None:
        """Cached copies found gone or damaged: refused from now on, logged and counted (the
        ledger records them at its next `keep`)."""
        self._cache.mark_lost(reasons)
        log.error("lost: %s", "; ".join(f"{n}: {why}" for n, why in reasons.items()))
        self._observer.count("losses_total", len(reasons), redis="cache")

    # -- the ledger (the daemons, a clean stop, the service's start) -----------------------------
    def verify(self) -> Verdict | None:
        """Check the cache Redis against its ledger (ndstore/engine/ledger.py); None: nothing lost."""
        return self.ledger.verify()

    def check_ledger(self) -> None:
        """A daemon's first step each round: the cache checked if it is not the run last seen."""
        self.ledger.check()

    def keep_ledger(self, final: bool = False) -> None:
        """The flusher's round (and its stop, `final`): the ledger up to date."""
        self.ledger.keep(final)

    def ledger_lock(self, what: str) -> Callable[[], AbstractContextManager[None]]:
        """The lock a ledger is kept under (no supercuboid name has a letter in it)."""
        return partial(self._locks.write, [f"ledger&{what}"])

    def _drop_all_but(self, keep: frozenset[str]) -> None:
        """The cache Redis lost writes: what it holds that is not intact goes, and so does the
        record of NDBlaze writes (it may be as short): rebuilt from the buffer when next checked."""
        self._cache.drop_buffered()
        for name in self._cache.names_with_prefix(""):
            if name not in keep:
                with self._locks.write([name]):
                    self._cache.evict(name)

    # -- operators: what is refused, and accepting it (`ndstore recover`) ------------------------
    def lost(self) -> dict[str, str]:
        """Every supercuboid refused as lost, with why."""
        return self._cache.lost()

    def accept_loss(self, names: Sequence[str]) -> None:
        """Serve these supercuboids again, as the base tier (and the cache) now hold them."""
        if not names:
            return
        self._cache.forget_lost(names)
        self.ledger.record_refused()

    def mark_lost(self, reasons: dict[str, str]) -> None:
        """Refuse these supercuboids until an operator accepts their loss (the NDBlaze buffer
        lost writes to them); recorded in the ledger at once."""
        self._cache.mark_lost(reasons)
        self.ledger.record_refused()

    # -- the record of NDBlaze writes (ndstore/engine/ledger.py, "the record") -------------------
    def watch_buffer(self, check: Callable[[str], bool]) -> None:
        """``check(run)``: make sure the NDBlaze buffer is the run the record describes ("": there
        is no record), checking it against its record otherwise (then True: what it lost is
        marked lost now); `guard` calls it for requests that touch a supercuboid with an NDBlaze
        write recorded."""
        self._buffer_check = check

    def record_buffered(self, run: str, seqs: Mapping[str, int]) -> bool:
        """Record NDBlaze writes (supercuboid -> seq) before they are acknowledged; False when the
        record does not describe ``run``, the buffer's run that took them (nothing recorded)."""
        return self._cache.record_buffered(run, seqs)

    def forget_buffered(self, seqs: Mapping[str, int]) -> None:
        """Merged into the base tier up to these seqs (before the buffer releases them)."""
        self._cache.forget_buffered(seqs)

    def buffered_record(self) -> tuple[str | None, dict[str, int]]:
        return self._cache.buffered()

    def sync_buffered(self, run: str, seq: int, held: Mapping[str, int]) -> None:
        self._cache.sync_buffered(run, seq, held)

    def ledger_for(self, what: str, holdings: Holdings, drop_all_but: Callable[[frozenset[str]], object],
                   observer: Observer = NULL) -> LedgerKeeper:
        """The ledger of another Redis that holds acknowledged writes (the NDBlaze buffer's), kept
        next to the cache's: under a lock of the same kind, what it lost refused here (every path
        reads those supercuboids through the cache tier), and checked against the record kept here."""
        return LedgerKeeper(what, holdings, LedgerBook(self._objects, what), self.ledger_lock(what), drop_all_but,
                            self.mark_lost, dict, observer=observer, record=self)


def lost_message(lost: dict[str, str]) -> str:
    names = sorted(lost)
    shown = "; ".join(f"{n}: {lost[n]}" for n in names[:NAMES_IN_MESSAGES])
    more = f" and {len(names) - NAMES_IN_MESSAGES} more" if len(names) > NAMES_IN_MESSAGES else ""
    return (f"{len(names)} supercuboids of this box lost writes the service had acknowledged ({shown}{more}). "
            "The service refuses them rather than answer with older data; an operator lists the loss with "
            "`ndstore recover` and accepts it with `ndstore recover --accept-loss`")
