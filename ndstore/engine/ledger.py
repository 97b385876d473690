"""What each Redis holds that no other store holds yet, recorded where losing that Redis cannot
reach it: a ledger object next to the base tier, mirrored by the daemon that drains the Redis.

The cache Redis holds acknowledged writes until the flusher writes them back; the NDBlaze Redis
holds them until the merger merges them. Either may come back from a restart empty (its AOF
deleted) or short (its AOF truncated, an older copy restored): served as it is, every read of
what it lost would answer older data with a 200. So each Redis numbers the writes it takes
(`seq`, one counter) and carries a mark of its run (`epoch`, set once its holdings were checked),
and keeps, for every supercuboid it holds unflushed, the seq of its newest write. The daemon
copies that account into the ledger every round it changed, and once more when it stops (then
`final`: nothing can have happened after it). At start, and whenever the mark or the counter
disagree with the ledger, `assess` says what was lost:

- mark gone (or another one): the Redis came back empty or is another Redis. Every supercuboid the
  ledger lists unflushed lost its newest writes.
- mark there but the counter behind the ledger's: the Redis came back short, an older copy of
  itself. A supercuboid it holds with the very seq the ledger lists is intact; every other one
  the ledger lists is lost; and everything else it holds is older than what the base tier or a
  later write has, so it is dropped, not served or written back.

Lost supercuboids are refused (DataLost, 503 naming them) until an operator accepts the loss.
A ledger that is not final cannot name writes made after its last copy (at most one round of
the daemon before the loss): the report says so, with the time, and never says that nothing
was lost.

The record (the NDBlaze buffer's): a ledger copied by the merger names nothing written while no
merger ran. So each NDBlaze write is also recorded, before it is acknowledged, in the cache's
Redis (`Record`: supercuboid -> seq of its newest write, and the buffer's run it describes);
the merger drops what it merged. The record is checked in place of the ledger whenever it
exists: it lists every acknowledged write, so a buffer that came back empty or is another
Redis is found with every supercuboid it may have held named, with no window. A write whose run
is not the record's is not acknowledged (the record is rebuilt from the buffer, or the buffer
was checked since it was taken: 503, retry). Without a record (the cache's Redis lost it too)
the ledger decides, as above.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from ndstore.core.observe import NULL, Observer
from ndstore.storage.interfaces import Held, Holdings, ObjectStore

log = logging.getLogger(__name__)

# Base-tier object keys of the ledgers. No supercuboid object key looks like these (keys.py).
LEDGER_KEYS = {"cache": "_ndstore-ledger-cache", "blaze": "_ndstore-ledger-blaze"}
NAMES_IN_MESSAGES = 5


def new_epoch() -> str:
    return secrets.token_hex(8)


@dataclass
class Ledger:
    epoch: str
    seq: int
    unflushed: dict[str, int]
    at: float  # when this copy was taken (s since the epoch of time)
    final: bool = False  # taken by a daemon stopping after everything before it stopped
    lost: dict[str, str] = field(default_factory=dict)  # name -> why, until an operator accepts

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Ledger:
        doc: dict[str, Any] = json.loads(raw)
        unflushed = {str(k): int(v) for k, v in doc["unflushed"].items()}
        lost = {str(k): str(v) for k, v in doc.get("lost", {}).items()}
        return cls(str(doc["epoch"]), int(doc["seq"]), unflushed, float(doc["at"]), bool(doc.get("final")), lost)


@dataclass(frozen=True)
class Verdict:
    """What a Redis lost, by its ledger."""

    why: str
    lost: frozenset[str]  # supercuboids whose newest acknowledged writes are gone
    keep: frozenset[str]  # what the Redis holds that is intact; everything else it holds is dropped
    unnamed_since: float | None  # writes after this time could not be named (the ledger was not final)

    def report(self, what: str) -> str:
        """What was lost; "no write was lost" only when the account checked against was complete."""
        names = sorted(self.lost)
        shown = ", ".join(names[:NAMES_IN_MESSAGES]) + (f" and {len(names) - NAMES_IN_MESSAGES} more"
                                                         if len(names) > NAMES_IN_MESSAGES else "")
        text = f"the {what} Redis {self.why}: "
        if names:
            text += f"{len(names)} supercuboids lost acknowledged writes ({shown})"
        else:
            text += "no write was lost" if self.unnamed_since is None else "its ledger names no supercuboid lost"
        if self.unnamed_since is not None:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.unnamed_since))
            text += (f"; writes acknowledged after {when} (its last ledger copy) could not be checked and may "
                     "be lost too")
        return text


def assess(ledger: Ledger | None, held: Held) -> Verdict | None:
    """None when the Redis holds everything its ledger says it held (or there is no ledger yet)."""
    if ledger is None or (held.epoch == ledger.epoch and held.seq >= ledger.seq):
        return None
    unnamed = None if ledger.final else ledger.at
    if held.epoch != ledger.epoch:
        why = "came back without its data" if held.epoch is None else "is not the one its ledger describes"
        return Verdict(why, frozenset(ledger.unflushed), frozenset(), unnamed)
    keep = frozenset(n for n, seq in held.unflushed.items() if ledger.unflushed.get(n) == seq)
    why = f"came back short: its writes {held.seq + 1} to {ledger.seq} are gone (a truncated or older AOF)"
    return Verdict(why, frozenset(ledger.unflushed) - keep, keep, unnamed)


class LedgerBook:
    """One ledger object in the base tier's object store."""

    def __init__(self, objects: ObjectStore, what: str):
        self.objects = objects
        self.key = LEDGER_KEYS[what]

    def read(self) -> Ledger | None:
        [(_, raw)] = list(self.objects.get_many([self.key]))
        return None if raw is None else Ledger.from_json(raw)

    def write(self, ledger: Ledger) -> None:
        self.objects.put_many({self.key: ledger.to_json()})


