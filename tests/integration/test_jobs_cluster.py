"""jobs on the real local Slurm cluster: submit, follow, status, logs, cancel, sweeps, preflight.

Needs ``python -m cluster up`` (the ``slurm_env`` fixture brings it up or skips) and train's
``train.cli.main``. Jobs are kept tiny (a few steps of tinycnn on synthetic data).
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.statecache import TTL_S

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "jobs"))
import env_probe
from slow_saves import slow_steps

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cifar.yaml"
SMALL = [
    "--set",
    "train.max_steps=4",
    "--set",
    "train.data.train_size=512",
    "--set",
    "train.data.test_size=64",
    "--set",
    "train.width=8",
    "--set",
    "train.batch_size=32",
    "--set",
    "resources.time=10",
]

pytestmark = pytest.mark.integration


def _paced(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a job that only has to be running while a test looks at it: each step sleeps
    0.2 s (tests/hooks), so that it does not take a core from the other tests for as long."""
    return {**env, **slow_steps(0.2)}


def jobs(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobs", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def scancel(env: dict[str, str], *job_ids: str) -> None:
    """Cleanup that sticks: train's guard would requeue a job that scancel's SIGTERM reaches."""
    for job_id in job_ids:
        subprocess.run(
            ["scontrol", "update", f"JobId={job_id}", "Requeue=0"],
            env=env,
            capture_output=True,
            timeout=30,
            check=False,
        )
    subprocess.run(["scancel", *job_ids], env=env, capture_output=True, timeout=30, check=False)


def status(env: dict[str, str], run: str) -> dict[str, object]:
    proc = jobs(env, "status", run, "--json")
    assert proc.returncode == 0, proc.stderr
    data: dict[str, object] = json.loads(proc.stdout)
    return data


def wait_state(env: dict[str, str], run: str, wanted: set[str], timeout: float = 300) -> list[str]:
    deadline = time.monotonic() + timeout
    states: list[str] = []
    while time.monotonic() < deadline:
        tasks = status(env, run)["tasks"]
        assert isinstance(tasks, list)
        states = [t["state"] for t in tasks]
        if states and all(s in wanted for s in states):
            return states
        time.sleep(2)
    raise AssertionError(f"{run}: states {states}, wanted {wanted}")


@pytest.mark.release_sensitive(
    "squeue's and sacct's outputs through jobs status, --follow and logs"
)
def test_example_follows_to_completed_with_status_and_logs(env: dict[str, str]) -> None:
    proc = jobs(env, "submit", str(EXAMPLE), *SMALL, "--follow", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    job_id = proc.stdout.splitlines()[0].strip()
    assert job_id.isdigit()
    assert "COMPLETED" in proc.stdout
    data = status(env, job_id)
    assert data["job_id"] == job_id
    tasks = data["tasks"]
    assert isinstance(tasks, list) and tasks[0]["state"] == "COMPLETED"
    assert "complete at step 4" in tasks[0]["history"]
    logs0 = jobs(env, "logs", job_id)
    assert logs0.returncode == 0 and logs0.stdout.strip()
    logs1 = jobs(env, "logs", job_id, "--rank", "1")
    assert logs1.returncode == 0 and logs1.stdout.strip()
    assert logs0.stdout != logs1.stdout
    text = jobs(env, "status", job_id)
    # n[1-2] usually; n3 (the spare node, n[1,3] or n[2-3]) when another job holds a node
    assert "COMPLETED" in text.stdout, text.stdout
    assert re.search(r"nodes n(\[\d[-,]\d\]|\d,n\d)", text.stdout), text.stdout
    listed = jobs(env, "list")
    assert job_id in listed.stdout


@pytest.mark.release_sensitive("a cancel's state spellings (CANCELLED by UID)")
def test_cancel_a_running_job(env: dict[str, str]) -> None:
    proc = jobs(_paced(env), "submit", str(EXAMPLE), *SMALL, "--set", "train.max_steps=100000")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    try:
        wait_state(env, job_id, {"RUNNING"})
        cancelled = jobs(env, "cancel", job_id)
        assert cancelled.returncode == 0, cancelled.stderr
        assert f"cancelled {job_id}" in cancelled.stdout
        assert wait_state(env, job_id, {"CANCELLED"}) == ["CANCELLED"]
        # train's guard sees scancel's SIGTERM and asks for a requeue: it must not bring the
        # job back.
        time.sleep(15)
        assert [t["state"] for t in status(env, job_id)["tasks"]] == ["CANCELLED"]  # type: ignore[union-attr]
        shown = subprocess.run(
            ["scontrol", "show", "job", job_id, "--oneliner"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
        assert "Restarts=0" in shown or not shown
    finally:
        scancel(env, job_id)


def test_status_right_after_cancel_shows_the_cancel(env: dict[str, str]) -> None:
    """Issue 45: `status` 2 s after `jobs cancel` showed RUNNING (a state cached from before the
    cancel); CANCELLED came ~6 s later. Right after the cancel: CANCELLING or CANCELLED."""
    proc = jobs(_paced(env), "submit", str(EXAMPLE), *SMALL, "--set", "train.max_steps=100000")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    try:
        wait_state(env, job_id, {"RUNNING"})
        status(env, job_id)  # a fresh RUNNING in the state cache, as a `watch jobs status` keeps
        cancelled = jobs(env, "cancel", job_id)
        assert cancelled.returncode == 0, cancelled.stderr
        tasks = status(env, job_id)["tasks"]
        assert isinstance(tasks, list)
        assert tasks[0]["state"] in ("CANCELLING", "CANCELLED"), tasks
        listed = jobs(env, "list").stdout
        line = next(ln for ln in listed.splitlines() if job_id in ln)
        assert "CANCELLING" in line or "CANCELLED" in line, listed
        assert wait_state(env, job_id, {"CANCELLED"}, timeout=120) == ["CANCELLED"]
    finally:
        scancel(env, job_id)


def test_sweep_of_four_is_one_array_job(env: dict[str, str], tmp_path: Path) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text(
        "name: sweep4\n"
        "resources: {partition: debug, nodes: 1, ntasks_per_node: 1, cpus_per_task: 1, time: 10}\n"
        "train:\n  model: tinycnn\n  width: 8\n  max_steps: 3\n  batch_size: 32\n"
        "  data: {kind: synthetic, train_size: 256, test_size: 32}\n"
        "sweep:\n  max_parallel: 2\n  grid:\n"
        "    train.optimizer.lr: [0.1, 0.05]\n    train.seed: [1, 2]\n"
    )
    proc = jobs(env, "submit", str(spec), "--json", "--follow", timeout=400)
    first = proc.stdout.splitlines()[0]
    sub = json.loads(first)
    try:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        base = sub["job_id"]
        assert sub["job_ids"] == [f"{base}_{i}" for i in range(4)]
        shown = subprocess.run(
            ["scontrol", "show", "job", f"{base}_0", "--oneliner"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert f"ArrayJobId={base}" in shown.stdout or shown.returncode != 0  # may be purged
        data = status(env, sub["run_id"])
        tasks = data["tasks"]
        assert isinstance(tasks, list)
        assert [t["state"] for t in tasks] == ["COMPLETED"] * 4
        assert [t["values"] for t in tasks] == [
            {"train.optimizer.lr": 0.1, "train.seed": 1},
            {"train.optimizer.lr": 0.1, "train.seed": 2},
            {"train.optimizer.lr": 0.05, "train.seed": 1},
            {"train.optimizer.lr": 0.05, "train.seed": 2},
        ]
        run_dir = Path(sub["run_dir"])
        resolved = (run_dir / "tasks" / "2" / "resolved.yaml").read_text()
        assert "lr: 0.05" in resolved and "seed: 1" in resolved
    finally:
        scancel(env, sub["job_id"])


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "resources.partition=nosuch",
            "--set resources.partition=nosuch: resources.partition: partition 'nosuch' does not "
            "exist on this cluster (available: ",
        ),
        (
            "resources.time=3-00:00:00",
            "--set resources.time=3-00:00:00: resources.time: 3-00:00:00 is over partition debug's "
            "MaxTime ",
        ),
    ],
)
def test_preflight_fails_before_sbatch(
    env: dict[str, str], tmp_path: Path, override: str, expected: str
) -> None:
    proc = jobs(env, "submit", str(EXAMPLE), "--set", override)
    assert proc.returncode == 2
    assert proc.stderr.startswith(expected), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # nothing written, nothing submitted
    assert jobs(env, "list").stdout == ""


def test_hostile_run_directory_is_quoted_for_sbatch(env: dict[str, str], tmp_path: Path) -> None:
    runs = tmp_path / "runs $(touch CANARY) `touch CANARY` it's"
    proc = jobs(
        env, "submit", str(EXAMPLE), *SMALL, "--runs-dir", str(runs), "--follow", timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert not list(tmp_path.rglob("CANARY")) and not (REPO / "CANARY").exists()
    run_dirs = list(runs.iterdir())
    assert len(run_dirs) == 1 and list((run_dirs[0] / "slurm").glob("*_0_log.out"))


def test_submit_from_a_folder_of_the_users_own_runs_ours(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Issue 42: the job's working directory (where it was submitted from) holds a train.py,
    jobs/, cluster.py and submitit.py of the user's own; every python line of the batch script
    (submitit's task, our after-step question) still runs this project's and submitit's code.
    Issue 45: submitit's lines once in a rank's log."""
    work = tmp_path / "project"
    (work / "jobs").mkdir(parents=True)
    for name in ("train.py", "cluster.py", "submitit.py", "jobs/__init__.py", "jobs/launch.py"):
        (work / name).write_text(f"raise SystemExit('SHADOWED by {name}')\n")
    runs = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "jobs", "submit", str(EXAMPLE), *SMALL,
         "--runs-dir", str(runs), "--follow"],
        cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "COMPLETED" in proc.stdout
    logs = sorted(next(runs.iterdir()).glob("slurm/*_log.out"))
    assert len(logs) == 2  # one per rank
    for log in logs:
        text = log.read_text(errors="replace")
        assert "SHADOWED" not in text, text[-2000:]
        assert text.count("Job completed successfully") == 1, text[-3000:]


def test_local_executor_runs_without_slurm(env: dict[str, str]) -> None:
    proc = jobs(env, "submit", str(EXAMPLE), *SMALL, "--executor", "local", "--follow", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    job_id = proc.stdout.splitlines()[0].strip()
    assert job_id.startswith("local-")
    data = status(env, job_id)
    tasks = data["tasks"]
    assert isinstance(tasks, list) and tasks[0]["state"] == "COMPLETED"
    assert jobs(env, "logs", job_id, "--rank", "1").stdout.strip()


def test_one_spec_sees_the_same_environment_on_both_executors(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Issue 45: the spec's ``environment`` (variables, setup exports, cd, umask) as the command
    saw it under the batch script on Slurm and under the local executor: the same."""
    work = tmp_path / "work dir"
    work.mkdir()
    spec = env_probe.write_spec(tmp_path, work)
    seen = {}
    for executor in ("slurm", "local"):
        proc = jobs(env, "submit", str(spec), "--executor", executor, "--follow", timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        job_id = proc.stdout.splitlines()[0].strip()
        run_dir = Path(str(status(env, job_id)["run_dir"]))
        seen[executor] = [env_probe.seen(run_dir, rank) for rank in (0, 1)]
    assert seen["slurm"] == seen["local"]
    assert seen["slurm"][0] == {**env_probe.EXPECTED, "pwd": str(work)}


@pytest.mark.release_sensitive("PREEMPTED and REQUEUED as status reads them")
def test_preemption_shows_in_status(env: dict[str, str]) -> None:
    """A higher-priority job preempts ours: train's guard (not submitit's) handles the signal,
    requeues, and `status` reads the history from events.jsonl."""
    proc = jobs(_paced(env), "submit", str(EXAMPLE), *SMALL, "--set", "train.max_steps=100000")
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    urgent = ""
    try:
        wait_state(env, job_id, {"RUNNING"})
        run_dir = Path(str(status(env, job_id)["run_dir"]))
        deadline = time.monotonic() + 120
        while '"start"' not in _read(run_dir / "events.jsonl"):  # the guard is installed
            assert time.monotonic() < deadline, "training never started"
            time.sleep(1)
        tasks = status(env, job_id)["tasks"]
        assert isinstance(tasks, list)
        node = subprocess.run(
            ["scontrol", "show", "hostnames", tasks[0]["nodelist"]],
            env=env, capture_output=True, text=True, timeout=30, check=True,
        ).stdout.split()[0]  # fmt: skip
        urgent = subprocess.run(
            [
                "sbatch",
                "--parsable",
                "-p",
                "urgent",
                "-w",
                node,
                "-N1",
                "-c2",
                "--time=1",
                "--output=/dev/null",
                "--wrap",
                "sleep 1",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
        deadline = time.monotonic() + 120
        history = ""
        while "preempted 1x" not in history:
            assert time.monotonic() < deadline, f"no preemption recorded: {history!r}"
            time.sleep(2)
            tasks = status(env, job_id)["tasks"]
            assert isinstance(tasks, list)
            history = tasks[0]["history"]
        assert "resumed" not in history  # requeued, waiting (BeginTime), not released here
        log = _read(run_dir / "slurm" / f"{job_id}_0_log.out")
        assert "Job not requeued" not in log  # submitit did not act on the signal
    finally:
        scancel(env, job_id, *([urgent] if urgent else []))


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


# -- a good citizen: Slurm commands counted through a shim on PATH (issue 18) ----------------------
SHIM = """#!/bin/sh
[ -n "$SLURM_JOB_ID" ] && where=job || where=cli
echo "$(date +%s.%N) $where ${{0##*/}} $*" >> "$SHIM_LOG"
exec {real} "$@"
"""


def shimmed(env: dict[str, str], tmp_path: Path) -> tuple[dict[str, str], Path]:
    """``env`` with a directory of logging squeue/sacct/scontrol/sbatch/scancel first on PATH."""
    import shutil

    bin_dir = tmp_path / "shim"
    bin_dir.mkdir()
    for name in ("squeue", "sacct", "scontrol", "sbatch", "scancel", "sinfo"):
        real = shutil.which(name, path=env.get("PATH"))
        assert real, name
        (bin_dir / name).write_text(SHIM.format(real=real))
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "slurm-calls.log"
    return {**env, "PATH": f"{bin_dir}:{env['PATH']}", "SHIM_LOG": str(log)}, log


def calls(log: Path, since: float = 0.0) -> list[tuple[float, str]]:
    """(time, command) of the calls the jobs CLI made (not train inside the job)."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        t, where, name = line.split()[:3]
        if where == "cli" and float(t) >= since:
            out.append((float(t), name))
    return out


def test_following_and_status_ask_slurm_rarely(env: dict[str, str], tmp_path: Path) -> None:
    env, log = shimmed(env, tmp_path)
    proc = jobs(env, "submit", str(EXAMPLE), *SMALL, "--follow", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    job_id = proc.stdout.splitlines()[0].strip()
    submitted = max(t for t, c in calls(log) if c == "sbatch")  # then following starts
    follow_calls = [(t, c) for t, c in calls(log, submitted) if c != "sbatch"]
    polls = [t for t, c in follow_calls if c in ("squeue", "sacct")]
    first, last = min(polls), max(polls)
    # One command per poll, polls >= ~3 s apart (a 1-second poller made 2 per second).
    assert len(follow_calls) <= 3 + (last - first) / 2.5, follow_calls
    gaps = [b - a for a, b in itertools.pairwise(polls)]
    # Closer polls only "at once" on news in the files: the log appearing, start, complete.
    assert sum(1 for g in gaps if g < 2.5) <= 3, gaps
    # The output a person reads: no raw JSON, nothing of submitit's twice, state last.
    out = proc.stdout
    assert '{"' not in out and "Job completed successfully" not in out
    assert out.rstrip().splitlines()[-1].endswith(f"job {job_id}: COMPLETED")
    assert ">> complete at step 4" in out
    # status and list over every run: one Slurm query in all, then the shared cache.
    time.sleep(6)  # past the cache's lifetime
    mark = time.time()
    for _ in range(3):
        assert jobs(env, "status").returncode == 0
    listed = jobs(env, "list")
    assert listed.returncode == 0 and "COMPLETED" in listed.stdout
    # one query per lifetime of the shared cache (5 s): four commands on a loaded machine may
    # outlast one (seen: the fourth 5.6 s after the first, at a load of 20 on 2 cores)
    windows = 1 + int((time.time() - mark) // TTL_S)
    assert len(calls(log, mark)) <= windows, calls(log, mark)


@pytest.mark.release_sensitive("one squeue/sacct for many jobs, in the release's output")
def test_status_and_list_of_many_runs_is_one_query(env: dict[str, str], tmp_path: Path) -> None:
    env, log = shimmed(env, tmp_path)
    ids = []
    try:
        for _ in range(3):
            proc = jobs(
                _paced(env), "submit", str(EXAMPLE), *SMALL, "--set", "train.max_steps=100000"
            )
            assert proc.returncode == 0, proc.stderr
            ids.append(proc.stdout.strip())
        time.sleep(6)
        mark = time.time()
        status_all = jobs(env, "status", "--json")
        assert status_all.returncode == 0, status_all.stderr
        assert len(json.loads(status_all.stdout)) == 3
        assert [c for _, c in calls(log, mark)] == ["squeue"]  # one query for three runs
        listed = jobs(env, "list")
        assert all(i in listed.stdout for i in ids)
        assert len(calls(log, mark)) == 1  # list within the cache's lifetime: none
    finally:
        scancel(env, *ids)


@pytest.mark.long(89)
def test_follow_shows_a_preemption_and_the_resume_as_lines(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Issue 19: interruptions and resumes are readable lines, in time order, the state last."""
    cmd = [sys.executable, "-m", "jobs", "submit", str(EXAMPLE), *SMALL]
    cmd += ["--set", "train.max_steps=400", "--set", "train.checkpoint.interval_steps=5000"]
    # each step sleeps 0.1 s until the requeue is recorded (40 s of training to preempt, without
    # a core spent on it); the rest of the run goes at full speed
    pace = tmp_path / "pace"
    job_env = {**env, **slow_steps(0.1, pace)}
    follower = subprocess.Popen(
        [*cmd, "--follow"], cwd=REPO, env=job_env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    job_id = ""
    urgent = ""
    try:
        assert follower.stdout is not None
        job_id = follower.stdout.readline().strip()
        assert job_id.isdigit(), job_id
        wait_state(env, job_id, {"RUNNING"})
        run_dir = Path(str(status(env, job_id)["run_dir"]))
        deadline = time.monotonic() + 120
        while '"start"' not in _read(run_dir / "events.jsonl"):
            assert time.monotonic() < deadline, "training never started"
            time.sleep(1)
        # Preempt it where it runs (the cluster has a spare node n3 when n1/n2 are busy).
        tasks = status(env, job_id)["tasks"]
        assert isinstance(tasks, list)
        node = subprocess.run(
            ["scontrol", "show", "hostnames", tasks[0]["nodelist"]],
            env=env, capture_output=True, text=True, timeout=30, check=True,
        ).stdout.split()[0]  # fmt: skip
        urgent = subprocess.run(
            ["sbatch", "--parsable", "-p", "urgent", "-w", node, "-N1", "-c2", "--time=1",
             "--output=/dev/null", "--wrap", "sleep 1"],
            env=env, capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip()  # fmt: skip
        deadline = time.monotonic() + 180
        while '"requeue"' not in _read(run_dir / "events.jsonl"):
            assert time.monotonic() < deadline, "no requeue recorded"
            time.sleep(2)
        pace.unlink()
        # held in BeginTime (PENDING): released here; or back already where the release does not
        # hold it (26.05's local cluster: requeue_delay), its resume recorded
        deadline = time.monotonic() + 120
        while '"resume"' not in _read(run_dir / "events.jsonl"):
            tasks = status(env, job_id)["tasks"]
            assert isinstance(tasks, list)
            states = [t["state"] for t in tasks]
            if states and all(s == "PENDING" for s in states):
                subprocess.run(
                    ["scontrol", "update", f"JobId={job_id}", "StartTime=now"],
                    env=env, capture_output=True, timeout=30, check=False,
                )  # fmt: skip
                break
            assert time.monotonic() < deadline, f"{job_id}: neither held nor back: {states}"
            time.sleep(1)
        out, err = follower.communicate(timeout=400)
    finally:
        if follower.poll() is None:
            follower.kill()
        scancel(env, *[j for j in (job_id, urgent) if j])
    assert follower.returncode == 0, out[-3000:] + err[-2000:]
    lines = out.splitlines()

    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    assert re.search(r">> preempted at step \d+, checkpoint step-\d+", out), out[-3000:]
    step = re.search(r">> preempted at step (\d+)", out).group(1)  # type: ignore[union-attr]
    assert f">> resumed at step {step} (restart 1)" in out
    assert first(">> started") < first(">> preempted") < first(">> requeued")
    assert first(">> requeued") < first(">> resumed") < first(">> complete")
    assert lines[-1].endswith(f"job {job_id}: COMPLETED") and '{"' not in out
