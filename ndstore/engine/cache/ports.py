"""The cache tier's ports, by caller: each caller is typed against, and uses, only what it needs.

- `RequestPath` (read, write, purge): requests through the cache, channel deletes. CacheTier.
- `Coherence` (read_base, read_raw, write_base, exclusive, rewriting, write_back): direct I/O,
  NDBlaze reads and merges, ingest, downsampling. CacheTier.
- `WriteBackDaemon` (check_ledger, due_for_write_back, flush, keep_ledger): the flusher.
  CacheTier.upkeep (and the tier, which passes them on).
- `EvictionDaemon` (check_ledger, memory_used, coldest, evict): the cache manager. Likewise.
- `Operations` (occupancy, memory_used, write_back_lag, flush_all): /metrics, a clean stop.
  CacheTier.upkeep.
- `LossAdmin` (verify, lost, accept_loss): `ndstore recover` and `prepare`, /metrics. CacheTier.loss.
- `BufferRecord` (guard, watch_buffer, record_buffered, forget_buffered, ledger_for): NDBlaze.
  CacheTier.loss.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from ndstore.core.geometry import Grid
from ndstore.core.keys import SupercuboidKey
from ndstore.core.observe import Observer
from ndstore.engine.base_tier import BaseTier
from ndstore.engine.ledger import LedgerKeeper, Verdict
from ndstore.engine.volume import ChannelVolume, Cutout
from ndstore.storage.interfaces import Holdings

Array = npt.NDArray[Any]
T = TypeVar("T")


class RequestPath(Protocol):
    """Reads and writes through the cache."""

    def read(self, cutout: Cutout) -> Array: ...

    def write(self, cutout: Cutout, data: Array) -> None: ...

    def purge(self, channel: ChannelVolume) -> int:
        """Delete every voxel of a channel, cached (dirty ones too) and stored; returns the
        number of stored supercuboids deleted."""


@dataclass(frozen=True)
class Rewrite:
    """A supercuboid its holder may read and store: it holds its write lock, uncached."""

    base: BaseTier
    key: SupercuboidKey

    def read(self, grid: Grid, dtype: np.dtype) -> Array:
        """The whole supercuboid, (z, y, x), zeros where nothing is stored."""
        return self.base.read_supercuboid(self.key, grid, dtype)

    def store(self, whole: Array, grid: Grid) -> None:
        self.base.store_array(self.key, whole, grid)


class Coherence(Protocol):
    """The base tier, coherently with the cache: no stale cached copy stays readable, and what is
    read holds every acknowledged write."""

    def read_base(self, cutout: Cutout, also: Callable[[Sequence[str]], T]) -> tuple[Array, T]:
        """The base tier's copy of the cutout, dirty cached copies written back first, and
        ``also(supercuboid names)`` under the same read locks."""

    def read_raw(self, cutout: Cutout) -> Array:
        """The base tier as it is, dirty cached data ignored."""

    def write_base(self, cutout: Cutout, data: Array) -> None:
        """Write straight to the base tier, leaving no cached copy of what it changes."""

    def exclusive(self, names: Sequence[str]) -> AbstractContextManager[None]:
        """Write locks on ``names``, cached copies written back if dirty and dropped."""

    def rewriting(self, key: SupercuboidKey) -> AbstractContextManager[Rewrite]:
        """One supercuboid to read whole from the base tier and store back, exclusively."""

    def write_back(self, prefix: str) -> int:
        """Every dirty cached supercuboid whose name starts with ``prefix`` written back."""


class WriteBackDaemon(Protocol):
    """The flusher's."""

    def check_ledger(self) -> None: ...

    def due_for_write_back(self, age_s: float, limit: int) -> list[str]: ...

    def flush(self, names: Sequence[str]) -> int: ...

    def keep_ledger(self, final: bool = False) -> None: ...


class EvictionDaemon(Protocol):
    """The cache manager's."""

    def check_ledger(self) -> None: ...

    def memory_used(self) -> int: ...

    def coldest(self, count: int) -> list[str]: ...

    def evict(self, name: str, lock_timeout_s: float) -> bool: ...


class Operations(Protocol):
    """Gauges and a clean stop."""

    def occupancy(self) -> tuple[int, int]: ...

    def memory_used(self) -> int: ...

    def write_back_lag(self) -> float: ...

    def flush_all(self) -> int: ...


class LossAdmin(Protocol):
    """An operator's: what was lost, and accepting it."""

    def verify(self) -> Verdict | None: ...

    def lost(self) -> dict[str, str]: ...

    def accept_loss(self, names: Sequence[str]) -> None: ...


class BufferRecord(Protocol):
    """NDBlaze's: the record of its writes kept in the cache's store, and the ledger of its buffer."""

    def guard(self, names: Sequence[str]) -> str: ...

    def watch_buffer(self, check: Callable[[str], bool]) -> None: ...

    def record_buffered(self, run: str, seqs: Mapping[str, int]) -> bool: ...

    def forget_buffered(self, seqs: Mapping[str, int]) -> None: ...

    def ledger_for(self, what: str, holdings: Holdings, drop_all_but: Callable[[frozenset[str]], object],
                   observer: Observer = ...) -> LedgerKeeper: ...
