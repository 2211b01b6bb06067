"""A sweep split over several arrays is ONE run: ids, lookup, states and cancel (no Slurm)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.models import JobInfo
from jobs import records
from jobs.monitor import cancel, states_many
from jobs.records import RunRecord, TaskRecord


def _split(tmp_path: Path, tasks: int = 5, chunk: int = 2) -> RunRecord:
    arrays = [str(40 + k) for k in range(-(-tasks // chunk))]
    return RunRecord(
        "big-1",
        "big",
        str(tmp_path),
        "slurm",
        job_id=arrays[0],
        array_size=tasks,
        tasks=[TaskRecord(i, str(tmp_path / "tasks" / str(i)), {}) for i in range(tasks)],
        array_job_ids=arrays,
        array_chunk=chunk,
    )


class Client:
    def __init__(self) -> None:
        self.asked: list[list[str]] = []
        self.cancelled: list[str] = []

    def cluster_name(self) -> str:  # cluster.Slurm: the state cache's key ("": none named)
        return ""

    def poll_states(self, ids: list[str]) -> dict[str, JobInfo]:
        self.asked.append(list(ids))
        return {f"{a}_{i}": JobInfo(f"{a}_{i}", "PENDING") for a in ids for i in range(2)}

    def cancel(self, ids: list[str], *, no_requeue: bool = False) -> None:
        assert no_requeue
        self.cancelled.extend(ids)


def test_task_ids_follow_the_arrays(tmp_path: Path) -> None:
    rec = _split(tmp_path)
    assert rec.slurm_job_ids() == ["40", "41", "42"]
    assert rec.job_ids() == ["40_0", "40_1", "41_0", "41_1", "42_0"]
    one = RunRecord("r", "r", str(tmp_path), "slurm", job_id="9", array_size=2, tasks=rec.tasks[:2])
    assert one.slurm_job_ids() == ["9"] and one.job_ids() == ["9_0", "9_1"]


def test_record_round_trips_and_old_records_still_load(tmp_path: Path) -> None:
    rec = _split(tmp_path)
    records.save_record(rec)
    assert records.load_record(tmp_path) == rec
    old = json.loads(rec.to_json())
    del old["array_chunk"], old["array_job_ids"]  # a run.json from before split sweeps
    loaded = RunRecord.from_dict(old)
    assert loaded.slurm_job_ids() == ["40"] and loaded.job_ids()[2] == "40_2"


def test_found_by_any_arrays_task_id(tmp_path: Path) -> None:
    rec = _split(tmp_path / "run")
    (tmp_path / "run").mkdir()
    records.save_record(rec)
    records.append_index(rec)
    for query in ("40", "41_1", "42_0", "big-1"):
        assert records.find_run(query).run_id == "big-1"


def test_states_ask_for_every_array_in_one_query(tmp_path: Path) -> None:
    client = Client()
    states = states_many([_split(tmp_path)], lambda: client, ttl_s=0)  # type: ignore[arg-type,return-value]
    assert len(client.asked) == 1 and sorted(client.asked[0]) == ["40", "41", "42"]
    assert sorted(states) == ["40_0", "40_1", "41_0", "41_1", "42_0"]


@pytest.mark.parametrize("only", [None, "41_1"])
def test_cancel_takes_every_array_last_first(tmp_path: Path, only: str | None) -> None:
    client = Client()
    done = cancel(_split(tmp_path), lambda: client, only)  # type: ignore[arg-type,return-value]
    # A later array waits (afterany) on the one before: cancelling that one first would start it.
    expected = ["42", "41", "40"] if only is None else [only]
    assert client.cancelled == done == expected
