"""sbatch_templates/*.sbatch without Slurm: shellcheck, and each script run by bash with stub
``srun``/``scontrol`` commands that record their arguments, so the exact command line the
template builds (and what it does with exit codes and signals) is checked, hostile file names
included; then the same for templates rendered for a spec (``jobs.templates.render_template``),
with hostile values. Real submissions are in tests/integration/test_templates_cluster.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "sbatch_templates"
NAMES = ["ddp", "dataparallel", "requeue", "array"]

STUB_SRUN = r"""#!/bin/bash
printf '%s\0' "$@" > "${STUB_DIR}/srun.args"
printf '%s' "${SLURM_TRAIN_SLURM_RELEASE-unset}" > "${STUB_DIR}/srun.release"
case "${STUB_MODE:-exit}" in
  exit) exit "${STUB_RC:-0}" ;;
  signal)
    # Like train: on USR2/TERM finish the "step", then exit with STUB_SIGNAL_RC.
    trap 'echo USR2 >> "${STUB_DIR}/srun.signals"; exit "${STUB_SIGNAL_RC:-75}"' USR2
    trap 'echo TERM >> "${STUB_DIR}/srun.signals"; exit "${STUB_SIGNAL_RC:-75}"' TERM
    touch "${STUB_DIR}/srun.started"
    for _ in $(seq 300); do sleep 0.05; done
    exit 0 ;;
esac
"""

STUB_SCONTROL = r"""#!/bin/bash
if [[ "$1" == version ]]; then  # counted apart: the templates ask it once per job start
  echo version >> "${STUB_DIR}/scontrol.version"
  echo "slurm ${STUB_RELEASE:-24.11.5}"
  exit 0
fi
if [[ "$1" == show ]]; then
  echo "JobId=123 JobState=${STUB_JOB_STATE:-RUNNING} Reason=None PreemptTime=${STUB_PREEMPT:-None}"
  exit 0
fi
printf '%s\0' "$@" >> "${STUB_DIR}/scontrol.args"
if [[ -n "${STUB_SCONTROL_FAILS:-}" ]]; then  # the first N calls refused, then taken
  n=$(( $(cat "${STUB_DIR}/scontrol.fails" 2>/dev/null || echo 0) + 1 ))
  echo "$n" > "${STUB_DIR}/scontrol.fails"
  if (( n <= STUB_SCONTROL_FAILS )); then exit 1; fi
  exit 0
