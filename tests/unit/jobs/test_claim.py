"""A run directory belongs to one run from the moment it is claimed (issue 29).

``jobs submit`` runs for real against stub Slurm commands (sbatch from conftest; squeue and
sacct here answer from files the test writes): a second submission naming a live run's
directory exits 2 in one line and leaves every file of the first run as it was.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jobs.claim import OWNER, claim
from jobs.cli import main
from jobs.errors import RunDirBusyError
from jobs.pids import ProcHandle
from jobs.records import Plan, RunRecord, TaskRecord, load_record, save_record

SQUEUE = """#!/bin/sh
echo "squeue $*" >> "$STUB_DIR/queries.log"
if [ -f "$STUB_DIR/squeue-fails" ]; then
  echo 'squeue: error: Unable to contact slurm controller' >&2; exit 1
fi
if [ -s "$STUB_DIR/squeue.txt" ]; then cat "$STUB_DIR/squeue.txt"; exit 0; fi
echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1
"""
SACCT = """#!/bin/sh
echo "sacct $*" >> "$STUB_DIR/queries.log"
cat "$STUB_DIR/sacct.txt" 2>/dev/null
exit 0
"""
FILES = ("spec.yaml", "resolved.yaml", "run.json", "sbatch.sh")


@pytest.fixture
def slurm(stub_slurm: Path) -> Path:
    for name, text in (("squeue", SQUEUE), ("sacct", SACCT)):
        (stub_slurm / name).write_text(text)
        (stub_slurm / name).chmod(0o755)
    return stub_slurm


def _spec(tmp_path: Path, run_dir: Path, seed: int = 1) -> Path:
    spec = tmp_path / f"spec-{seed}.yaml"
    spec.write_text(f"name: demo\ntrain:\n  run_dir: {run_dir}\n  seed: {seed}\n")
    return spec


def _submit(spec: Path, *extra: str) -> int:
    return main(["submit", str(spec), "--executor", "slurm", "--no-preflight", *extra])


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {n: (run_dir / n).read_bytes() for n in FILES if (run_dir / n).exists()}


def _running(slurm: Path, job_id: str) -> None:
    (slurm / "squeue.txt").write_text(f"{job_id}|demo|RUNNING|None|n1|debug|0:05|0|0|\n")


def test_a_live_runs_directory_is_refused_before_anything_is_written(
    tmp_path: Path, slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "shared-run"
    assert _submit(_spec(tmp_path, run_dir, seed=1)) == 0
    first = load_record(run_dir)
    before = _snapshot(run_dir)
    assert set(before) == set(FILES)
    _running(slurm, first.job_id)
    capsys.readouterr()
    for executor in ("slurm", "local"):
        spec = _spec(tmp_path, run_dir, seed=2)
        code = main(["submit", str(spec), "--executor", executor, "--no-preflight"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert f"{run_dir}: belongs to run {first.run_id}" in err
        assert f"job {first.job_id} is RUNNING" in err
        assert _snapshot(run_dir) == before  # not one byte of the first run changed
    assert len(list(slurm.glob("submitted-*.sh"))) == 1  # and nothing was submitted
    # one Slurm query per refusal, for the first run's job only
    queries = (slurm / "queries.log").read_text().splitlines()
    assert len(queries) == 2 and all("-j 4242" in q for q in queries)
    # The first run is over: its directory is the next submission's (resuming in place).
    (slurm / "squeue.txt").unlink()
    (slurm / "sacct.txt").write_text("4242|demo|COMPLETED|0:0|00:00:07|n1|debug|None\n")
    assert _submit(_spec(tmp_path, run_dir, seed=3)) == 0
    assert load_record(run_dir).run_id != first.run_id
    assert "seed: 3" in (run_dir / "resolved.yaml").read_text()


def test_a_sweeps_task_directory_is_refused_while_the_sweep_runs(
    tmp_path: Path, slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("name: demo\ntrain: {}\nsweep:\n  grid:\n    train.seed: [1, 2]\n")
    assert _submit(sweep, "--runs-dir", str(tmp_path / "runs")) == 0
    record = next(load_record(p.parent) for p in (tmp_path / "runs").glob("*/run.json"))
    (slurm / "squeue.txt").write_text("4242_0|demo|RUNNING|None|n1|debug|0:05|0|0|\n")
    task_dir = Path(record.tasks[0].run_dir)
    capsys.readouterr()
    assert _submit(_spec(tmp_path, task_dir)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"inside {record.run_dir}" in err
    assert not (task_dir / "resolved.yaml").exists()


def test_when_slurm_cannot_say_the_directory_is_refused(
    tmp_path: Path, slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    assert _submit(_spec(tmp_path, run_dir)) == 0
    (slurm / "squeue-fails").touch()
    capsys.readouterr()
    assert _submit(_spec(tmp_path, run_dir, seed=2)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot say whether it is over" in err


def test_a_live_local_run_keeps_its_directory(tmp_path: Path, slurm: Path) -> None:
    run_dir = tmp_path / "local"
    run_dir.mkdir()
    # Stands in for the local supervisor: its command line names jobs.localrun and the run dir.
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "jobs.localrun", str(run_dir)]
    )
    try:
        record = RunRecord(
            "loc-1", "demo", str(run_dir), "local", job_id=f"local-{proc.pid}", pid=proc.pid,
            submitted_at=time.time() - 5, tasks=[TaskRecord(0, str(run_dir))],
        )  # fmt: skip
        save_record(record)
        plan = Plan("new-1", run_dir, explicit=True)
        with pytest.raises(RunDirBusyError, match="local supervisor"):
            claim(plan, _no_slurm)
    finally:
        proc.kill()
        proc.wait()
    assert claim(plan, _no_slurm) == plan  # the supervisor is gone: the run is over
    assert json.loads((run_dir / OWNER).read_text())["run_id"] == "new-1"


def _no_slurm() -> object:
    raise AssertionError("a local run's liveness needs no Slurm")


def test_a_claim_whose_submitter_died_is_stale(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)
    handle = ProcHandle.of(dead.pid)
    assert handle is not None
    dead.communicate(b"\n")  # it ends: its claim is stale
    owner = {"run_id": "crashed-1", "submitter": handle.to_json()}
    owner.update(host=os.uname().nodename, time=time.time())
    (run_dir / OWNER).write_text(json.dumps(owner))
    assert claim(Plan("new-1", run_dir, explicit=True), _no_slurm).run_id == "new-1"
    # ... while a live submitter's claim (no run.json yet) holds the directory
    with pytest.raises(RunDirBusyError, match=r"belongs to run new-1, .*in progress"):
        claim(Plan("new-2", run_dir, explicit=True), _no_slurm)


def _race(run_dir: str, run_id: str, start: object, done: object, results: object) -> None:
    start.wait()  # type: ignore[attr-defined]
    try:
        claim(Plan(run_id, Path(run_dir), explicit=True), _no_slurm)
        results.put((run_id, "won"))  # type: ignore[attr-defined]
    except RunDirBusyError:
        results.put((run_id, "refused"))  # type: ignore[attr-defined]
    done.wait()  # type: ignore[attr-defined]  # the winner stays alive: its claim is live


def test_of_racing_submissions_exactly_one_wins(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    start, done, results = ctx.Barrier(6), ctx.Event(), ctx.Queue()
    run_dir = tmp_path / "contested"
    procs = [
        ctx.Process(target=_race, args=(str(run_dir), f"r{i}", start, done, results))
        for i in range(6)
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=60) for _ in procs]
    done.set()
    for p in procs:
        p.join(60)
    winners = [r for r, what in outcomes if what == "won"]
    assert len(winners) == 1
    assert json.loads((run_dir / OWNER).read_text())["run_id"] == winners[0]


# -- a claim holds whatever state the records are in (issue 44.11) --------------------------------
# A second submission took the directory of a run still training (its run.json damaged) and
# overwrote its resolved.yaml. Each case plants damaged records beside a live run.
def _damage_record(run_dir: Path) -> None:
    (run_dir / "run.json").write_bytes(b'{"run_id": "x", "executor": \xff torn')


def _refused(
    tmp_path: Path, run_dir: Path, capsys: pytest.CaptureFixture[str], *needles: str
) -> None:
    before = _snapshot(run_dir)
    capsys.readouterr()
    assert _submit(_spec(tmp_path, run_dir, seed=9)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{run_dir}: belongs to run " in err and "choose another train.run_dir" in err
    for needle in needles:
        assert needle in err, err
    assert _snapshot(run_dir) == before  # not one byte of the live run changed


def _quiet(run_dir: Path, age_s: float = 3600) -> None:
    """Every file under ``run_dir`` last written ``age_s`` ago, and its claim's submitter gone
    (here the submission ran inside this test's process, which lives on)."""
    owner = json.loads((run_dir / OWNER).read_text()) if (run_dir / OWNER).exists() else None
    if owner is not None and owner.get("submitter") is not None:
        owner.update(submitter=None, host="gone", time=0)
        (run_dir / OWNER).write_text(json.dumps(owner))
    old = time.time() - age_s
    for path in [run_dir, *run_dir.rglob("*")]:
        os.utime(path, (old, old), follow_symlinks=False)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(_damage_record, id="torn"),
        pytest.param(lambda d: (d / "run.json").write_text("[1, 2]"), id="not_a_record"),
        pytest.param(lambda d: (d / "run.json").unlink(), id="missing"),
    ],
)
def test_a_damaged_record_of_a_live_slurm_run_keeps_its_directory(
    tmp_path: Path, slurm: Path, capsys: pytest.CaptureFixture[str], damage: Any
) -> None:
    run_dir = tmp_path / "run"
    assert _submit(_spec(tmp_path, run_dir)) == 0
    first = load_record(run_dir)
    _running(slurm, first.job_id)
    damage(run_dir)
    _quiet(run_dir)  # only Slurm knows it lives (the index names its job)
    _refused(tmp_path, run_dir, capsys, f"job {first.job_id} is RUNNING", f"scancel {first.job_id}")


