"""Fixtures for jobs unit tests: an isolated run index and stub Slurm commands on PATH."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

# A stub sbatch: keeps a copy of every submitted script (its last argument) and answers like
# the real one (just the id with --parsable).
SBATCH = """#!/bin/sh
n=$(ls "$STUB_DIR"/submitted-*.sh 2>/dev/null | wc -l)
for arg in "$@"; do script="$arg"; done
cp "$script" "$STUB_DIR/submitted-$n.sh"
printf '%s\\n' "$@" > "$STUB_DIR/sbatch-args-$n.txt"
case " $* " in
  *" --parsable "*) echo "$((4242 + n))" ;;
  *) echo "Submitted batch job $((4242 + n))" ;;
esac
"""
# A stub srun: records its arguments and the environment instead of launching anything.
SRUN = """#!/bin/sh
printf '%s\\n' "$@" > "$STUB_DIR/srun-args.txt"
env > "$STUB_DIR/srun-env.txt"
"""


@pytest.fixture(autouse=True)
def isolated_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own run index, runs directory and dry-run cache."""
    state = tmp_path / "state"
    monkeypatch.setenv("SLURM_TRAIN_STATE_DIR", str(state))
    monkeypatch.setenv("SLURM_TRAIN_RUNS_DIR", str(tmp_path / "runs"))
    return state


@pytest.fixture
def stub_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """sbatch/srun stubs first on PATH; returns the directory they write to."""
    bin_dir = tmp_path / "stub-bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", SBATCH), ("srun", SRUN)):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STUB_DIR", str(bin_dir))
    return bin_dir