fi
exit "${STUB_SCONTROL_RC:-0}"
"""


def _read_args(path: Path) -> list[str]:
    data = path.read_bytes()
    return data.decode().split("\0")[:-1] if data else []


class Harness:
    """A fake job environment: stub srun/scontrol on PATH, a project dir, SLURM_* variables."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.stubs = tmp / "stubs"
        self.bin = tmp / "bin"
        self.project = tmp / "project"
        for d in (self.stubs, self.bin, self.project):
            d.mkdir()
        self.python = str(self.bin / "python")
        for name, text in (("srun", STUB_SRUN), ("scontrol", STUB_SCONTROL),
                           ("python", f'#!/bin/bash\nexec {sys.executable} "$@"\n')):  # fmt: skip
            exe = self.bin / name
            exe.write_text(text)
            exe.chmod(0o755)
        self.spec = self.project / "spec.yaml"
        self.spec.write_text("name: t\ntrain: {model: tinycnn}\n")
        self.env = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "HOME": str(tmp),
            "STUB_DIR": str(self.stubs),
            "SLURM_SUBMIT_DIR": str(self.project),
            "SLURM_JOB_ID": "123",
            "SLURM_JOB_NAME": "train-test",
            "SLURM_JOB_PARTITION": "debug",
            "SLURM_JOB_NODELIST": "n[1-2]",
            "SLURM_NTASKS": "4",
            "SLURM_GPUS_ON_NODE": "2",
            "SLURM_ARRAY_JOB_ID": "120",
            "SLURM_ARRAY_TASK_ID": "0",
            # the interpreter the templates run (srun's, and the batch shell's own
            # `python -m train.stop.step` after the step): this one, by another path
            "PYTHON": self.python,
        }

    def script(self, name: str) -> Path:
        return TEMPLATES / f"{name}.sbatch"

    def popen(
        self, name: str, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["bash", str(self.script(name)), *args],
            cwd=self.project,
            env={**self.env, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def run(
        self, name: str, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(self.script(name)), *args],
            cwd=self.project,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def run_file(
        self, script: Path, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a rendered script (it defaults PROJECT_DIR to the real checkout: keep it here)."""
        return subprocess.run(
            ["bash", str(script), *args],
            cwd=self.project,
            env={**self.env, "PROJECT_DIR": str(self.project), **(env or {})},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def srun_args(self) -> list[str]:
        return _read_args(self.stubs / "srun.args")

    def scontrol_calls(self) -> list[str]:
        path = self.stubs / "scontrol.args"
        return _read_args(path) if path.exists() else []


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


def _after(args: list[str], exe: str) -> list[str]:
    """The argv of the training command inside an srun line (from the interpreter on)."""
    return args[args.index(exe) :]


# -- static checks ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_shellcheck_clean(name: str) -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed")
    proc = subprocess.run(
        ["shellcheck", str(TEMPLATES / f"{name}.sbatch")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", NAMES)
def test_template_shape(name: str) -> None:
    text = (TEMPLATES / f"{name}.sbatch").read_text()
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    first_code = next(ln for ln in lines if ln.strip() and not ln.startswith("#"))
    assert first_code == "set -euo pipefail"
    assert '"$@"' in text
    assert "# >>> sbatch options" in text and "# <<< sbatch options" in text
    assert "--requeue" in text and "--signal=" in text
    # The header documents the knobs users change.
    header = text.split("# >>> sbatch options", 1)[0]
    for word in ("PYTHON", "SLURM_SUBMIT_DIR", ".venv/bin/python", "python3", "Change:"):
        assert word in header, f"{name}: header does not mention {word}"


# -- ddp ----------------------------------------------------------------------------------------
def test_ddp_command_line(h: Harness) -> None:
    before = sorted(p.name for p in h.project.iterdir())
    proc = h.run("ddp", "spec.yaml", "--set", "train.max_steps=3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    args = h.srun_args()
    # the run directory: not in the submission folder, in the state folder's runs/ (issue 45)
    run_dir = h.tmp / ".local" / "state" / "slurm-train" / "runs" / "t-job123"
    log_dir = run_dir / "slurm"
    assert args[:4] == [
        "--kill-on-bad-exit=1",
        "--unbuffered",
        "--open-mode=append",
        f"--output={log_dir}/%j_%t_log.out",  # where `jobs logs` reads them
    ]
    assert _after(args, h.python) == [
        h.python,
        "-P",  # issue 42: never a package from the working directory
        "-m",
        "train",
        "--config",
        str(h.spec),
        "--run-dir",
        str(run_dir),
        "--set",
        "train.max_steps=3",
    ]
    assert log_dir.is_dir()
    assert sorted(p.name for p in h.project.iterdir()) == before  # nothing written there
    assert "restart_count=0" in proc.stdout
    assert h.scontrol_calls() == []


def test_ddp_run_dir_and_log_dir(h: Harness) -> None:
    run_dir = h.tmp / "run dir"
    proc = h.run("ddp", "spec.yaml", env={"RUN_DIR": str(run_dir)})
    assert proc.returncode == 0, proc.stderr
    args = h.srun_args()
    assert f"--output={run_dir}/slurm/%j_%t_log.out" in args
    assert args[-2:] == ["--run-dir", str(run_dir)]


@pytest.mark.parametrize("name", NAMES)
def test_every_template_runs_train_isolated_and_exports_the_release(h: Harness, name: str) -> None:
    """Issue 42: ``python -P -m train`` (no package from the working directory); issue 43: the
    ranks get the cluster's release (train's stop path reads it), asked once per job start."""
    proc = h.run(name, "spec.yaml", env={"STUB_RELEASE": "26.05.5"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _after(h.srun_args(), h.python)[:4] == [h.python, "-P", "-m", "train"]
    assert (h.stubs / "srun.release").read_text() == "26.05.5"
    assert (h.stubs / "scontrol.version").read_text().splitlines() == ["version"]


@pytest.mark.parametrize("name", NAMES)
def test_a_release_exported_by_jobs_submit_wins_and_slurm_is_not_asked(
    h: Harness, name: str
) -> None:
    proc = h.run(name, "spec.yaml", env={"SLURM_TRAIN_SLURM_RELEASE": "22.05.8"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (h.stubs / "srun.release").read_text() == "22.05.8"
    assert not (h.stubs / "scontrol.version").exists()


def test_an_unreadable_release_is_empty_and_the_job_runs_on(h: Harness) -> None:
    (h.bin / "scontrol").write_text("#!/bin/bash\nexit 1\n")
    proc = h.run("ddp", "spec.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (h.stubs / "srun.release").read_text() == ""


@pytest.mark.parametrize("name", ["ddp", "dataparallel", "array"])
def test_exit_75_becomes_requeue(h: Harness, name: str) -> None:
    proc = h.run(name, "spec.yaml", env={"STUB_RC": "75"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert h.scontrol_calls() == ["requeue", "123"]


@pytest.mark.parametrize("name", NAMES)
def test_failure_exit_code_passes_through(h: Harness, name: str) -> None:
    proc = h.run(name, "spec.yaml", env={"STUB_RC": "3"})
    assert proc.returncode == 3
    assert h.scontrol_calls() == []


@pytest.mark.parametrize("name", NAMES)
def test_missing_spec_is_a_usage_error(h: Harness, name: str) -> None:
    proc = h.run(name)
    assert proc.returncode == 2
    assert "usage:" in proc.stderr
    assert not (h.stubs / "srun.args").exists()


def test_python_default_prefers_project_venv(h: Harness) -> None:
    env = {k: v for k, v in h.env.items() if k != "PYTHON"}
    h.env = env
    assert h.run("ddp", "spec.yaml").returncode == 0
    assert "python3" in h.srun_args()
    venv_python = h.project / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("#!/bin/sh\n")
    venv_python.chmod(0o755)
    assert h.run("ddp", "spec.yaml").returncode == 0
    assert str(venv_python) in h.srun_args()


def test_project_dir_goes_on_pythonpath(h: Harness) -> None:
    # srun inherits the environment: make the stub record PYTHONPATH.
    (h.bin / "srun").write_text('#!/bin/bash\nprintf "%s" "$PYTHONPATH" > "$STUB_DIR/pp"\n')
    assert h.run("ddp", "spec.yaml", env={"PYTHONPATH": "/x"}).returncode == 0
    assert (h.stubs / "pp").read_text() == f"{h.project}:/x"


# -- dataparallel -------------------------------------------------------------------------------
def test_dataparallel_classic_srun_line(h: Harness) -> None:
    proc = h.run("dataparallel", "spec.yaml", "--set", "train.max_steps=2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    args = h.srun_args()
    pre = args[: args.index(h.python)]
    for opt in (
        "--partition=debug",
        "-n1",
        "--ntasks-per-node=1",
        "--job-name=train-test",
        "--kill-on-bad-exit=1",
        "--gres=gpu:2",
    ):
        assert opt in pre
    assert not any(a.startswith("--mpi") for a in pre)
    assert _after(args, h.python)[4:] == [
        "--config",
        str(h.spec),
        "--set",
        "train.strategy=dp",
        "--run-dir",  # not a whole job spec (dp without GPUs): named by the job
        str(h.tmp / ".local" / "state" / "slurm-train" / "runs" / "train-test-job123"),
        "--set",
        "train.max_steps=2",
    ]


def test_dataparallel_mpi_and_no_gpus(h: Harness) -> None:
    assert h.run("dataparallel", "spec.yaml", env={"MPI": "pmi2"}).returncode == 0
    assert "--mpi=pmi2" in h.srun_args()
    assert h.run("dataparallel", "spec.yaml", env={"SLURM_GPUS_ON_NODE": "0"}).returncode == 0
    assert not any(a.startswith("--gres") for a in h.srun_args())


# -- requeue ------------------------------------------------------------------------------------
def _wait_for(path: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear")
        time.sleep(0.02)


@pytest.mark.parametrize(("step_rc", "requeued"), [("75", True), ("0", False), ("143", True)])
def test_requeue_forwards_usr2_then_requeues(h: Harness, step_rc: str, requeued: bool) -> None:
    proc = h.popen("requeue", "spec.yaml", env={"STUB_MODE": "signal", "STUB_SIGNAL_RC": step_rc})
    try:
        _wait_for(h.stubs / "srun.started")
        os.kill(proc.pid, signal.SIGUSR2)  # what --signal=B:USR2@90 does
        out, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert "USR2" in (h.stubs / "srun.signals").read_text()
    assert "got SIGUSR2" in out
    if requeued:
        assert proc.returncode == 0, out
        assert h.scontrol_calls() == ["requeue", "123"], out
    else:
        # The step finished its work anyway: nothing to requeue, its status is the job's.
        assert proc.returncode == 0, out
        assert h.scontrol_calls() == [], out


def test_requeue_forwards_term_too(h: Harness) -> None:
    proc = h.popen("requeue", "spec.yaml", env={"STUB_MODE": "signal"})
    try:
        _wait_for(h.stubs / "srun.started")
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert "TERM" in (h.stubs / "srun.signals").read_text()
    assert proc.returncode == 0, out
    assert h.scontrol_calls() == ["requeue", "123"]


def test_requeue_never_requeues_a_cancelled_job(h: Harness) -> None:
    """A plain scancel sends TERM as well: the job must stay cancelled, not come back."""
    proc = h.popen(
        "requeue", "spec.yaml", env={"STUB_MODE": "signal", "STUB_JOB_STATE": "COMPLETING"}
    )
    try:
        _wait_for(h.stubs / "srun.started")
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert "was cancelled" in out
    assert h.scontrol_calls() == []


def test_requeue_preempted_by_term_alone_is_requeued(h: Harness) -> None:
    """Without preempt_send_user_signal a preemption is TERM only; PreemptTime tells it apart."""
    env = {
        "STUB_MODE": "signal",
        "STUB_JOB_STATE": "COMPLETING",
        "STUB_PREEMPT": "2026-11-22T10:00:00",
    }
    proc = h.popen("requeue", "spec.yaml", env=env)
    try:
        _wait_for(h.stubs / "srun.started")
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert h.scontrol_calls() == ["requeue", "123"], out


def test_requeue_exit_75_without_signal(h: Harness) -> None:
    proc = h.run("requeue", "spec.yaml", "--set", "a=b", env={"STUB_RC": "75"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert h.scontrol_calls() == ["requeue", "123"]
    assert h.srun_args()[-2:] == ["--set", "a=b"]


@pytest.mark.parametrize("name", NAMES)
def test_a_refused_requeue_is_retried_and_recorded(h: Harness, name: str) -> None:
    """Issue 44 item 10: the step exits 75 (Slurm refused the ranks' requeue): the script asks
    train.stop.step, which tries again (refused once more, then taken) and records it."""
    proc = h.run(name, "spec.yaml", env={"STUB_RC": "75", "STUB_SCONTROL_FAILS": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert h.scontrol_calls() == ["requeue", "123", "requeue", "123"]
    assert "failed (try 1)" in proc.stderr
    (events,) = h.tmp.rglob("events.jsonl")
    last = json.loads(events.read_text().splitlines()[-1])
    assert (last["event"], last["via"], last["tries"]) == ("requeue", "batch_script", 2), last


@pytest.mark.parametrize(
    ("sig", "state", "expected"),
    [
        (signal.SIGUSR2, "RUNNING", ["preempted", "requeue_failed", "requeue"]),
        (signal.SIGTERM, "COMPLETING", ["cancelled"]),
    ],
)
def test_a_step_killed_after_the_signal_is_decided_recorded_and_requeued(
    h: Harness, sig: signal.Signals, state: str, expected: list[str]
) -> None:
    """Issue 44: the requeue template's signal path (the step killed before it could answer,
    exit above 128) goes through train.stop.step like the others: the stop decided as the
    ranks would have (Slurm says why), recorded, a refused requeue retried; a cancel stays
    cancelled. It ran a bare `scontrol requeue` and recorded nothing."""
    env = {"STUB_MODE": "signal", "STUB_SIGNAL_RC": "137", "STUB_SCONTROL_FAILS": "1",
           "STUB_JOB_STATE": state}  # fmt: skip
    proc = h.popen("requeue", "spec.yaml", env=env)
    try:
        _wait_for(h.stubs / "srun.started")
        os.kill(proc.pid, sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    (events,) = h.tmp.rglob("events.jsonl")  # the run directory: outside the checkout now
    records = [json.loads(line) for line in events.read_text().splitlines()]
    assert [e["event"] for e in records] == expected, out
    assert (records[0]["by"], records[0]["signal"]) == ("batch_script", f"SIG{sig.name[3:]}")
    requeues = ["requeue", "123", "requeue", "123"] if state == "RUNNING" else []
    assert h.scontrol_calls() == requeues, out


def test_requeue_container_prefix(h: Harness) -> None:
    env = {"SRUN_PREFIX": "apptainer exec --nv img.sif"}
    assert h.run("requeue", "spec.yaml", env=env).returncode == 0
    args = h.srun_args()
    i = args.index("apptainer")
    assert args[i : i + 5] == ["apptainer", "exec", "--nv", "img.sif", h.python]


# -- array --------------------------------------------------------------------------------------
def test_array_directory_of_specs(h: Harness) -> None:
    sweep = h.project / "sweep"
    sweep.mkdir()
    for n in ("b.yaml", "a.yaml", "c.yml", "notes.txt"):
        (sweep / n).write_text("train: {}\n")
    proc = h.run("array", "sweep", env={"SLURM_ARRAY_TASK_ID": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = h.project / "runs" / "train-test-120" / "task-1"
    assert _after(h.srun_args(), h.python)[4:] == [
        "--config",
        str(sweep / "b.yaml"),
        "--run-dir",
        str(run_dir),
    ]
    assert f"--output={run_dir}/logs/%x-%j-rank%t.out" in h.srun_args()
    proc = h.run("array", "sweep", env={"SLURM_ARRAY_TASK_ID": "3"})
    assert proc.returncode == 2
    assert "holds only 3 specs" in proc.stderr


def test_array_sweep_file(h: Harness) -> None:
    sweep = h.project / "lr.txt"
    sweep.write_text(
        "# learning rates\n"
        "--set train.optimizer.lr=0.05\n"
        "\n"
        "--set train.optimizer.lr=0.1   --set train.seed=$(touch pwned)\n"
    )
    env = {"SWEEP_FILE": "lr.txt", "SLURM_ARRAY_TASK_ID": "1", "RUN_ROOT": str(h.tmp / "r")}
    proc = h.run("array", "spec.yaml", "--set", "train.max_steps=5", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _after(h.srun_args(), h.python)[4:] == [
        "--config",
        str(h.spec),
        "--run-dir",
        str(h.tmp / "r" / "train-test-120" / "task-1"),
        "--set",
        "train.optimizer.lr=0.1",
        "--set",
        # Split on whitespace only: never expanded, never run.
        "train.seed=$(touch",
        "pwned)",
        "--set",
        "train.max_steps=5",
    ]
    assert not list(h.tmp.rglob("pwned"))
    env["SLURM_ARRAY_TASK_ID"] = "2"
    proc = h.run("array", "spec.yaml", env=env)
    assert proc.returncode == 2
    assert "only 2 sweep lines" in proc.stderr


def test_array_needs_array_task_id(h: Harness) -> None:
    env = {k: v for k, v in h.env.items() if k != "SLURM_ARRAY_TASK_ID"}
    h.env = env
    proc = h.run("array", "spec.yaml")
    assert proc.returncode != 0
    assert "--array" in proc.stderr


# -- hostile values -----------------------------------------------------------------------------
HOSTILE = [
    "$(touch pwned1)",
    "`touch pwned2`",
    "a'; touch pwned3; echo '",
    'b"; touch pwned4; echo "',
    "with space; touch pwned5 #",
    "-- *",
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_paths_and_args_run_nothing(h: Harness, name: str, hostile: str) -> None:
    folder = h.project / hostile.replace("/", "_")
    folder.mkdir()
    spec = folder / f"{hostile.replace('/', '_')}.yaml"
    spec.write_text("train: {}\n")
    env = {"RUN_DIR": str(folder / "run"), "RUN_ROOT": str(folder / "runs")}
    # "./" so that a name starting with "-" is still the spec argument.
    arg = "./" + str(spec.relative_to(h.project))
    proc = h.run(name, arg, "--set", f"train.run_dir={hostile}", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    args = h.srun_args()
    assert str(spec) in args
    assert args[-2:] == ["--set", f"train.run_dir={hostile}"]
    assert not list(h.tmp.rglob("pwned*"))


# -- rendered for a spec (jobs.templates.render_template) --------------------------------------
SPEC_YAML = """\
name: tpl-test
resources: {partition: debug, nodes: 2, gpus_per_node: 2, cpus_per_task: 1, time: "00:10:00"}
requeue: {signal_delay_s: 30}
train: {model: tinycnn, max_steps: 20, batch_size: 64}
"""
SWEEP_YAML = """\
name: tpl-sweep
resources: {nodes: 1, gpus_per_node: 1, time: 10}
train: {model: tinycnn, max_steps: 4, batch_size: 32}
sweep: {grid: {train.optimizer.lr: [0.1, 0.05], train.seed: [1, 2, 3]}, max_parallel: 2}
"""


def _load(path: Path, text: str, overrides: tuple[str, ...] = ()) -> object:
    from jobs.load import load_spec

    path.write_text(text)
    return load_spec(path, overrides)  # render_template takes the LoadedSpec (its sweep tasks)


def _render(name: str, spec: object, spec_path: Path, tmp: Path) -> tuple[str, Path]:
    from jobs.templates import render_template

    text = render_template(name, spec, spec_path)  # type: ignore[arg-type]
    out = tmp / f"rendered-{name}.sbatch"
    out.write_text(text)
    return text, out


def _sbatch_lines(text: str) -> list[str]:
    """The arguments sbatch reads from #SBATCH lines, parsed as Slurm 22.05's sbatch does
    (src/sbatch/opt.c _get_argument: quotes of either kind, backslash escapes, # comment)."""
    args = []
    for line in text.splitlines():
        if not line.startswith("#SBATCH"):
            if line.strip() and not line.startswith("#"):
                break  # sbatch stops at the first command
            continue
        rest, out, quote, escape = line[len("#SBATCH") :].lstrip(), "", "", False
        for ch in rest:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
                continue
            elif quote:
                if ch == quote:
                    quote = ""
                    continue
            elif ch in "\"'":
                quote = ch
                continue
            elif ch == "#" or ch.isspace():
                break
            out += ch
        args.append(out)
    return args


@pytest.mark.parametrize("name", ["ddp", "requeue"])
def test_render_fills_options_from_spec(h: Harness, name: str) -> None:
    spec = _load(h.project / "s.yaml", SPEC_YAML, ("train.max_steps=5",))
    text, out = _render(name, spec, h.project / "s.yaml", h.tmp)
    target = "B:" if name == "requeue" else ""
    assert _sbatch_lines(text)[:8] == [
        "--job-name=tpl-test",
        "--partition=debug",
        "--nodes=2",
        "--ntasks-per-node=2",
        "--gres=gpu:2",
        "--cpus-per-task=1",
        "--time=00:10:00",
        f"--signal={target}USR2@30",
    ]
    assert "--requeue" in _sbatch_lines(text)
    if shutil.which("shellcheck"):
        proc = subprocess.run(["shellcheck", str(out)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout
    # With no argument the rendered script runs the spec it was made from, plus the override
    # given on the jobs command line (the file says max_steps 20).
    assert f"then PROJECT_DIR={REPO}; fi" in text
    proc = h.run_file(out, "--set", "train.seed=7")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _after(h.srun_args(), h.python)[4:] == [
        "--config",
        str((h.project / "s.yaml").resolve()),
        "--set",
        "train.max_steps=5",
        "--run-dir",
        str(h.tmp / ".local" / "state" / "slurm-train" / "runs" / "tpl-test-job123"),
        "--set",
        "train.seed=7",
    ]


def test_render_without_overrides_adds_no_set(h: Harness) -> None:
    from jobs.templates import spec_overrides

    spec = _load(h.project / "s.yaml", SPEC_YAML).spec  # type: ignore[attr-defined]
    assert spec_overrides(spec, h.project / "s.yaml") == []
    spec = _load(h.project / "s.yaml", SPEC_YAML, ("requeue.max_failures=1", "train.width=8"))
    spec = spec.spec  # type: ignore[attr-defined]
    assert sorted(spec_overrides(spec, h.project / "s.yaml")) == [
        "requeue.max_failures=1",
        "train.width=8",
    ]


def test_render_dataparallel(h: Harness) -> None:
    yaml_text = SPEC_YAML.replace("nodes: 2", "nodes: 1") + "launch: {mpi: pmi2}\n"
    yaml_text = yaml_text.replace("batch_size: 64}", "batch_size: 64, strategy: dp}")
    spec = _load(h.project / "s.yaml", yaml_text)
    text, out = _render("dataparallel", spec, h.project / "s.yaml", h.tmp)
    opts = _sbatch_lines(text)
    assert "--nodes=1" in opts and "--ntasks=1" in opts and "--ntasks-per-node=1" in opts
    assert "--gres=gpu:2" in opts
    assert h.run_file(out).returncode == 0
    args = h.srun_args()
    assert "--mpi=pmi2" in args and "--gres=gpu:2" in args and "-n1" in args


def test_render_array_sweep(h: Harness) -> None:
    spec = _load(h.project / "sweep.yaml", SWEEP_YAML)
    text, out = _render("array", spec, h.project / "sweep.yaml", h.tmp)
    assert "--array=0-5%2" in _sbatch_lines(text)
    if shutil.which("shellcheck"):
        proc = subprocess.run(["shellcheck", str(out)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout
    # Task 4 = (lr 0.05, seed 2): the first key varies slowest, as in jobs.load.
    assert h.run_file(out, env={"SLURM_ARRAY_TASK_ID": "4"}).returncode == 0
    tail = _after(h.srun_args(), h.python)
    assert tail[-4:] == ["--set", "train.optimizer.lr=0.05", "--set", "train.seed=2"]
    proc = h.run_file(out, env={"SLURM_ARRAY_TASK_ID": "6"})
    assert proc.returncode == 2
    assert "no task 6" in proc.stderr


@pytest.mark.parametrize(
    ("name", "yaml_text", "match"),
    [
        ("nope", SPEC_YAML, "choose one of ddp, dataparallel, requeue, array"),
        ("dataparallel", SPEC_YAML, "set nodes: 1, or use --template ddp"),
        ("array", SPEC_YAML, "needs a `sweep:` section"),
        ("ddp", SWEEP_YAML, "use --template array"),
    ],
)
def test_render_refuses_what_does_not_fit(
    h: Harness, name: str, yaml_text: str, match: str
) -> None:
    from jobs.errors import UsageError

    spec = _load(h.project / "s.yaml", yaml_text)
    with pytest.raises(UsageError, match=re.escape(match)):
        _render(name, spec, h.project / "s.yaml", h.tmp)


HOSTILE_VALUES = [
    'x"; touch pwned1 #',
    "$(touch pwned2)",
    "`touch pwned3`",
    "it's; touch pwned4",
    'back\\slash \\" end',
    "#not a comment",
]


@pytest.mark.parametrize("value", HOSTILE_VALUES)
@pytest.mark.parametrize("name", ["ddp", "requeue"])
def test_render_hostile_values_run_nothing(h: Harness, name: str, value: str) -> None:
    folder = h.project / value.replace("/", "_")
    folder.mkdir()
    spec_path = folder / "spec $(touch pwned9).yaml"
    # Values that reach the script: an sbatch option, an exported variable, a train override.
    yaml_text = SPEC_YAML + (
        f"launch: {{sbatch_args: {{comment: {json.dumps(value)}}}}}\n"
        f"environment: {{variables: {{HOSTILE: {json.dumps(value)}}}}}\n"
    )
    spec = _load(spec_path, yaml_text, (f"train.run_dir={json.dumps(value)}",))
    text, out = _render(name, spec, spec_path, h.tmp)
    assert f"--comment={value}" in _sbatch_lines(text)
    if shutil.which("shellcheck"):
        # SC2016 ("expressions don't expand in single quotes") is the point of the quoting here.
        cmd = ["shellcheck", "-e", "SC2016", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout
    # Record what srun would hand to the tasks: the variable and the train argv.
    (h.bin / "srun").write_text(
        '#!/bin/bash\nprintf "%s" "$HOSTILE" > "$STUB_DIR/var"\n'
        'printf "%s\\0" "$@" > "$STUB_DIR/srun.args"\n'
    )
    proc = h.run_file(out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (h.stubs / "var").read_text() == value
    args = h.srun_args()
    assert str(spec_path.resolve()) in args
    assert f"train.run_dir={json.dumps(value)}" in args
    assert not list(h.tmp.rglob("pwned*"))


@pytest.mark.parametrize(
    "extra",
    [
        'launch: {sbatch_args: {comment: "a\\nb"}}\n',
        'environment: {variables: {X: "a\\rb"}}\n',
    ],
)
def test_render_refuses_control_characters(h: Harness, extra: str) -> None:
    """jobs.load refuses them first; the renderer refuses them on its own too."""
    from jobs.errors import SpecError
    from jobs.spec import JobSpec
    from jobs.templates import render_template

    data = yaml.safe_load(SPEC_YAML + extra)
    spec = JobSpec.model_validate(data)
    (h.project / "s.yaml").write_text(SPEC_YAML)
    with pytest.raises(SpecError, match="newline or control character"):
        render_template("ddp", spec, h.project / "s.yaml")


def test_render_refuses_control_characters_in_path(h: Harness) -> None:
    from jobs.errors import SpecError
    from jobs.templates import render_template

    spec = _load(h.project / "s.yaml", SPEC_YAML)
    bad = h.project / "a\nb.yaml"
    bad.write_text(SPEC_YAML)
    with pytest.raises(SpecError, match="newline or control character"):
        render_template("ddp", spec, bad)  # type: ignore[arg-type]


def test_templates_module_does_not_import_torch() -> None:
    code = (
        "import sys, jobs.templates; "
        "sys.exit(1 if any(m == 'torch' or m.startswith('torch.') for m in sys.modules) else 0)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr


def test_run_dir_among_trains_options_is_not_refused_as_anothers(h: Harness) -> None:
    """Issue 45: `sbatch ddp.sbatch spec.yaml --run-dir DIR`: the batch script names DIR on its
    command line; the claim of its own registration must not take it for another run's."""
    run_dir = h.tmp / "mine"
    proc = h.run("ddp", "spec.yaml", "--run-dir", str(run_dir))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((run_dir / "run.json").read_text())["run_id"] == "t-job123"


# -- the batch log before the run directory is known ---------------------------------------------


def _as_batch(
    h: Harness, name: str, *args: str, env: dict[str, str] | None = None
) -> tuple[int, Path]:
    """The template run as sbatch runs it with the template's own ``--output``: stdout and
    stderr into ``/tmp/slurm-train-USER-JOBID.out`` (a name of this test's own)."""
    log = Path(f"/tmp/slurm-train-unit{os.getpid()}-{h.tmp.name}-123.out")
    try:
        with open(log, "w", encoding="utf-8") as out:
            rc = subprocess.run(
                ["bash", str(h.script(name)), *args], cwd=h.project,
                env={**h.env, **(env or {})}, stdout=out, stderr=subprocess.STDOUT, timeout=60,
                check=False,
            ).returncode  # fmt: skip
    except BaseException:
        log.unlink(missing_ok=True)
        raise
    return rc, log


@pytest.mark.parametrize("name", ["ddp", "dataparallel", "requeue"])
def test_an_exit_before_the_run_directory_leaves_its_lines_where_sbatch_would(
    h: Harness, name: str
) -> None:
    """The early batch log is in the batch node's /tmp, node-local on most clusters: a script
    that exits before the run directory is known (here a usage error) leaves those lines in
    SLURM_SUBMIT_DIR/slurm-JOBID.out, sbatch's own place, and nothing in /tmp."""
    rc, log = _as_batch(h, name)
    assert rc == 2
    assert "usage:" in (h.project / "slurm-123.out").read_text()
    assert not log.exists()


def test_an_early_exit_with_no_writable_submit_dir_goes_to_home(h: Harness) -> None:
    rc, log = _as_batch(h, "ddp", env={"SLURM_SUBMIT_DIR": str(h.tmp / "gone")})
    assert rc == 2
    assert "usage:" in (h.tmp / "slurm-123.out").read_text()
    assert not log.exists()


def test_a_run_that_goes_on_keeps_its_batch_log_in_the_run_directory_only(h: Harness) -> None:
    run_dir = h.tmp / "run"
    rc, log = _as_batch(h, "ddp", "spec.yaml", env={"RUN_DIR": str(run_dir), "STUB_RC": "3"})
    assert rc == 3  # a failure after the run directory is known: the trap is gone by then
    assert "[ddp.sbatch] job 123" in (run_dir / "slurm" / "batch-123.out").read_text()
    assert not (h.project / "slurm-123.out").exists()
    assert not log.exists()