def test_a_damaged_record_and_no_index_line_beside_a_run_that_writes(
    tmp_path: Path, slurm: Path, capsys: pytest.CaptureFixture[str], isolated_state: Path
) -> None:
    run_dir = tmp_path / "run"
    assert _submit(_spec(tmp_path, run_dir)) == 0
    _damage_record(run_dir)
    (isolated_state / "runs.jsonl").unlink()  # no index line either: Slurm is never asked
    _quiet(run_dir)
    (run_dir / "logs").mkdir(exist_ok=True)
    (run_dir / "logs" / "rank-0.log").write_text("step 120 loss 0.3\n")  # it trains
    _refused(tmp_path, run_dir, capsys, "run.json is damaged", "logs/rank-0.log was written")
    assert not (slurm / "queries.log").exists()
    # Quiet for RECENT_S and nothing else lives: the directory is the next submission's.
    _quiet(run_dir)
    assert _submit(_spec(tmp_path, run_dir, seed=3)) == 0
    assert "seed: 3" in (run_dir / "resolved.yaml").read_text()


def test_a_foreign_record_beside_a_live_run(
    tmp_path: Path, slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """run.json copied from another directory names a job that is over; this directory's own
    job (the index's) runs."""
    run_dir = tmp_path / "run"
    assert _submit(_spec(tmp_path, run_dir)) == 0
    first = load_record(run_dir)
    _running(slurm, first.job_id)
    (slurm / "sacct.txt").write_text("77|demo|COMPLETED|0:0|00:00:07|n1|debug|None\n")
    foreign = RunRecord("other-1", "demo", str(tmp_path / "elsewhere"), "slurm", job_id="77")
    (run_dir / "run.json").write_text(foreign.to_json())
    _quiet(run_dir)
    _refused(tmp_path, run_dir, capsys, "record of another directory", "is RUNNING")


def test_a_stale_record_beside_the_claim_of_a_newer_run_that_writes(
    tmp_path: Path, slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """run.json is an earlier run's (over); the claim is a newer run's whose submitter is gone
    and whose own record never landed, and which trains."""
    run_dir = tmp_path / "run"
    assert _submit(_spec(tmp_path, run_dir)) == 0
    (slurm / "sacct.txt").write_text("4242|demo|COMPLETED|0:0|00:00:07|n1|debug|None\n")
    owner = {"run_id": "newer-1", "submitter": None, "host": "gone", "time": 0}
    (run_dir / OWNER).write_text(json.dumps(owner))
    _quiet(run_dir)
    (run_dir / "events.jsonl").write_text('{"event": "start", "time": 1}\n')
    _refused(tmp_path, run_dir, capsys, "claim is run newer-1's", "events.jsonl was written")


def test_a_damaged_record_of_a_live_local_run_keeps_its_directory(
    tmp_path: Path, slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "local"
    run_dir.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "jobs.localrun", str(run_dir)]
    )
    try:
        _damage_record(run_dir)
        _quiet(run_dir)
        _refused(tmp_path, run_dir, capsys, f"process {proc.pid}", f"kill {proc.pid}")
    finally:
        proc.kill()
        proc.wait()


def test_a_damaged_record_when_slurm_cannot_say(
    tmp_path: Path, slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    assert _submit(_spec(tmp_path, run_dir)) == 0
    _damage_record(run_dir)
    _quiet(run_dir)
    (slurm / "squeue-fails").touch()
    _refused(tmp_path, run_dir, capsys, "Slurm cannot say whether job 4242 is over")
