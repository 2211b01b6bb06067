"""Each sbatch template submitted with plain ``sbatch`` to the local cluster, running real training.

The way a user would: ``sbatch [options] sbatch_templates/NAME.sbatch SPEC.yaml [--set ...]`` from
the checkout (so PROJECT_DIR and PYTHON come from the template's defaults). Training is kept tiny
(tinycnn, a few hundred synthetic images, a handful of steps, one thread per rank): the machine
has two cores shared by everyone. The "GPUs" are the cluster's dummy gres; CUDA is not available,
so every spec sets ``train.allow_cpu_fallback`` and the runs train on CPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from releases import preemption_requeue_via
from slow_saves import slow_saves

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "sbatch_templates"

SPEC = """\
name: tpl-it
train:
  model: tinycnn
  width: 4
  data: {{kind: synthetic, train_size: 256, test_size: 32, augment: false}}
  optimizer: {{schedule: constant, lr: 0.05}}
  batch_size: 16
  max_steps: {max_steps}
  checkpoint: {{interval_steps: {interval}, keep_last: 2}}
  allow_cpu_fallback: true
  num_threads: 1
  log_interval: 1
requeue: {{signal_delay_s: 30}}
"""


class Jobs:
    """Submits templates with plain sbatch; cancels whatever is still queued at the end."""

    def __init__(self, env: dict[str, str], client: Any, tmp: Path) -> None:
        self.env = env
        self.client = client
        self.tmp = tmp
        self.ids: list[str] = []

    def sbatch(
        self,
        template: str,
        options: list[str],
        script_args: list[str],
        env: dict[str, str] | None = None,
    ) -> str:
        # --output on the command line overrides the template's #SBATCH line (logs stay in tmp).
        out = "slurm-%x-%A_%a.out" if any(o.startswith("--array") for o in options) else None
        cmd = [
            "sbatch",
            "--parsable",
            f"--output={self.tmp / (out or 'slurm-%x-%j.out')}",
            *options,
            str(TEMPLATES / f"{template}.sbatch"),
            *script_args,
        ]
        proc = subprocess.run(
            cmd,
            cwd=REPO,  # submitted from the checkout, as the README says
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        job_id = proc.stdout.strip().split(";")[0]
        self.ids.append(job_id)
        return job_id

    def wait(self, job_id: str, states: set[str], timeout: float = 240) -> Any:
        """Poll until the job (every task of an array) is in one of ``states``.

        The cluster is shared: another test's job in ``urgent`` may preempt ours at any time.
        Ours then come back PENDING (BeginTime, ~2 min); release them so the wait stays short.
        """
        deadline = time.monotonic() + timeout
        infos: dict[str, Any] = {}
        while time.monotonic() < deadline:
            infos = self.client.job_states([job_id])
            mine = [i for k, i in infos.items() if k == job_id or k.startswith(f"{job_id}_")]
            if mine and all(i.state in states for i in mine):
                return mine[0] if len(mine) == 1 else mine
            for info in mine:
                if info.state in ("PENDING", "REQUEUED") and self._begin_time(info.job_id):
                    self.client.release(info.job_id)
            done = [i for i in mine if i.terminal and i.state not in states]
            if done:
                pytest.fail(f"job {job_id} ended {done[0].state}:\n{self.logs()}")
            time.sleep(1.0)
        pytest.fail(f"job {job_id} not in {states} after {timeout}s ({infos}):\n{self.logs()}")

    def _begin_time(self, job_id: str) -> bool:
        try:
            return self.client.show_job(job_id).get("Reason") == "BeginTime"
        except Exception:  # gone from the controller meanwhile
            return False

    def logs(self) -> str:
        parts = []
        for path in sorted(self.tmp.rglob("*.out")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def cancel_all(self) -> None:
        live = [
            k
            for k, info in self.client.job_states(self.ids).items()
            if not info.terminal and k.split("_")[0] in self.ids
        ]
        if live:
            self.client.cancel(sorted({k.split("_")[0] for k in live}))


@pytest.fixture
def jobs(slurm_env: dict[str, str], slurm_client: Any, tmp_path: Path) -> Iterator[Jobs]:
    # the runs the templates register go to this test's own index and runs folder
    own = {
        "SLURM_TRAIN_STATE_DIR": str(tmp_path / "state"),
        "SLURM_TRAIN_RUNS_DIR": str(tmp_path / "runs"),
    }
    j = Jobs({**slurm_env, **own}, slurm_client, tmp_path)
    try:
        yield j
    finally:
        j.cancel_all()


def _spec(tmp: Path, max_steps: int, interval: int) -> Path:
    path = tmp / "spec.yaml"
    path.write_text(SPEC.format(max_steps=max_steps, interval=interval))
    return path


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _kinds(run_dir: Path) -> list[str]:
    return [e["event"] for e in _events(run_dir)]


def _checkpoints(run_dir: Path) -> list[Path]:
    root = run_dir / "checkpoints"
    found = root.glob("step-*") if root.is_dir() else iter(())
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


@pytest.mark.timeout(120)
def test_an_early_exit_leaves_its_lines_where_sbatch_ran_not_in_the_nodes_tmp(
    jobs: Jobs, tmp_path: Path
) -> None:
    """With the template's own --output (the batch node's /tmp, private to each host here as on
    a real cluster), a script that exits before its run directory is known (no spec: a usage
    error) leaves its lines in slurm-JOBID.out where sbatch ran, and nothing in the node's /tmp."""
    submit_dir = tmp_path / "submit"  # under the tests' shared folder: every host sees it
    submit_dir.mkdir()
    proc = subprocess.run(
        ["sbatch", "--parsable", "-N1", "--time=2", str(TEMPLATES / "ddp.sbatch")],
        cwd=submit_dir, env=jobs.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    jobs.ids.append(job)
    info = jobs.wait(job, {"FAILED", "COMPLETED"}, timeout=90)
    assert info.state == "FAILED"
    kept = submit_dir / f"slurm-{job}.out"
    deadline = time.monotonic() + 30  # the batch step's exit may reach Slurm before the file
    while not kept.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "usage:" in kept.read_text()
    # every host's own /tmp (net hosts: STATE/hosts/HOST/tmp on the machine), and the machine's
    state = Path(jobs.env["SLURM_TRAIN_CLUSTER_DIR"])
    tmps = [Path("/tmp"), *(state / "hosts").glob("*/tmp")]
    assert not [p for t in tmps for p in t.glob(f"slurm-train-*-{job}.out")]


@pytest.mark.timeout(300)
def test_ddp_template_two_nodes(jobs: Jobs, tmp_path: Path) -> None:
    spec = _spec(tmp_path, max_steps=4, interval=2)
    run_dir = tmp_path / "run-ddp"
    job = jobs.sbatch(
        "ddp",
        ["-N2", "--ntasks-per-node=1", "--gres=gpu:1", "-c1", "--time=10"],
        [str(spec), "--set", "train.seed=3"],
        env={"RUN_DIR": str(run_dir)},
    )
    jobs.wait(job, {"COMPLETED"})
    # One log per rank in RUN_DIR/slurm, where `jobs logs` reads them (JOBID_RANK_log.out).
    logs = sorted(p.name for p in (run_dir / "slurm").glob("*_log.out"))
    assert logs == [f"{job}_0_log.out", f"{job}_1_log.out"], logs
    record = json.loads((run_dir / "run.json").read_text())  # registered (issue 45)
    assert (record["job_id"], record["run_id"]) == (job, f"tpl-it-job{job}"), record
    assert "complete" in _kinds(run_dir), jobs.logs()
    assert _checkpoints(run_dir), "no checkpoint written"
    manifest = json.loads((_checkpoints(run_dir)[-1] / "manifest.json").read_text())
    assert manifest["world_size"] == 2


@pytest.mark.timeout(300)
def test_dataparallel_template_checkpoint_loads_into_bare_model(jobs: Jobs, tmp_path: Path) -> None:
    """--gres=gpu:2 -n1: one task that would drive both GPUs; CUDA is absent here so it runs on
    CPU (allow_cpu_fallback). Its checkpoint must load into a plain, unwrapped model."""
    spec = _spec(tmp_path, max_steps=4, interval=2)
    run_dir = tmp_path / "run-dp"
    job = jobs.sbatch(
        "dataparallel",
        ["--gres=gpu:2", "-n1", "-c1", "--time=10"],
        [str(spec)],
        env={"RUN_DIR": str(run_dir)},
    )
    jobs.wait(job, {"COMPLETED"})
    assert "complete" in _kinds(run_dir), jobs.logs()
    batch_log = next(tmp_path.glob(f"slurm-*-{job}.out")).read_text()
    assert "gpus=2" in batch_log
    # One task saw both (dummy) GPUs and said that it falls back to the CPU.
    rank_log = (run_dir / "slurm" / f"{job}_0_log.out").read_text()
    assert "tinycnn/dp on cpu" in rank_log, rank_log

    import torch

    from train.loop.models import build_model

    latest = _checkpoints(run_dir)[-1]
    shared = torch.load(latest / "shared.pt", map_location="cpu", weights_only=True)
    state = shared["model"]
    assert not any(k.startswith("module.") for k in state), "DataParallel prefix leaked"
    model = build_model("tinycnn", width=4)
    model.load_state_dict(state)  # strict: every key matches a bare model


def _preempt_and_resume(
    jobs: Jobs, tmp: Path, template: str, env: dict[str, str], client: Any
) -> tuple[str, str, Path]:
    """Start ``template`` on one node, preempt it once training has checkpointed, release the
    requeued job and wait for it to complete; returns (job id, batch log, run dir)."""
    # Slow each step down with a checkpoint delay (sleeping, not burning the shared CPUs), so
    # that the preemption lands in the middle of training.
    spec = _spec(tmp, max_steps=24, interval=1)
    run_dir = tmp / f"run-{template}"
    job = jobs.sbatch(
        template,
        ["-N1", "--ntasks-per-node=1", "--gres=gpu:1", "-c1", "--time=10"],
        [str(spec)],
        env={"RUN_DIR": str(run_dir), **slow_saves(0.4), **env},
    )
    info = jobs.wait(job, {"RUNNING"}, timeout=120)
    deadline = time.monotonic() + 120
    while not _checkpoints(run_dir):
        assert time.monotonic() < deadline, f"no checkpoint yet:\n{jobs.logs()}"
        time.sleep(0.5)
    node = client.show_job(job).get("NodeList") or info.nodelist
    # Preempt only the node this job runs on: a higher-priority job that wants all of it.
    out = str(tmp / "urgent-%j.out")
    cmd = ["sbatch", "--parsable", "-p", "urgent", "-w", node, "--exclusive", "-t", "1"]
    urgent = subprocess.run(
        [*cmd, "-o", out, "--wrap", "sleep 5"],
        env=jobs.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert urgent.returncode == 0, urgent.stderr
    jobs.ids.append(urgent.stdout.strip().split(";")[0])
    # The job comes back PENDING (BeginTime) with the same id and Restarts=1.
    deadline = time.monotonic() + 120
    while True:
        shown = client.show_job(job)
        if int(shown.get("Restarts", "0")) >= 1 and shown.get("JobState") == "PENDING":
            break
        assert time.monotonic() < deadline, f"not requeued: {shown}\n{jobs.logs()}"
        time.sleep(1.0)
    client.release(job)
    jobs.wait(job, {"COMPLETED"}, timeout=240)

    batch_log = next(tmp.glob(f"slurm-*-{job}.out")).read_text()
    assert "restart_count=1" in batch_log, batch_log
    kinds = _kinds(run_dir)
    assert "requeue" in kinds and "resume" in kinds and kinds[-1] == "complete", kinds
    resume = next(e for e in _events(run_dir) if e["event"] == "resume")
    assert resume["restart_count"] == 1 and resume["step"] > 0, resume
    return job, batch_log, run_dir


@pytest.mark.release_sensitive("a template's exported release and its own requeue on a preemption")
@pytest.mark.timeout(420)
def test_requeue_template_survives_preemption(
    jobs: Jobs, tmp_path: Path, slurm_client: Any
) -> None:
    """The step runs as in a container without scontrol (PATH without Slurm), so train answers
    the forwarded USR2 with a checkpoint and exit 75, and the batch script requeues the job."""
    nobin = tmp_path / "container-bin"
    nobin.mkdir()
    env = {"SRUN_PREFIX": f"/usr/bin/env PATH={nobin}"}
    job, batch_log, run_dir = _preempt_and_resume(jobs, tmp_path, "requeue", env, slurm_client)
    assert "got SIGUSR2: forwarding it to the training step" in batch_log, batch_log
    assert f"exited 75: scontrol requeue {job}" in batch_log, batch_log
    # what happened (issue 44): the rank's requeue failed, the batch script's was taken
    refused = next(e for e in _events(run_dir) if e["event"] == "requeue_failed")
    assert refused.get("by") == "rank", refused
    requeue = next(e for e in _events(run_dir) if e["event"] == "requeue")
    assert requeue.get("via") == "batch_script", requeue


@pytest.mark.timeout(300)
def test_requeue_template_scancel_stays_cancelled(
    jobs: Jobs, tmp_path: Path, slurm_client: Any
) -> None:
    """A plain scancel sends TERM to the batch shell and the step: in the container set-up the
    step answers 75, and the batch script must still not requeue a cancelled job."""
    nobin = tmp_path / "container-bin"
    nobin.mkdir()
    spec = _spec(tmp_path, max_steps=200, interval=1)
    run_dir = tmp_path / "run-cancel"
    env = {"SRUN_PREFIX": f"/usr/bin/env PATH={nobin}", "RUN_DIR": str(run_dir)}
    env.update(slow_saves(0.4))
    job = jobs.sbatch(
        "requeue",
        ["-N1", "--ntasks-per-node=1", "--gres=gpu:1", "-c1", "--time=10"],
        [str(spec)],
        env=env,
    )
    jobs.wait(job, {"RUNNING"}, timeout=120)
    deadline = time.monotonic() + 120
    while not _checkpoints(run_dir):
        assert time.monotonic() < deadline, f"no checkpoint yet:\n{jobs.logs()}"
        time.sleep(0.5)
    slurm_client.cancel([job])
    jobs.wait(job, {"CANCELLED"}, timeout=120)
    time.sleep(5)  # a wrongful requeue would show up as PENDING with Restarts=1 by now
    shown = slurm_client.show_job(job)
    assert shown.get("JobState") == "CANCELLED" and shown.get("Restarts") == "0", shown
    batch_log = next(tmp_path.glob(f"slurm-*-{job}.out")).read_text()
    assert "scontrol requeue" not in batch_log, batch_log


@pytest.mark.timeout(420)
def test_ddp_template_survives_preemption(jobs: Jobs, tmp_path: Path, slurm_client: Any) -> None:
    """--signal=USR2@T (no B:) reaches the ranks at preemption; train checkpoints and requeues
    the job itself with scontrol (Slurm requeues it on 24.11+: releases.py); the restarted job
    resumes from that checkpoint."""
    _, _, run_dir = _preempt_and_resume(jobs, tmp_path, "ddp", {}, slurm_client)
    requeue = next(e for e in _events(run_dir) if e["event"] == "requeue")
    assert requeue.get("via") == preemption_requeue_via(slurm_client), requeue


@pytest.mark.timeout(300)
def test_array_template_sweep_file(jobs: Jobs, tmp_path: Path) -> None:
    spec = _spec(tmp_path, max_steps=3, interval=3)
    sweep = tmp_path / "seeds.txt"
    sweep.write_text("# one line per task\n--set train.seed=1\n--set train.seed=2\n")
    root = tmp_path / "runs"
    job = jobs.sbatch(
        "array",
        ["--array=0-1%1", "--gres=gpu:1", "-c1", "--time=10"],
        [str(spec)],
        env={"SWEEP_FILE": str(sweep), "RUN_ROOT": str(root)},
    )
    jobs.wait(job, {"COMPLETED"})
    for task in (0, 1):
        run_dir = root / f"train-sweep-{job}" / f"task-{task}"
        assert "complete" in _kinds(run_dir), jobs.logs()
        assert _checkpoints(run_dir)


RENDERED_SPEC = """\
name: tpl-rendered
resources: {partition: debug, nodes: 2, gpus_per_node: 1, cpus_per_task: 1, time: "00:10:00"}
""" + SPEC.split("\n", 1)[1].format(max_steps=8, interval=2)


@pytest.mark.timeout(300)
def test_rendered_template_from_jobs_cli(
    jobs: Jobs, tmp_path: Path, slurm_env: dict[str, str]
) -> None:
    """`python -m jobs submit SPEC --dry-run --template ddp --set ...` prints a script that sbatch
    runs as is: resources from the spec, the --set given to jobs reaches train."""
    spec = tmp_path / "rendered.yaml"
    spec.write_text(RENDERED_SPEC)
    cmd = [sys.executable, "-m", "jobs", "submit", str(spec), "--dry-run", "--template", "ddp"]
    proc = subprocess.run(
        [*cmd, "--set", "train.max_steps=3"],
        cwd=tmp_path,  # anywhere: the rendered script knows the checkout
        env=slurm_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "tpl-rendered.sbatch"
    script.write_text(proc.stdout)
    run_dir = tmp_path / "run-rendered"
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--output={tmp_path / 'slurm-%x-%j.out'}", str(script)],
        cwd=tmp_path,
        env={**slurm_env, "RUN_DIR": str(run_dir), "SLURM_TRAIN_STATE_DIR": str(tmp_path / "st")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    jobs.ids.append(job)
    jobs.wait(job, {"COMPLETED"})
    done = [e for e in _events(run_dir) if e["event"] == "complete"]
    assert done and done[-1]["step"] == 3, _events(run_dir)
    logs = sorted(p.name for p in (run_dir / "slurm").glob("*_log.out"))
    assert logs == [f"{job}_0_log.out", f"{job}_1_log.out"], logs


def _rank_pid(job: str) -> int | None:
    """The training process (python -m train) of ``job``'s rank 0."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "environ").read_bytes()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        env = dict(i.split(b"=", 1) for i in raw.split(b"\0") if b"=" in i)
        mine = env.get(b"SLURM_JOB_ID") == job.encode() and env.get(b"SLURM_PROCID") == b"0"
        if mine and b"-m\0train\0" in cmd:
            return int(entry.name)
    return None


@pytest.mark.timeout(300)
def test_requeue_template_restarts_a_killed_step_in_place(
    jobs: Jobs, tmp_path: Path, slurm_client: Any
) -> None:
    """Issue 26: the requeue template runs its step in a loop; a rank killed from outside is
    restarted in the same allocation (python -m train.stop.step), never requeued."""
    spec = _spec(tmp_path, max_steps=40, interval=5)
    run_dir = tmp_path / "run-inplace"
    job = jobs.sbatch(
        "requeue",
        ["-N1", "--ntasks-per-node=1", "--gres=gpu:1", "-c1", "--time=10"],
        [str(spec)],
        env={"RUN_DIR": str(run_dir), **slow_saves(0.2)},
    )
    jobs.wait(job, {"RUNNING"}, timeout=120)
    deadline = time.monotonic() + 120
    while not _checkpoints(run_dir) or _rank_pid(job) is None:
        assert time.monotonic() < deadline, f"no checkpoint yet:\n{jobs.logs()}"
        time.sleep(0.5)
    pid = _rank_pid(job)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    jobs.wait(job, {"COMPLETED"}, timeout=240)
    batch_log = next(tmp_path.glob(f"slurm-*-{job}.out")).read_text()
    assert "restarting it in place (1)" in batch_log, batch_log
    kinds = _kinds(run_dir)
    assert "restart_in_place" in kinds and "requeue" not in kinds, kinds
    assert kinds[-1] == "complete", kinds
    assert slurm_client.show_job(job).get("Restarts") == "0"
