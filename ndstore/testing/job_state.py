"""The JobState port's contract: rows of progress of ingest jobs and downsample runs, every
counted change conditional (a duplicate event or a retried handler never counts twice).

A subclass defines the fixture `state`: an empty job state of the implementation under test,
made ready (`ensure_ready`).
"""

from __future__ import annotations

import pytest

from ndstore.core.errors import StorageError
from ndstore.storage.interfaces import JobState

JOB, ROW = "7", "7&0&12"
EMPTY_ROW = {"tiles": set(), "expected": 0, "claim": None, "queued": False, "built": False, "cleaned": False}


class JobStateContract:
    @pytest.fixture
    def state(self) -> JobState:
        raise NotImplementedError("a subclass defines the `state` fixture: an empty, ready job state")

    def test_a_missing_row_reads_as_empty(self, state: JobState) -> None:
        assert state.supercuboid("nothing") == {"tiles": set(), "expected": 0, "claim": None,
                                                "queued": False, "built": False, "cleaned": False}
        assert not state.has_tile("nothing", 0)
        assert state.counters("nothing") == {}
        assert state.job("nothing") == {"tiles_uploaded": 0, "supercuboids_built": 0, "supercuboids_cleaned": 0,
                                         "manifest_sent": 0}
        assert state.job_spec("nothing") is None

    def test_record_tile_counts_each_tile_once(self, state: JobState) -> None:
        assert state.record_tile(JOB, ROW, 3, 4)
        assert state.record_tile(JOB, ROW, 0, 4)
        assert not state.record_tile(JOB, ROW, 3, 4)  # a duplicate event
        assert state.has_tile(ROW, 3) and state.has_tile(ROW, 0) and not state.has_tile(ROW, 1)
        assert state.supercuboid(ROW)["tiles"] == {0, 3}
        assert state.supercuboid(ROW)["expected"] == 4
        assert state.job(JOB)["tiles_uploaded"] == 2
        assert state.record_tile(JOB, "7&0&13", 0, 2)  # another row of the same job
        assert state.job(JOB)["tiles_uploaded"] == 3

    def test_a_refused_record_tile_changes_nothing(self, state: JobState) -> None:
        assert state.record_tile(JOB, ROW, 1, 4)
        assert not state.record_tile(JOB, ROW, 1, 9)
        assert state.supercuboid(ROW)["expected"] == 4
        assert state.counters(ROW) == {"expected": 4}
        assert state.counters(JOB) == {"tiles_uploaded": 1}

    def test_a_cleaned_row_refuses_tiles_and_reads_as_having_them(self, state: JobState) -> None:
        for ordinal in range(3):
            assert state.record_tile(JOB, ROW, ordinal, 3)
        assert state.mark_counted(JOB, ROW, "cleaned", "supercuboids_cleaned", drop_tiles=True)
        row = state.supercuboid(ROW)
        assert row["tiles"] == set() and row["cleaned"] and row["expected"] == 3
        assert not state.record_tile(JOB, ROW, 0, 3)  # a late duplicate of a tile packed already
        assert not state.record_tile(JOB, ROW, 7, 3)
        assert state.has_tile(ROW, 0) and state.has_tile(ROW, 7)
        assert state.job(JOB)["tiles_uploaded"] == 3
        assert state.job(JOB)["supercuboids_cleaned"] == 1

    def test_claim_is_taken_once_and_retried_by_its_claimant(self, state: JobState) -> None:
        assert state.claim(ROW, "tile-a")
        assert not state.claim(ROW, "tile-b")
        assert state.claim(ROW, "tile-a")  # the claimant's retry
        assert state.supercuboid(ROW)["claim"] == "tile-a"

    def test_mark_sets_a_flag(self, state: JobState) -> None:
        state.mark(ROW, "queued")
        state.mark(ROW, "queued")
        row = state.supercuboid(ROW)
        assert row["queued"] and not row["built"] and not row["cleaned"]
        assert state.job(JOB)["supercuboids_built"] == 0  # mark counts nothing

    def test_mark_counted_counts_once(self, state: JobState) -> None:
        state.record_tile(JOB, ROW, 0, 1)
        assert state.mark_counted(JOB, ROW, "built", "supercuboids_built")
        assert not state.mark_counted(JOB, ROW, "built", "supercuboids_built")
        row = state.supercuboid(ROW)
        assert row["built"] and row["tiles"] == {0}  # without drop_tiles the tiles stay
        assert state.job(JOB)["supercuboids_built"] == 1
        state.mark("7&0&13", "built")  # set by mark: mark_counted finds it set
        assert not state.mark_counted(JOB, "7&0&13", "built", "supercuboids_built")
        assert state.job(JOB)["supercuboids_built"] == 1

    def test_mark_counted_takes_any_flag_and_counter(self, state: JobState) -> None:
        assert state.mark_counted("ds&9", "ds&9&1&5", "done", "level1_done")
        assert not state.mark_counted("ds&9", "ds&9&1&5", "done", "level1_done")
        assert state.counters("ds&9") == {"level1_done": 1}

    def test_set_count_and_counters(self, state: JobState) -> None:
        state.set_count("ds&9", "level1_total", 8)
        state.set_count("ds&9", "level2_total", 1)
        state.set_count("ds&9", "level1_total", 9)
        state.record_tile("ds&9", ROW, 0, 5)
        assert state.counters("ds&9") == {"level1_total": 9, "level2_total": 1, "tiles_uploaded": 1}
        assert state.counters(ROW) == {"expected": 5}

    def test_job_counters_and_spec(self, state: JobState) -> None:
        state.put_job(JOB, "sealed spec")
        state.put_job(JOB, "sealed spec, again")
        assert state.job_spec(JOB) == "sealed spec, again"
        state.record_tile(JOB, ROW, 0, 1)
        state.mark_counted(JOB, ROW, "built", "supercuboids_built")
        assert state.advance_manifest(JOB, 0, 500)
        assert state.job(JOB) == {"tiles_uploaded": 1, "supercuboids_built": 1, "supercuboids_cleaned": 0,
                                  "manifest_sent": 500}
        assert state.counters(JOB) == {"tiles_uploaded": 1, "supercuboids_built": 1, "manifest_sent": 500}
        assert state.job_spec(JOB) == "sealed spec, again"  # counting leaves the spec alone

    def test_advance_manifest_lets_one_of_two_racing_callers_win(self, state: JobState) -> None:
        assert state.advance_manifest(JOB, 0, 500)  # unset, sent 0
        assert not state.advance_manifest(JOB, 0, 500)  # the second caller read 0 before the first wrote
        assert state.advance_manifest(JOB, 500, 1000)
        assert not state.advance_manifest(JOB, 500, 1000)
        assert not state.advance_manifest(JOB, 2000, 2500)
        assert state.job(JOB)["manifest_sent"] == 1000

    def test_advance_manifest_of_an_unset_job_takes_only_zero(self, state: JobState) -> None:
        assert not state.advance_manifest(JOB, 500, 1000)
        assert state.job(JOB)["manifest_sent"] == 0

    def test_delete_removes_rows_and_ignores_missing_ones(self, state: JobState) -> None:
        state.put_job(JOB, "spec")
        state.record_tile(JOB, ROW, 0, 2)
        state.claim(ROW, "me")
        state.mark(ROW, "queued")
        state.advance_manifest(JOB, 0, 10)
        state.delete([ROW, JOB, "never-there"])
        assert state.job_spec(JOB) is None
        assert state.counters(JOB) == {} and state.counters(ROW) == {}
        assert state.supercuboid(ROW) == {"tiles": set(), "expected": 0, "claim": None,
                                          "queued": False, "built": False, "cleaned": False}
        assert state.record_tile(JOB, ROW, 0, 2)  # a deleted row starts again
        state.delete([])

    def test_a_leave_stands_until_revoked_and_a_stopped_job_gives_none(self, state: JobState) -> None:
        assert state.leaves(JOB) is None  # no such job
        state.put_job(JOB, "spec")
        assert state.leaves(JOB) == {}
        alice = state.open_leave(JOB, "12")
        assert alice and state.open_leave(JOB, "12") == alice  # kept, not made again
        bob = state.open_leave(JOB, "13")
        assert bob and bob != alice and state.leaves(JOB) == {"12": alice, "13": bob}
        state.revoke_leave(JOB, "12")
        state.revoke_leave(JOB, "12")  # idempotent
        assert state.leaves(JOB) == {"13": bob}
        again = state.open_leave(JOB, "12")
        assert again and again != alice  # a leave revoked never stands again
        state.stop(JOB)
        state.stop(JOB)
        assert state.leaves(JOB) is None and state.open_leave(JOB, "14") is None
        assert state.job_spec(JOB) == "spec"  # the record stays for the removal that follows
        with pytest.raises(StorageError, match="not an uploader"):
            state.open_leave("8", "a.b")

    def test_ensure_ready_again_keeps_the_rows(self, state: JobState) -> None:
        state.put_job(JOB, "spec")
        state.record_tile(JOB, ROW, 2, 3)
        state.ensure_ready()
        assert state.job_spec(JOB) == "spec" and state.supercuboid(ROW)["tiles"] == {2}

    def test_a_deleted_job_starts_afresh(self, state: JobState) -> None:
        state.put_job(JOB, "spec")
        leave = state.open_leave(JOB, "12")
        state.stop(JOB)
        state.delete([JOB])
        assert state.job_spec(JOB) is None and state.leaves(JOB) is None  # no spec: no leaves
        state.put_job(JOB, "spec again")
        assert state.leaves(JOB) == {}  # neither stopped nor holding the old leave
        again = state.open_leave(JOB, "12")
        assert again and again != leave

    def test_rows_are_apart(self, state: JobState) -> None:
        """A row's tiles, claim and flags are its own; counters of one key leave another's alone."""
        assert state.record_tile(JOB, ROW, 0, 2)
        assert state.claim(ROW, "a") and state.claim("7&0&13", "b")
        state.mark(ROW, "queued")
        assert state.supercuboid("7&0&13") == {**EMPTY_ROW, "claim": "b"}
        assert state.supercuboid(ROW) == {**EMPTY_ROW, "tiles": {0}, "expected": 2, "claim": "a", "queued": True}
        state.set_count("8", "level1_total", 4)
        assert state.counters(JOB) == {"tiles_uploaded": 1} and state.counters("8") == {"level1_total": 4}
        state.delete([ROW])
        assert state.supercuboid("7&0&13")["claim"] == "b" and state.counters(JOB) == {"tiles_uploaded": 1}
