"""Building the resolution hierarchy: the manifest of each level from the supercuboid index
(never a LIST of the object store), the reduce of one parent supercuboid from its children, and
the SQS-driven run where the last task of a level queues the next level.

A parent is read and written through CoherentDirect: its children under read locks (dirty cached
children written back first), the parent under its write lock with any cached copy evicted, so no
reader sees a stale level. Rebuilding a parent writes the same voxels; an all-zero parent is not
stored (sparse stays sparse). See docs/design/downsample.md.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ndstore.core import morton
from ndstore.core.downsample import reduce
from ndstore.core.errors import NotFound
from ndstore.core.geometry import Box
from ndstore.core.keys import SEPARATOR
from ndstore.core.signing import BadSignature, Signer
from ndstore.engine.direct import CoherentDirect
from ndstore.engine.levels import LevelRecord
from ndstore.engine.volume import ChannelVolume, Cutout
from ndstore.storage.interfaces import JobState, QueueCounts, SupercuboidIndex, Triggers, WorkQueue

log = logging.getLogger("ndstore.downsample")
Parent = tuple[int, int, tuple[int, int, int]]  # (level, t, supercuboid index x, y, z)


def factors(channel: ChannelVolume) -> tuple[int, int, int]:
    """Reduction per (z, y, x): x and y halve at every level; z too when isotropic."""
    return (2 if channel.method == "isotropic" else 1, 2, 2)


class Downsampler:
    def __init__(self, direct: CoherentDirect, index: SupercuboidIndex):
        self.direct = direct
        self.index = index

    def manifest(self, channel: ChannelVolume, level: int) -> list[Parent]:
        """Every parent at `level` with at least one stored child at `level - 1`, over all time
        samples, from the supercuboid index."""
        fz, _, _ = factors(channel)
        self.write_back(channel, level - 1)
        parents: set[Parent] = set()
        for t in range(channel.num_time_samples):
            for code in self.index.mortons(channel.volume_key(level - 1, t)):
                x, y, z = morton.decode_one(code)
                parents.add((level, t, (x // 2, y // 2, z // fz)))
        return sorted(parents)

    def write_back(self, channel: ChannelVolume, level: int) -> int:
        """Write back the level's dirty cached supercuboids, so the index lists every child."""
        return self.direct.tier.write_back(f"{channel.name_prefix}{level}{SEPARATOR}")

    def build_parent(self, channel: ChannelVolume, parent: Parent) -> None:
        level, t, index = parent
        if not 0 < level < channel.num_levels:
            raise NotFound(f"level {level} is not above the base of this channel (levels 0..{channel.num_levels - 1})")
        out = channel.grid(level).supercuboid_box(index).intersect(channel.extent(level))
        if out is None:
            return
        fz, fy, fx = factors(channel)
        scale = (fx, fy, fz)
        region = Box(tuple(v * f for v, f in zip(out.lo, scale)),  # type: ignore[arg-type]
                     tuple(v * f for v, f in zip(out.hi, scale)))  # type: ignore[arg-type]
        below = channel.extent(level - 1)
        inside = region.intersect(below)
        data = np.zeros(region.shape_zyx, channel.dtype)
        if inside is not None:
            below_cutout = Cutout(channel, level - 1, inside, range(t, t + 1))
            data[inside.slices_zyx(region.lo)] = self.direct.read(below_cutout)[0]
        axes = [np.arange(region.lo[a], region.hi[a]) for a in (2, 1, 0)]  # z, y, x
        valid = tuple((c >= below.lo[a]) & (c < below.hi[a]) for c, a in zip(axes, (2, 1, 0)))
        reduced = reduce(data, (fz, fy, fx), valid, channel.annotation)  # type: ignore[arg-type]
        self.direct.write(Cutout(channel, level, out, range(t, t + 1)), reduced[None])


# -- the SQS-driven run ------------------------------------------------------------------------


@dataclass(frozen=True)
class DownsampleJob:
    job_id: int
    channel: ChannelVolume
    queue_prefix: str

    @property
    def num_levels(self) -> int:
        return self.channel.num_levels

    @property
    def queue(self) -> str:
        return f"{self.queue_prefix}-ds-{self.job_id}"

    @property
    def name(self) -> str:
        return f"ds&{self.job_id}"

    def level_row(self, level: int) -> str:
        return f"ds&{self.job_id}&{level}"

    def task_row(self, parent: Parent) -> str:
        level, t, (x, y, z) = parent
        return f"ds&{self.job_id}&{level}&{t}&{morton.encode_one(x, y, z)}"

    def to_json(self) -> str:
        return json.dumps({"job_id": self.job_id, "channel": self.channel.to_dict(), "queue_prefix": self.queue_prefix})

    @classmethod
    def from_json(cls, raw: str) -> DownsampleJob:
        spec = json.loads(raw)
        return cls(spec["job_id"], ChannelVolume.from_dict(spec["channel"]), spec["queue_prefix"])


def _task(job: DownsampleJob, parent: Parent) -> str:
    level, t, index = parent
    return json.dumps({"job": job.job_id, "level": level, "t": t, "index": list(index)})


