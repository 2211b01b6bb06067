"""sbatch_templates/*.sbatch without Slurm: shellcheck, and each script run by bash with stub
``srun``/``scontrol`` commands that record their arguments, so the exact command line the
template builds (and what it does with exit codes and signals) is checked, hostile file names
included. The rendered form (``jobs.templates.render_template``) is tested in
test_templates_render.py; real submissions are in tests/integration/test_templates_cluster.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "sbatch_templates"
NAMES = ["ddp", "dataparallel", "requeue", "array"]

STUB_SRUN = r"""#!/bin/bash
printf '%s\0' "$@" > "${STUB_DIR}/srun.args"
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
printf '%s\0' "$@" >> "${STUB_DIR}/scontrol.args"
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
        for name, text in (("srun", STUB_SRUN), ("scontrol", STUB_SCONTROL)):
            exe = self.bin / name
            exe.write_text(text)
            exe.chmod(0o755)
        self.spec = self.project / "spec.yaml"
        self.spec.write_text("train: {model: tinycnn}\n")
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
            "PYTHON": "/opt/py/bin/python",
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
    proc = h.run("ddp", "spec.yaml", "--set", "train.max_steps=3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    args = h.srun_args()
    log_dir = h.project / "logs"
    assert args[:4] == [
        "--kill-on-bad-exit=1",
        "--unbuffered",
        "--open-mode=append",
        f"--output={log_dir}/%x-%j-rank%t.out",
    ]
    assert _after(args, "/opt/py/bin/python") == [
        "/opt/py/bin/python",
        "-m",
        "train",
        "--config",
        str(h.spec),
        "--set",
        "train.max_steps=3",
    ]
    assert log_dir.is_dir()
    assert "restart_count=0" in proc.stdout
    assert h.scontrol_calls() == []


def test_ddp_run_dir_and_log_dir(h: Harness) -> None:
    run_dir = h.tmp / "run dir"
    proc = h.run("ddp", "spec.yaml", env={"RUN_DIR": str(run_dir)})
    assert proc.returncode == 0, proc.stderr
    args = h.srun_args()
    assert f"--output={run_dir}/logs/%x-%j-rank%t.out" in args
    assert args[-2:] == ["--run-dir", str(run_dir)]


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
    pre = args[: args.index("/opt/py/bin/python")]
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
    assert _after(args, "/opt/py/bin/python")[3:] == [
        "--config",
        str(h.spec),
        "--set",
        "train.strategy=dp",
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


def test_requeue_exit_75_without_signal(h: Harness) -> None:
    proc = h.run("requeue", "spec.yaml", "--set", "a=b", env={"STUB_RC": "75"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert h.scontrol_calls() == ["requeue", "123"]
    assert h.srun_args()[-2:] == ["--set", "a=b"]


def test_requeue_scontrol_failure_is_reported_not_fatal(h: Harness) -> None:
    proc = h.run("requeue", "spec.yaml", env={"STUB_RC": "75", "STUB_SCONTROL_RC": "1"})
    assert proc.returncode == 0
    assert "scontrol requeue failed" in proc.stderr


def test_requeue_container_prefix(h: Harness) -> None:
    env = {"SRUN_PREFIX": "apptainer exec --nv img.sif"}
    assert h.run("requeue", "spec.yaml", env=env).returncode == 0
    args = h.srun_args()
    i = args.index("apptainer")
    assert args[i : i + 5] == ["apptainer", "exec", "--nv", "img.sif", "/opt/py/bin/python"]


# -- array --------------------------------------------------------------------------------------
def test_array_directory_of_specs(h: Harness) -> None:
    sweep = h.project / "sweep"
    sweep.mkdir()
    for n in ("b.yaml", "a.yaml", "c.yml", "notes.txt"):
        (sweep / n).write_text("train: {}\n")
    proc = h.run("array", "sweep", env={"SLURM_ARRAY_TASK_ID": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = h.project / "runs" / "train-test-120" / "task-1"
    assert _after(h.srun_args(), "/opt/py/bin/python")[3:] == [
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
    assert _after(h.srun_args(), "/opt/py/bin/python")[3:] == [
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
