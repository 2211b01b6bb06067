"""The command line never imports torch (it would cost ~1 s per command)."""

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
