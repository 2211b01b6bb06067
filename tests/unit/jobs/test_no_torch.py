"""The command line never imports torch (it would cost ~1 s per command); submitit only where
it renders the script (``submit``, ``--dry-run``: issue 41, bench/README's CLI figures); and
how ``python -m jobs`` runs the collector."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _imported(args: list[str], env: dict[str, str]) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "jobs", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode in (0, 2), proc.stderr[-2000:]
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    assert names, "python -X importtime printed nothing"
    return names


@pytest.mark.parametrize(
    "args",
    [
        ["submit", "examples/cifar.yaml", "--dry-run"],
        ["submit", "examples/cifar.yaml", "--dry-run", "--set", "train.max_steps=oops"],
        ["submit", "examples/cifar.yaml", "--dry-run", "--executor", "local"],
        ["list"],
        ["status", "nothing-like-this"],
    ],
)
def test_cli_does_not_import_torch(args: list[str], tmp_path: Path) -> None:
    env = dict(os.environ)
    env["SLURM_TRAIN_STATE_DIR"] = str(tmp_path)
    names = _imported(args, env)
    assert "jobs.cli" in names
    assert not {n for n in names if n == "torch" or n.startswith("torch.")}
    assert "numpy" not in names


def test_dry_run_renders_through_submitit_and_the_rest_never_imports_it(tmp_path: Path) -> None:
    # Issue 41: the script is submitit's own rendering (jobs.executor); commands that render
    # nothing (list, status) do not pay for submitit's import.
    env = dict(os.environ)
    env["SLURM_TRAIN_STATE_DIR"] = str(tmp_path)
    names = _imported(["submit", "examples/cifar.yaml", "--dry-run"], env)
    assert {"jobs.render", "jobs.executor", "submitit.slurm.slurm"} <= names
    for args in (["list"], ["status", "nothing-like-this"]):
        names = _imported(args, env)
        assert not {n for n in names if n == "submitit" or n.startswith("submitit.")}


@pytest.mark.parametrize(
    ("args", "enabled"),
    [
        (["submit", "examples/cifar.yaml", "--dry-run"], False),
        (["submit", "examples/cifar.yaml", "--follow", "--dry-run"], True),
        (["logs", "some-run", "--follow"], True),
        (["drill", "some-run", "--kind", "cancel"], True),
        (["list", "--no-state"], False),
    ],
)
def test_long_commands_run_with_the_collector_on(
    args: list[str], enabled: bool, tmp_path: Path
) -> None:
    # python -m jobs turns the collector off for start-up (jobs/__main__.py); a command that
    # may run for hours must turn it back on, a short one leaves it off. Every command here
    # ends quickly (bad input, nothing recorded), after the decision.
    code = (
        "import gc, io, sys\n"
        "gc.disable()\n"
        "from jobs.cli import main\n"
        f"main({args!r}, io.StringIO())\n"
        "print(gc.isenabled())\n"
    )
    env = dict(os.environ)
    env["SLURM_TRAIN_STATE_DIR"] = str(tmp_path)
    env["SLURM_TRAIN_RUNS_DIR"] = str(tmp_path / "runs")
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.stdout.strip() == str(enabled), proc.stderr[-2000:]


_ALIAS_BOMB = "a: &a [1,1,1,1,1,1,1,1,1]\n" + "".join(
    f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.parametrize(
    "text",
    [
        "name: demo\ntrain: [[[[\n",  # broken YAML
        _ALIAS_BOMB,  # 9**9 items once expanded
        "name: demo\nname: again\n",  # a duplicate key
    ],
)
def test_a_file_refused_as_yaml_never_loads_pydantic(text: str, tmp_path: Path) -> None:
    # Hostile input is refused before the models are built (bench: refuse the worst input).
    spec = tmp_path / "bad.yaml"
    spec.write_text(text)
    env = dict(os.environ)
    env["SLURM_TRAIN_STATE_DIR"] = str(tmp_path)
    names = _imported(["submit", str(spec), "--dry-run"], env)
    assert "jobs.load" in names
    assert not {n for n in names if n == "pydantic" or n.startswith(("pydantic.", "jobs.spec"))}


def test_a_real_submission_renders_and_pickles_through_submitit(
    tmp_path: Path, stub_slurm: Path
) -> None:
    # The script (jobs.executor) and the pickles (submitit's DelayedSubmission) are submitit's;
    # torch stays out. sbatch is a stub here; --no-preflight: no sinfo.
    env = dict(os.environ)  # the stub first on PATH (the fixture)
    env["SLURM_TRAIN_STATE_DIR"] = str(tmp_path / "state")
    env["SLURM_TRAIN_RUNS_DIR"] = str(tmp_path / "runs")
    args = ["submit", "examples/cifar.yaml", "--executor", "slurm", "--no-preflight"]
    names = _imported(args, env)
    assert {"jobs.launch", "jobs.executor", "submitit.core.utils"} <= names
    assert not {n for n in names if n == "torch" or n.startswith("torch.")}
    assert (stub_slurm / "submitted-0.sh").exists()
    assert len(list((tmp_path / "runs").glob("*/slurm/4242_submitted.pkl"))) == 1
