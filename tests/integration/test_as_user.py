"""The tool as a user, not root: submit, follow, status, plot, drill and cancel as ``trainee``.

On a real cluster the submitter is not root: it may not raise a time limit, touch another
user's job or write outside its own folders. These tests run every command as the unprivileged
user ``trainee`` (``scripts/setup.sh`` creates it; the tests skip, saying so, where it is
missing) with a HOME of its own, in a folder of its own, through ``runuser`` and a clean
environment (the cluster's ``SLURM_CONF`` and little else). Its Python is a plain venv of the
system's interpreter that reads this checkout's ``.venv`` through a ``.pth`` line: the ``.venv``'s
own interpreter lives under ``/root``, where another user cannot reach (the installed-from-a-wheel
path: ``test_user_install.py``). Root keeps only the daemons, and one job of its own, which
``trainee`` must not be able to touch.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from slow_saves import slow_steps
from user_helpers import SYSTEM_PYTHON, USER, run_as_user, skip_reason, uid, user_dir

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cifar.yaml"
TINY = [
    *("--set", "train.data.train_size=512", "--set", "train.data.test_size=64"),
    *("--set", "train.width=8", "--set", "train.batch_size=32", "--set", "resources.time=10"),
]

AsUser = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def user_home(slurm_env: dict[str, str]) -> Path:
    """A fresh HOME for ``trainee`` beside this worker's cluster, with a venv that reads the
    checkout's ``.venv`` (see the module docstring)."""
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    cluster_dir = Path(slurm_env["SLURM_TRAIN_CLUSTER_DIR"])
    home = user_dir(cluster_dir.parent / f"{cluster_dir.name}-{USER}")
    venv = home / "venv"
    proc = run_as_user(
        [str(SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(venv)],
        home=home, cwd=home, venv=venv, env={},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    ours = sysconfig.get_paths()["purelib"]
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", where],
            check=True, timeout=60, capture_output=True, text=True,
        ).stdout.strip()
    )  # fmt: skip
    (site / "slurm_train_checkout.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return home


@pytest.fixture
def as_user(user_home: Path, slurm_env: dict[str, str], request: pytest.FixtureRequest) -> AsUser:
    """Run a command as ``trainee`` in a folder of its own for this test."""
    work = user_dir(user_home / request.node.name.replace("[", "-").replace("]", ""))

    def run(
        *argv: str, extra: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        env = {**slurm_env, **(extra or {})}
        venv = user_home / "venv"
        return run_as_user(
            list(argv), home=user_home, cwd=work, venv=venv, env=env, timeout=timeout
        )

    run.work = work  # type: ignore[attr-defined]
    return run


def _jobs(as_user: AsUser, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    proc = as_user("python", "-m", "jobs", *args, **kw)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def _state(as_user: AsUser, run: str) -> str:
    proc = _jobs(as_user, "status", run, "--json")
    assert proc.returncode == 0, proc.stderr
    return str(json.loads(proc.stdout)["tasks"][0]["state"])


def _wait(as_user: AsUser, run: str, wanted: set[str], timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while (state := _state(as_user, run)) not in wanted:
        assert time.monotonic() < deadline, f"{run}: {state}, wanted {wanted}"
        time.sleep(2)


def test_a_user_submits_follows_and_plots_in_folders_of_its_own(
    as_user: AsUser, user_home: Path, slurm_cluster: object
) -> None:
    proc = _jobs(as_user, "submit", str(EXAMPLE), *TINY, "--set", "train.max_steps=4", "--follow")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    job_id = proc.stdout.splitlines()[0].strip()
    assert "COMPLETED" in proc.stdout
    status = json.loads(_jobs(as_user, "status", job_id, "--json").stdout)
    run_dir = Path(status["run_dir"])
    assert run_dir.is_relative_to(as_user.work)  # type: ignore[attr-defined]
    for path in (run_dir, run_dir / "checkpoints", user_home / ".local" / "state" / "slurm-train"):
        assert path.stat().st_uid == uid(), path
    plot = _jobs(as_user, "plot", job_id)
    assert plot.returncode == 0, plot.stderr
    assert Path(plot.stdout.strip()).stat().st_uid == uid()
    listed = _jobs(as_user, "list")
    assert listed.returncode == 0 and str(run_dir) in listed.stdout
    if slurm_cluster.hosts_layout == "net":  # type: ignore[attr-defined]  # the login host
        assert as_user("hostname").stdout.strip() == "login"


@pytest.mark.long(90)
def test_a_user_drills_and_cancels_its_own_job_and_is_refused_what_needs_an_operator(
    as_user: AsUser, slurm_env: dict[str, str]
) -> None:
    proc = _jobs(
        as_user, "submit", str(EXAMPLE), *TINY, "--set", "train.max_steps=100000",
        extra=slow_steps(0.2),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    job_id = proc.stdout.strip().splitlines()[-1]
    try:
        # Raising a time limit again needs an operator: refused before anything is done.
        timeout = _jobs(as_user, "drill", job_id, "--kind", "timeout", timeout=300)
        assert timeout.returncode == 2, timeout.stdout + timeout.stderr
        last = timeout.stderr.strip().splitlines()[-1]
        assert last.startswith("drill --kind timeout: only an operator may raise"), last
        # A preemption is what a user may cause (a job of its own in a higher partition).
        drill = _jobs(as_user, "drill", job_id, "--kind", "preempt", timeout=300)
        assert drill.returncode == 0, drill.stdout + drill.stderr[-3000:]
        assert "back: resumed" in drill.stdout
        cancel = _jobs(as_user, "cancel", job_id)
        assert cancel.returncode == 0 and f"cancelled {job_id}" in cancel.stdout, cancel.stderr
        _wait(as_user, job_id, {"CANCELLED"})
    finally:
        subprocess.run(["scancel", job_id], env=slurm_env, capture_output=True, check=False)


@pytest.mark.long(45)
def test_another_users_job_is_refused_in_one_line_and_left_alone(
    as_user: AsUser, slurm_env: dict[str, str], user_home: Path
) -> None:
    """Root's run in a folder everyone can read (a colleague's run on the shared file system):
    trainee's drill and cancel are refused in one line each, and root's job runs on."""
    shared = user_home.parent / f"{user_home.name}-shared"
    shutil.rmtree(shared, ignore_errors=True)
    shared.mkdir(mode=0o755)
    env = {
        **slurm_env,
        **slow_steps(0.2),
        "SLURM_TRAIN_RUNS_DIR": str(shared / "runs"),
        "SLURM_TRAIN_STATE_DIR": str(shared / "state"),
    }
    submit = ["submit", str(EXAMPLE), *TINY, "--set", "train.max_steps=100000"]
    proc = subprocess.run(
        [sys.executable, "-m", "jobs", *submit],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    job_id = proc.stdout.strip().splitlines()[-1]
    try:
        (run_dir,) = (shared / "runs").iterdir()
        for kind in ("fail", "timeout", "preempt"):
            drill = _jobs(as_user, "drill", str(run_dir), "--kind", kind, "--accept-short-limit")
            assert drill.returncode == 2, drill.stdout + drill.stderr
            lines = drill.stderr.strip().splitlines()
            assert len(lines) == 1, drill.stderr
            assert lines[0].startswith(f"drill: job {job_id} (") and "belongs to root" in lines[0]
        cancel = _jobs(as_user, "cancel", str(run_dir))
        assert cancel.returncode == 1, cancel.stdout + cancel.stderr
        assert len(cancel.stderr.strip().splitlines()) == 1, cancel.stderr
        assert cancel.stderr.startswith("slurm: scancel") and job_id in cancel.stderr
        shown = subprocess.run(
            ["scontrol", "show", "job", "--oneliner", job_id],
            env=env, capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        assert "JobState=RUNNING" in shown or "JobState=PENDING" in shown, shown
        assert "TimeLimit=00:10:00" in shown and "Restarts=0" in shown, shown
    finally:
        subprocess.run(
            ["scontrol", "update", f"JobId={job_id}", "Requeue=0"],
            env=env, capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        subprocess.run(["scancel", job_id], env=env, capture_output=True, timeout=30, check=False)
