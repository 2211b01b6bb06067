"""Installed as users install: a wheel of the project, ``pip install``-ed by ``trainee`` into a
plain venv of its own (no make, no apt, no root, no system site-packages), runs the CIFAR example
from a folder outside the checkout, is preempted for real (``slurm-train drill --kind preempt``:
a job in a higher partition takes the node) and resumes to COMPLETED, all from a folder that
holds the user's own ``train.py``.

torch is the lock's CPU build from ``/opt/wheels`` (offline, about 200 MB; PyPI's default torch
brings GBs of CUDA libraries); the other dependencies come from the package index, as a user's
would. The test skips, saying why, where that wheel or the user is missing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from slow_saves import HOOKS
from user_helpers import USER, make_venv, run_as_user, skip_reason, user_dir

pytestmark = pytest.mark.integration

#: Only on the host's Slurm release (SLURM_TRAIN_TEST_SLURM: another release runs its commands
#: through chroot wrappers, tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]
WHEELS = Path("/opt/wheels")


def _locked_torch() -> str:
    match = re.search(r"^torch==(\S+)", (REPO / "requirements.lock").read_text(), re.M)
    assert match, "requirements.lock pins torch"
    return match.group(1)


def _build_wheel(out: Path, scratch: Path) -> Path:
    """``pip wheel .`` without pip: setuptools' build backend on a copy of the sources."""
    src = scratch / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("jobs", "train", "cluster", "sbatch_templates"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    build = f"from setuptools import build_meta; print(build_meta.build_wheel({str(out)!r}))"
    proc = subprocess.run(
        [sys.executable, "-c", build], cwd=src, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel = out / proc.stdout.strip().splitlines()[-1]
    wheel.chmod(0o644)
    return wheel


@pytest.mark.long(240)
def test_a_wheel_installed_by_a_user_runs_the_cifar_example_through_a_preemption(
    slurm_env: dict[str, str],
) -> None:
    reason = skip_reason()
    torch = _locked_torch()
    if reason is None and not list(WHEELS.glob(f"torch-{torch.replace('+', '*')}-*.whl")):
        reason = f"no torch {torch} wheel in {WHEELS} (PyPI's default torch is GBs of CUDA)"
    if reason is not None:
        pytest.skip(reason)
    cluster_dir = Path(slurm_env["SLURM_TRAIN_CLUSTER_DIR"])
    home = user_dir(cluster_dir.parent / f"{cluster_dir.name}-{USER}-install")
    scratch = home / "scratch"  # root's: the build, the pace file
    scratch.mkdir()
    wheel = _build_wheel(home, scratch)
    venv = home / "venv"
    make_venv(venv, home)

    def user(*argv: str, timeout: float = 300, **extra: str) -> subprocess.CompletedProcess[str]:
        # not the test session's PYTHONPATH (the checkout): only what a test passes here
        env = {**{k: v for k, v in slurm_env.items() if k != "PYTHONPATH"}, **extra}
        return run_as_user(list(argv), home=home, cwd=work, venv=venv, env=env, timeout=timeout)

    work = home
    pip = str(venv / "bin" / "pip")
    for args in (
        [pip, "install", "-q", "--find-links", str(WHEELS), f"torch=={torch}"],
        [pip, "install", "-q", str(wheel)],
    ):
        # on this machine, not the cluster's login host: pip needs the package index, and the
        # local cluster's hosts reach nothing outside it (a real login node has the internet)
        proc = run_as_user(args, home=home, cwd=work, venv=venv, env={}, timeout=900)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    work = user_dir(home / "project")  # the user's own folder, far from the checkout
    spec = work / "cifar.yaml"
    shutil.copy(REPO / "examples" / "cifar.yaml", spec)
    spec.chmod(0o644)

    # The templates ship with the wheel; nothing is read from the checkout.
    proc = user("slurm-train", "submit", "cifar.yaml", "--dry-run", "--template", "ddp")
    assert proc.returncode == 0 and str(REPO) not in proc.stdout, proc.stderr[-3000:]

    # Beside a data folder named train/ (no __init__.py) the installed package still wins:
    # python -m jobs goes ahead; beside the user's own train.py it refuses in one line, and
    # slurm-train goes ahead. The run below is submitted from this folder, train.py and all
    # (the reproduction): every python the job runs takes -P.
    (work / "train").mkdir()
    dry = ("submit", "cifar.yaml", "--dry-run")
    proc = user("python", "-m", "jobs", *dry)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (work / "train.py").write_text("print('the user train.py ran')\nraise SystemExit(7)\n")
    proc = user("python", "-m", "jobs", *dry)
    assert proc.returncode == 2 and proc.stderr.startswith("your ./train.py shadows"), proc.stderr
    assert "the user train.py ran" not in proc.stdout + proc.stderr
    assert user("slurm-train", *dry).returncode == 0

    # Every step sleeps 0.2 s while the pace file exists (tests/hooks; only the hooks folder on
    # PYTHONPATH, not the checkout): the run lasts until the drill is done.
    pace = scratch / "pace"
    pace.touch()
    scratch.chmod(0o755)
    hooks = {"PYTHONPATH": str(HOOKS), "TRAIN_TEST_STEP_S": "0.2"}
    hooks["TRAIN_TEST_PACE_FILE"] = str(pace)
    small = [
        *("--set", "train.max_steps=120", "--set", "train.data.train_size=512"),
        *("--set", "train.data.test_size=64", "--set", "train.width=8"),
        *("--set", "train.batch_size=32", "--set", "resources.time=10"),
    ]
    proc = user("slurm-train", "submit", "cifar.yaml", *small, **hooks)
    assert proc.returncode == 0, proc.stderr[-3000:]
    job_id = proc.stdout.strip().splitlines()[-1]
    try:
        drill = user("slurm-train", "drill", job_id, "--kind", "preempt", "--json", timeout=400)
        assert drill.returncode == 0, drill.stdout[-2000:] + drill.stderr[-3000:]
        report = json.loads(drill.stdout)
        assert report["outcome"].startswith("back: resumed"), report
        assert report["stop_event"] == "preempted" and report["steps_lost"] == 0, report
        pace.unlink()
        deadline = time.monotonic() + 300
        while True:
            proc = user("slurm-train", "status", job_id, "--json")
            assert proc.returncode == 0, proc.stderr
            status = json.loads(proc.stdout)
            if status["tasks"][0]["state"] == "COMPLETED":
                break
            assert time.monotonic() < deadline, status
            time.sleep(2)
        run_dir = Path(status["run_dir"])
        assert run_dir.is_relative_to(work)
        script = (run_dir / "sbatch.sh").read_text()
        assert str(venv / "bin" / "python") in script and str(REPO) not in script
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        kinds = [e.get("event") for e in events]
        assert {"preempted", "resume", "complete"} <= set(kinds), kinds
        logs = user("slurm-train", "logs", job_id)
        assert logs.returncode == 0 and "the user train.py ran" not in logs.stdout
    finally:
        subprocess.run(
            ["scontrol", "update", f"JobId={job_id}", "Requeue=0"],
            env=slurm_env, capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        subprocess.run(["scancel", job_id], env=slurm_env, capture_output=True, check=False)