class DownsampleRuns:
    """Builds driven by SQS: one task per parent; the task that completes a level queues the next."""

    def __init__(self, downsampler: Downsampler, state: JobState, queues: WorkQueue, queue_prefix: str,
                 visibility_s: int, max_tries: int, signer: Signer, levels: LevelRecord,
                 trigger: tuple[Triggers, str] | None = None):
        """`levels`: marked built, every one, by the task that finishes the run. `signer`: the
        service's key; a run's record (its channel) is sealed with it, so whoever
        can write the state table cannot point a run at another channel. `trigger`: on AWS, the
        Lambda API and the function a job's queue triggers; None where the local runner polls."""
        self.signer = signer
        self.levels = levels
        self.trigger = trigger
        self.downsampler = downsampler
        self.state = state
        self.queues = queues
        self.queue_prefix = queue_prefix
        self.visibility_s = visibility_s
        self.max_tries = max_tries
        self._jobs: dict[int, DownsampleJob] = {}

    def start(self, job: DownsampleJob) -> int:
        """Record the job, create its queue and queue level 1; returns the level-1 task count."""
        self.state.ensure_ready()
        self.state.put_job(job.name, self.signer.seal(job.name, job.to_json()))
        url = self.queues.create(job.queue, self.visibility_s, self.max_tries)
        if self.trigger:
            self.trigger[0].attach(self.queues.arn(url), self.trigger[1])
        queued = self._queue_level(job, 1, url)
        if not queued:
            self.levels.note_all_built(job.channel)  # nothing to build: every level is as built as it gets
        return queued

    def _queue_level(self, job: DownsampleJob, level: int, url: str) -> int:
        if level >= job.num_levels:
            return 0
        parents = self.downsampler.manifest(job.channel, level)
        for above in range(level, job.num_levels if not parents else level + 1):  # nothing below: nothing above
            self.state.set_count(job.level_row(above), "total", len(parents))
        self.queues.send(url, (_task(job, p) for p in parents))
        return len(parents)

    def job(self, job_id: int) -> DownsampleJob:
        if job_id not in self._jobs:
            name = f"ds&{job_id}"
            sealed = self.state.job_spec(name)
            if sealed is None:
                raise NotFound(f"no downsample job {job_id}")
            job = DownsampleJob.from_json(self.signer.open(name, sealed))
            if job.job_id != job_id or job.queue_prefix != self.queue_prefix:
                raise BadSignature(f"the record of downsample job {job_id} describes another job")
            self._jobs[job_id] = job
        return self._jobs[job_id]

    def handle(self, body: str) -> str:
        """Build one parent; count it once; if it completed its level, queue the next level."""
        task = json.loads(body)
        job = self.job(int(task["job"]))
        parent: Parent = (int(task["level"]), int(task["t"]), tuple(task["index"]))
        self.downsampler.build_parent(job.channel, parent)
        level_row = job.level_row(parent[0])
        self.state.mark_counted(level_row, job.task_row(parent), "done", "done")
        counts = self.state.counters(level_row)
        if counts.get("done", 0) < counts.get("total", 0) or self.state.supercuboid(level_row)["queued"]:
            return "built"
        if not self.state.claim(level_row, job.task_row(parent)):
            return "built"  # another task of the level queues the next one
        url = self.queues.url(job.queue)
        if url is None:
            return "cancelled"
        queued = self._queue_level(job, parent[0] + 1, url)
        self.state.mark(level_row, "queued")
        if not queued:  # the top level, or nothing stored below the next: the run is done
            self.levels.note_all_built(job.channel)
            return "run done"
        return "level done"

    def status(self, job: DownsampleJob) -> dict[str, Any]:
        """Per level: total, done, failed; and the run's state."""
        url, dlq = self.queues.url(job.queue), self.queues.url(f"{job.queue}-dlq")
        failed_by_level: dict[int, int] = {}
        if dlq and self.queues.counts(dlq).total:
            for m in self.queues.peek(dlq, 1000):
                level = int(m.json()["level"])
                failed_by_level[level] = failed_by_level.get(level, 0) + 1
        levels: dict[str, dict[str, int]] = {}
        finished = True
        for level in range(1, job.num_levels):
            counts = self.state.counters(job.level_row(level))
            if "total" not in counts:
                finished = False
                break
            levels[str(level)] = {"total": counts["total"], "done": counts.get("done", 0),
                                  "failed": failed_by_level.get(level, 0)}
            finished = finished and counts.get("done", 0) >= counts["total"]
        pending = self.queues.counts(url) if url else QueueCounts(0, 0)
        state = ("FAILED" if failed_by_level else "DOWNSAMPLED" if finished and job.num_levels > 1
                 else "DOWNSAMPLED" if job.num_levels == 1 else "IN_PROGRESS")
        return {"state": state, "levels": levels, "queue": {"waiting": pending.waiting, "in_flight": pending.in_flight}}

    def remove(self, job: DownsampleJob) -> None:
        url = self.queues.url(job.queue)
        if self.trigger and url:
            self.trigger[0].detach(self.queues.arn(url))
        self.queues.delete(job.queue)
        self._jobs.pop(job.job_id, None)

    def rows(self, job: DownsampleJob) -> Iterator[str]:
        yield job.name
        for level in range(1, job.num_levels):
            yield job.level_row(level)
