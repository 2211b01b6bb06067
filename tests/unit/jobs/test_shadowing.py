"""The user's own train.py / cluster.py / jobs/ never stand in for this project's packages.

Each test runs the real command line as a subprocess in a folder holding a hostile file (one
that prints a marker and exits 7 when imported): ``python -m jobs`` refuses in one line with the
fix (exit 2) and never runs the file; ``slurm-train`` and ``python -P -m jobs`` work there; the
processes a local run starts (``jobs.localrun``, ``python -m train``) take our packages too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from train import safepath

REPO = Path(__file__).resolve().parents[3]
HOSTILE = 'print("HOSTILE-FILE-RAN")\nraise SystemExit(7)\n'
SPEC = """name: shadowed
resources: {nodes: 1, ntasks_per_node: 1, time: 5}
entrypoint:
  command: [sh, -c, 'echo command-ran']
"""
SLURM_TRAIN = Path(sys.executable).parent / "slurm-train"


def _folder(tmp_path: Path, hostile: str = "train.py") -> Path:
    here = tmp_path / "work"
    here.mkdir()
    target = here / hostile
    if hostile.endswith(".py"):
        target.write_text(HOSTILE)
    else:  # a package folder: its __init__ (and a __main__ for `python -m jobs`) are hostile
        target.mkdir()
        (target / "__init__.py").write_text(HOSTILE)
        (target / "__main__.py").write_text(HOSTILE)
    (here / "spec.yaml").write_text(SPEC)
    return here


def _run(cwd: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    return subprocess.run(
        list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.parametrize("hostile", ["train.py", "cluster.py", "train"])
def test_python_m_jobs_refuses_in_one_line_without_running_the_file(
    tmp_path: Path, hostile: str
) -> None:
    here = _folder(tmp_path, hostile)
    proc = _run(here, sys.executable, "-m", "jobs", "submit", "spec.yaml", "--dry-run")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "HOSTILE-FILE-RAN" not in proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    name = hostile.split(".")[0]
    assert lines[0].startswith(f"your ./{hostile}"), lines[0]
    assert f"`{name}` package" in lines[0]
    assert "slurm-train" in lines[0] and "python -P -m jobs" in lines[0]


@pytest.mark.parametrize("hostile", ["train.py", "cluster.py", "jobs"])
def test_slurm_train_and_python_P_work_beside_the_users_files(tmp_path: Path, hostile: str) -> None:
    here = _folder(tmp_path, hostile)
    assert SLURM_TRAIN.exists(), "the console script: pyproject [project.scripts] (make setup)"
    for argv in (
        [str(SLURM_TRAIN), "submit", "spec.yaml", "--dry-run"],
        [sys.executable, "-P", "-m", "jobs", "submit", "spec.yaml", "--dry-run"],
    ):
        proc = _run(here, *argv)
        assert proc.returncode == 0, (argv, proc.stdout[-2000:], proc.stderr[-2000:])
        assert "HOSTILE-FILE-RAN" not in proc.stdout + proc.stderr
        assert proc.stdout.startswith("#!/bin/bash"), proc.stdout[:200]


def test_usage_errors_name_the_command_that_was_run(tmp_path: Path) -> None:
    proc = _run(tmp_path, str(SLURM_TRAIN), "no-such-command")
    assert proc.returncode == 2
    assert proc.stderr.startswith("slurm-train: "), proc.stderr


def test_python_m_jobs_in_the_checkout_itself_is_not_refused() -> None:
    """The checkout's own train/ and cluster/ are ours (the first entry is our root)."""
    proc = _run(REPO, sys.executable, "-m", "jobs", "submit", "examples/cifar.yaml", "--dry-run")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_python_m_train_refuses_a_users_cluster_py(tmp_path: Path) -> None:
    here = _folder(tmp_path, "cluster.py")
    proc = _run(here, sys.executable, "-m", "train", "--help")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "HOSTILE-FILE-RAN" not in proc.stdout + proc.stderr
    assert proc.stderr.strip().startswith("your ./cluster.py shadows")
    assert "python -P -m train" in proc.stderr


@pytest.mark.slow
def test_a_local_run_beside_a_users_train_py_runs_our_packages(tmp_path: Path) -> None:
    """The issue's reproduction: --executor local in a folder with train.py. The supervisor
    (``jobs.localrun``) and each rank (``python -m train``) start with -P in that folder."""
    here = _folder(tmp_path, "train.py")
    proc = _run(here, str(SLURM_TRAIN), "submit", "spec.yaml", "--executor", "local", "--follow")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = proc.stdout.splitlines()[0].strip()
    logs = _run(here, str(SLURM_TRAIN), "logs", run)
    assert "command-ran" in logs.stdout, logs.stdout[-2000:] + logs.stderr[-2000:]
    assert "HOSTILE-FILE-RAN" not in logs.stdout + proc.stdout + proc.stderr


def test_python_module_argv_never_takes_the_working_directory() -> None:
    argv = safepath.python_module_argv("train.hang.watcher", "--pid", "1")
    assert argv[0] == sys.executable
    assert "train.hang.watcher" in argv and argv[-2:] == ["--pid", "1"]
    assert "-P" in argv if sys.version_info >= (3, 11) else "del sys.path[0]" in argv[2]
