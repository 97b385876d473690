"""`GET /metrics`: the whole service's figures in Prometheus text format, for staff tokens
(Prometheus: `authorization: {type: Token, credentials: <key>}`).

Counters and histograms come from the shared counters every process adds into (the web workers,
the daemons, the merger and the ingest runner, wherever they run: `services().metrics.snapshot()`);
gauges are read at scrape time from the stores themselves. A part that does not answer leaves
its gauges out and sets `ndstore_scrape_error{part}` to 1.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from rest_framework.views import APIView

from ndstore.api import auth
from ndstore.api.models import DownsampleJob, IngestJob
from ndstore.api.schema import TOKEN_REQUIRED, errors
from ndstore.core.observe import BUCKETS
from ndstore.wiring import Services, services

HELP = {
    "requests": "HTTP requests served, by route (view), method and status class",
    "request_duration_seconds": "time to answer a request, by route",
    "request_bytes": "request and response body bytes, by route and direction",
    "errors": "requests refused or failed, by kind (exception) and status",
    "cache_reads": "supercuboids read through the cache tier: resident (hit) or paged in (miss)",
    "flushes": "supercuboids written back to the base tier by the flusher",
    "flushes_postponed": "write-backs postponed (lock busy, store failing), by kind",
    "evictions": "supercuboids evicted by the cache manager",
    "lock_wait_seconds": "how long a busy supercuboid lock kept its taker waiting, by mode",
    "lock_timeouts": "locks not taken in time, by mode",
    "daemon_rounds": "rounds the daemons completed, by daemon",
    "daemon_errors": "rounds that failed (and were retried after a backoff), by daemon and kind",
    "blaze_merged_blobs": "NDBlaze writes merged into the base tier",
    "blaze_merged_supercuboids": "supercuboids the NDBlaze merge rewrote",
    "blaze_merge_failures": "supercuboids a merge left pending (a blob no longer decodes)",
    "ingest_handled": "ingest and downsample task records handled by the runner, by handler and outcome",
    "losses": "supercuboids found to have lost acknowledged writes (a Redis came back empty, short or damaged), "
              "by Redis",
    "cache_repairs": "cached supercuboids that failed their checksum: dropped and paged in again, or lost if dirty",
}


def _families(snapshot: Any) -> Iterator[Metric]:
    counters: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for (name, labels), value in snapshot.counters.items():
        counters[name.removesuffix("_total")].append((snapshot.labels(labels), value))
    for name, rows in sorted(counters.items()):
        keys = sorted({k for labels, _ in rows for k in labels})
        family = CounterMetricFamily(f"ndstore_{name}", HELP.get(name, name), labels=keys)
        for labels, value in rows:
            family.add_metric([labels.get(k, "") for k in keys], value)
        yield family
    histograms: dict[str, list[tuple[dict[str, str], Any]]] = defaultdict(list)
    for (name, labels), histogram in snapshot.histograms.items():
        histograms[name].append((snapshot.labels(labels), histogram))
    for name, rows in sorted(histograms.items()):
        keys = sorted({k for labels, _ in rows for k in labels})
        hist = HistogramMetricFamily(f"ndstore_{name}", HELP.get(name, name), labels=keys)
        for labels, histogram in rows:
            cumulative, buckets = 0.0, []
            for le, count in zip([*map(str, BUCKETS), "+Inf"], histogram.buckets):
                cumulative += count
                buckets.append((le, cumulative))
            hist.add_metric([labels.get(k, "") for k in keys], buckets, histogram.sum)
        yield hist


def _gauge(name: str, doc: str, value: float, **labels: str) -> GaugeMetricFamily:
    family = GaugeMetricFamily(f"ndstore_{name}", doc, labels=sorted(labels))
    family.add_metric([labels[k] for k in sorted(labels)], value)
    return family


def _cache_gauges(svc: Services) -> Iterator[Metric]:
    resident, dirty = svc.cache_tier.upkeep.occupancy()
    family = GaugeMetricFamily("ndstore_cache_supercuboids", "supercuboids in the cache, by state", labels=["state"])
    family.add_metric(["resident"], resident)
    family.add_metric(["dirty"], dirty)
    yield family
    yield _gauge("cache_memory_bytes", "memory the cache Redis uses", svc.cache_tier.upkeep.memory_used())
    yield _gauge("write_back_lag_seconds", "how long the longest-dirty supercuboid has waited to be written back",
                 svc.cache_tier.upkeep.write_back_lag())
    yield _gauge("lost_supercuboids", "supercuboids refused (503) because a Redis lost acknowledged writes to them, "
                 "until an operator accepts the loss (`ndstore recover`)", len(svc.cache_tier.loss.lost()))


def _blaze_gauges(svc: Services) -> Iterator[Metric]:
    stats = svc.blaze_buffer.stats()
    yield _gauge("blaze_pending_bytes", "NDBlaze write bytes awaiting merge", stats.pending_bytes)
    yield _gauge("blaze_pending_blobs", "NDBlaze writes awaiting merge", stats.blobs)
    yield _gauge("blaze_merge_lag_seconds", "age of the oldest NDBlaze write awaiting merge", stats.oldest_age_s or 0)
    yield _gauge("blaze_merger_up", "1 while a merger announces itself", int(svc.merger_presence.merger() is not None))


def _job_gauges(svc: Services) -> Iterator[Metric]:
    for model, name in ((IngestJob, "ingest_jobs"), (DownsampleJob, "downsample_jobs")):
        family = GaugeMetricFamily(f"ndstore_{name}", f"{name.replace('_', ' ')} by state", labels=["state"])
        for state in model.STATES:
            family.add_metric([state], model.objects.filter(state=state).count())
        yield family
    totals: dict[str, float] = defaultdict(float)
    for job in IngestJob.objects.filter(state="uploading").order_by("-id")[:200]:
        counters = svc.ingest_stores.state.job(str(job.id))
        totals["uploaded"] += counters["tiles_uploaded"]
        totals["built"] += counters["supercuboids_built"]
    family = GaugeMetricFamily("ndstore_ingest_progress", "tiles recorded and supercuboids built, over the ingest "
                               "jobs uploading", labels=["what"])
    for what, value in sorted(totals.items()):
        family.add_metric([what], value)
    yield family


def _segment_gauges(svc: Services) -> Iterator[Metric]:
    if svc.products is None:
        return
    pending = svc.products.queued()
    yield _gauge("segment_rebuilds_waiting", "supercuboids whose meshes and skeletons wait for a rebuild (queued)",
                 pending.waiting)
    yield _gauge("segment_rebuilds_in_flight", "rebuilds of meshes and skeletons under way", pending.in_flight)


class ServiceCollector:
    def __init__(self, svc: Services):
        self.svc = svc

    def collect(self) -> Iterator[Metric]:
        errors = GaugeMetricFamily("ndstore_scrape_error", "1 where a part did not answer this scrape", labels=["part"])
        parts: list[tuple[str, Callable[[Services], Iterator[Metric]]]] = [
            ("counters", lambda s: _families(s.metrics.snapshot())), ("cache", _cache_gauges),
            ("blaze", _blaze_gauges), ("jobs", _job_gauges), ("segments", _segment_gauges)]
        for part, families in parts:
            try:
                yield from list(families(self.svc))
                errors.add_metric([part], 0)
            except Exception:  # noqa: BLE001 - a part that is down is reported, not fatal
                errors.add_metric([part], 1)
        yield errors


@extend_schema(summary="The service's metrics, for Prometheus", auth=TOKEN_REQUIRED, responses={
    (200, CONTENT_TYPE_LATEST): OpenApiResponse(OpenApiTypes.STR, description="Prometheus text format"),
    **errors(401, 403, 429, meanings={403: "only staff tokens may read the metrics"})})
class MetricsView(APIView):
    def get(self, request: Any) -> HttpResponse:
        auth.require_staff(request.user, "read the service's metrics")
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ServiceCollector(services()))  # type: ignore[arg-type]
        return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
