"""How `make test` shares the test files between its pytest-xdist workers (`--dist loadfile`).

Two changes to xdist's file-by-file scheduling, both about time only (each test still runs, once,
with the fixtures it asks for):

- Files that share an expensive session- or package-scoped fixture go to one worker together, so
  it is started once, not once per worker: the local SparkSession (a JVM), the Spark standalone
  master and worker (two more), and the fault suite's live stack behind its proxy.
- The longest files are handed out first, longest first; the rest follow in xdist's own order
  (most tests first). xdist's order alone put the files of one or two long end-to-end tests last,
  where one worker ran them on its own while the other had finished.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

# Files that share one expensive fixture: each group is one unit of work.
SHARED_FIXTURE = {
    "spark": ("tests/blaze/test_spark_merge.py", "tests/downsample/test_hierarchy.py",
              "tests/security/test_no_code_execution.py"),
    "spark_standalone": ("tests/blaze/test_spark_standalone.py", "tests/downsample/test_spark_standalone.py"),
    "faults stack": ("tests/faults/test_base_tier_faults.py", "tests/faults/test_blaze_redis_lost_live.py",
                     "tests/faults/test_eviction_storm.py", "tests/faults/test_ingest_handler_kill.py",
                     "tests/faults/test_object_store_stall.py", "tests/faults/test_redis_kill_live.py",
                     "tests/faults/test_web_worker_kill.py"),
}
GROUP_OF = {path: group for group, paths in SHARED_FIXTURE.items() for path in paths}

# Units of work that take longest, longest first (seconds on 2 cores with both workers busy, from
# `--junitxml`; only their order matters, and a file missing here is merely scheduled later).
LONGEST_FIRST = (
    "faults stack",  # ~650
    "spark",  # ~460
    "tests/stack/test_up_restart.py",  # ~380
    "tests/ingest/test_pipeline.py",  # ~320
    "spark_standalone",  # ~310
    "tests/ingest/test_client_e2e.py",  # ~310
    "tests/api/test_on_redis_cluster.py",  # ~170
    "tests/fuzz/test_decoders.py",  # ~160
    "tests/stack/test_postgres.py",  # ~140
    "tests/faults/test_object_store_full.py",  # ~120
    "tests/engine/test_cache_tier.py",  # ~95
    "tests/security/test_ingest_bounds.py",  # ~90
    "tests/stack/test_loss_at_start.py",  # ~90
    "tests/security/test_front_admission.py",  # ~85
    "tests/api/test_data_routes.py",  # ~85
    "tests/api/test_cutouts.py",  # ~85
    "tests/fuzz/test_hostile_writes.py",  # ~80
    "tests/faults/test_dependency_stalls.py",  # ~75
)


def scope_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or the group of files sharing its fixture."""
    path = nodeid.split("::", 1)[0]
    return GROUP_OF.get(path, path)


def ordered_scopes(collection: list[str]) -> list[str]:
    """The units of work of the collected test ids: those in LONGEST_FIRST in its order, then the
    others by how many tests they hold (xdist's order), ties in collection order."""
    sizes = Counter(scope_of(nodeid) for nodeid in collection)  # in order of first appearance
    first = {scope: rank for rank, scope in enumerate(LONGEST_FIRST)}
    return sorted(sizes, key=lambda scope: (first.get(scope, len(first)), -sizes[scope]))


def make_scheduler(config: Any, log: Any) -> Any:
    """A LoadFileScheduling with the grouping and the order above."""
    from xdist.scheduler import LoadFileScheduling

    class SharedFixtureScheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def schedule(self) -> None:
            if self.collection is None and self.registered_collections:
                # xdist fills its work queue, an ordered dict, in order of first appearance and
                # hands out its first entries first; keys put there beforehand keep their place
                # when it sets their tests (the workers' collections, which it indexes, stay as they are)
                collection = list(next(iter(self.registered_collections.values())))
                for scope in ordered_scopes(collection):
                    self.workqueue[scope] = {}
            super().schedule()

    config.option.loadscopereorder = False  # the order is ours
    return SharedFixtureScheduling(config, log)
