"""The SharedMetrics port's contract: counters and histograms that every recorder (one per
process) adds into one table, read whole for `/metrics`.

A subclass defines the fixture `recorder`: a factory of recorders on one empty table, each call
another recorder on it (another process of the same deployment); the suite closes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from ndstore.core.observe import BUCKETS
from ndstore.storage.interfaces import SharedMetrics, Snapshot

Key = tuple[str, str]


def key(name: str, **labels: str) -> Key:
    return name, Snapshot.labels_key(labels)


class SharedMetricsContract:
    @pytest.fixture
    def recorder(self) -> Callable[[], SharedMetrics]:
        raise NotImplementedError("a subclass defines `recorder`: a factory of recorders on one empty table")

    @pytest.fixture
    def metrics(self, recorder: Callable[[], SharedMetrics]) -> Iterator[SharedMetrics]:
        made = recorder()
        yield made
        made.close()

    def test_counts_add_up_by_name_and_labels(self, metrics: SharedMetrics) -> None:
        for _ in range(3):
            metrics.count("requests_total", route="CutoutView")
        metrics.count("requests_total", 2.5, route="CutoutView")
        metrics.count("requests_total", route="TileView")
        metrics.count("errors_total", route="CutoutView", kind="timeout")
        metrics.count("flushes_total")
        assert metrics.flush() is True
        assert metrics.snapshot().counters == {
            key("requests_total", route="CutoutView"): 5.5, key("requests_total", route="TileView"): 1.0,
            key("errors_total", kind="timeout", route="CutoutView"): 1.0, key("flushes_total"): 1.0}

    def test_labels_are_read_back_whatever_order_they_were_given_in(self, metrics: SharedMetrics) -> None:
        metrics.count("errors_total", route="A", kind="b")
        metrics.count("errors_total", kind="b", route="A")
        metrics.flush()
        [(name, raw)] = metrics.snapshot().counters
        assert (name, Snapshot.labels(raw)) == ("errors_total", {"kind": "b", "route": "A"})
        assert metrics.snapshot().counters[(name, raw)] == 2

    def test_observed_values_fall_in_their_buckets(self, metrics: SharedMetrics) -> None:
        values = [BUCKETS[0], BUCKETS[0] / 2, 0.003, 0.75, BUCKETS[-1], BUCKETS[-1] * 2, 0.003]
        for value in values:
            metrics.observe("request_seconds", value, route="CutoutView")
        metrics.observe("request_seconds", 1.0, route="TileView")
        metrics.flush()
        histograms = metrics.snapshot().histograms
        assert set(histograms) == {key("request_seconds", route="CutoutView"), key("request_seconds", route="TileView")}
        cutouts = histograms[key("request_seconds", route="CutoutView")]
        expected = [0.0] * (len(BUCKETS) + 1)
        for value in values:  # each in the first bucket whose bound it does not pass; +Inf last
            expected[next((i for i, le in enumerate(BUCKETS) if value <= le), len(BUCKETS))] += 1
        assert cutouts.buckets == expected
        assert cutouts.count == len(values)
        assert cutouts.sum == pytest.approx(sum(values))
        assert histograms[key("request_seconds", route="TileView")].buckets[BUCKETS.index(1.0)] == 1

    def test_every_recorder_adds_into_the_one_table(self, recorder: Callable[[], SharedMetrics]) -> None:
        first, second = recorder(), recorder()
        try:
            first.count("requests_total", route="A")
            second.count("requests_total", 2, route="A")
            second.observe("request_seconds", 0.5)
            first.observe("request_seconds", 0.5)
            assert first.flush() and second.flush()
            for snapshot in (first.snapshot(), second.snapshot()):
                assert snapshot.counters == {key("requests_total", route="A"): 3}
                assert snapshot.histograms[key("request_seconds")].count == 2
        finally:
            first.close()
            second.close()

    def test_close_flushes_what_is_left(self, recorder: Callable[[], SharedMetrics]) -> None:
        closed, reader = recorder(), recorder()
        try:
            closed.count("requests_total", route="A")
            assert closed.close() is True
            assert reader.snapshot().counters == {key("requests_total", route="A"): 1}
        finally:
            reader.close()

    def test_reset_forgets_every_count(self, metrics: SharedMetrics) -> None:
        metrics.count("requests_total")
        metrics.observe("request_seconds", 0.1)
        metrics.flush()
        metrics.count("requests_total")  # not flushed yet: forgotten too
        metrics.reset()
        metrics.flush()
        assert metrics.snapshot() == Snapshot()
        metrics.count("requests_total")
        metrics.flush()
        assert metrics.snapshot().counters == {key("requests_total"): 1}

    def test_an_empty_table_reads_empty_and_flushing_nothing_succeeds(self, metrics: SharedMetrics) -> None:
        assert metrics.flush() is True
        assert metrics.snapshot() == Snapshot()