class Record(Protocol):
    """The record of a Redis's acknowledged writes, written before each is acknowledged, in
    another store (the NDBlaze buffer's, in the cache's Redis: CacheTier)."""

    def buffered_record(self) -> tuple[str | None, dict[str, int]]:
        """(the run it describes, None when there is no record; name -> newest recorded seq)."""

    def sync_buffered(self, run: str, seq: int, held: Mapping[str, int]) -> None:
        """Bring it to what the Redis holds (its run, counter and account)."""


class LedgerKeeper:
    """Keeps one Redis's ledger: `verify` it against the ledger (whoever finds it unchecked,
    and the daemon at start), `keep` the ledger up to date (the daemon that drains it, every round
    and at its stop). Both run under a lock of their own across processes, so a short account
    never overwrites a longer one, and two verifiers do not both drop what the Redis holds."""

    def __init__(self, what: str, holdings: Holdings, book: LedgerBook,
                 lock: Callable[[], AbstractContextManager[None]], drop_all_but: Callable[[frozenset[str]], object],
                 refuse: Callable[[dict[str, str]], None], refused: Callable[[], dict[str, str]],
                 clock: Callable[[], float] = time.time, observer: Observer = NULL, record: Record | None = None):
        self.what = what
        self.holdings = holdings
        self.book = book
        self.lock = lock
        self.drop_all_but = drop_all_but  # drop what the Redis holds except these supercuboids
        self.refuse = refuse  # mark supercuboids lost (they are refused until an operator accepts)
        self.refused = refused  # what is marked lost now (recorded in this ledger too)
        self.clock = clock
        self.observer = observer
        self.record = record  # checked in place of the ledger when there is one (see the module's docstring)
        self.mirrored: Ledger | None = None  # the ledger as this process last wrote or read it

    def verify(self) -> Verdict | None:
        """Check the Redis against its ledger; on a loss drop what it holds that is not intact,
        mark the lost supercuboids, start a new checked run and write the ledger. Returns the
        verdict (None: nothing lost)."""
        with self.lock():
            return self._verify()

    def _verify(self) -> Verdict | None:
        held, ledger = self.holdings.held(), self.book.read()
        account = self._account(ledger)
        verdict = assess(account, held)
        if verdict is None:
            if held.epoch is None:
                self.holdings.start_epoch(new_epoch(), held.seq)
            if ledger is None or held.epoch is None or ledger.epoch != held.epoch:
                self._write(final=False)
            else:
                self.mirrored = ledger
            self._sync()
            return None
        assert account is not None
        self.holdings.clear_epoch()  # writers refuse while what is not intact is dropped
        self.drop_all_but(verdict.keep)
        found = time.strftime("%Y-%m-%d %H:%M:%S")
        why = f"the {self.what} Redis {verdict.why} (found {found})"
        self.refuse({**(ledger.lost if ledger else {}), **dict.fromkeys(verdict.lost, why)})
        self.holdings.start_epoch(new_epoch(), max(held.seq, account.seq, ledger.seq if ledger else 0))
        self._write(final=False)
        self._sync()
        log.log(logging.ERROR if verdict.lost else logging.WARNING,
                "%s; `ndstore recover` lists the lost supercuboids and accepts the loss", verdict.report(self.what))
        self.observer.count("losses_total", len(verdict.lost), redis=self.what)
        return verdict

    def _account(self, ledger: Ledger | None) -> Ledger | None:
        """What the Redis is checked against: the record when there is one (complete: taken as a
        final ledger), else the ledger."""
        run, recorded = self.record.buffered_record() if self.record is not None else (None, {})
        if run is None:
            return ledger
        return Ledger(run, max(recorded.values(), default=0), recorded, self.clock(), final=True)

    def _sync(self, held: Held | None = None) -> None:
        """The record (if any) brought to what the checked Redis holds."""
        if self.record is not None:
            held = held or self.holdings.held()
            assert held.epoch is not None, "a record describes a checked run"
            self.record.sync_buffered(held.epoch, held.seq, held.unflushed)

    def check(self) -> None:
        """Verify the Redis if it is not the run this process last saw, or came back short: a
        daemon's first step each round, before it drains anything."""
        held, last = self.holdings.held(), self.mirrored
        if last is None or held.epoch != last.epoch or held.seq < last.seq:
            self.verify()

    def keep(self, final: bool = False) -> None:
        """Copy what the Redis holds unflushed into its ledger when it changed (`final`: the
        daemon stops, and nothing before it runs any more). A Redis that came back empty or
        short is verified first."""
        with self.lock():
            held, last = self.holdings.held(), self.mirrored
            if last is None or held.epoch != last.epoch or held.seq < last.seq:
                self._verify()
                held, last = self.holdings.held(), self.mirrored
            if final or last is None or last.final or (held.epoch, held.seq, held.unflushed, self.refused()) != (
                    last.epoch, last.seq, last.unflushed, last.lost):
                self._write(final, held)
            self._sync(held)

    def record_refused(self) -> None:
        """Write the ledger now, with what is marked lost (after an operator or a loss changed it)."""
        with self.lock():
            if self.holdings.held().epoch is None:
                self._verify()
            self._write(final=False)

    def _write(self, final: bool, held: Held | None = None) -> None:
        held = held or self.holdings.held()
        assert held.epoch is not None, "a ledger describes a checked run"
        ledger = Ledger(held.epoch, held.seq, held.unflushed, self.clock(), final, self.refused())
        self.book.write(ledger)
        self.mirrored = ledger
