"""The storage ports' contract suites and in-memory fakes, shipped with the package for any
implementation of a port to prove itself against (as zarr-python ships `zarr.testing.StoreTests`).

One module per port (ndstore/storage/interfaces.py, and core.observe's Observer for metrics),
each with one class of `test_*` methods written against the port alone: `ObjectStoreContract`
(object_store), `SupercuboidIndexContract` (index), `LabelIndexContract` (label_index),
`WorkQueueContract` (queues), `TileStoreContract` (tile_store), `JobStateContract` (job_state),
`TriggersContract` (triggers), `SharedMetricsContract` (metrics), `BlazeBufferContract`
(blaze_buffer: the buffer, its merge requests and the merger's presence), the cuboid cache's
ports (cuboid_cache) and the locks (locks). An implementation runs a suite by subclassing it as
a pytest `Test*` class that defines the fixture the suite names (and any hook the suite
documents for looking inside the backend), e.g.::

    class TestMyStore(ObjectStoreContract):
        @pytest.fixture
        def store(self, tmp_path): ...

`memory` holds in-memory implementations of the ObjectStore, SupercuboidIndex, LabelIndex and
SharedMetrics ports and `memory_cache` one of the cuboid cache for fast engine tests; each passes
its port's suite (tests/contracts/).

Test code only: nothing in ndstore, blaze or lambdas imports this package (an import-linter
contract), and it needs pytest.
"""

from __future__ import annotations

import pytest

SUITES = ("object_store", "index", "label_index", "queues", "tile_store", "job_state", "triggers", "metrics",
          "blaze_buffer", "cuboid_cache", "locks")

# The suites' plain `assert`s report their values when they fail, as those of a test module do:
# pytest rewrites the modules named here when they are imported, after this line.
pytest.register_assert_rewrite(*(f"{__name__}.{suite}" for suite in SUITES))
