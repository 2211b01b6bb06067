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
    env["SLURM_TRAIN_NO_CACHE"] = "1"  # the full validation path, not the dry-run cache
    names = _imported(args, env)
    assert "jobs.cli" in names
    assert not {n for n in names if n == "torch" or n.startswith("torch.")}
    assert "numpy" not in names


def test_cached_dry_run_skips_validation_and_pydantic(tmp_path: Path) -> None:
    """A repeated dry-run of an unchanged spec renders from the cache: no pydantic, no PyYAML."""
    env = dict(os.environ)
    env["SLURM_TRAIN_STATE_DIR"] = str(tmp_path)
    env.pop("SLURM_TRAIN_NO_CACHE", None)
    args = ["submit", "examples/cifar.yaml", "--dry-run"]
    first = _imported(args, env)
    assert "jobs.spec" in first  # the miss validates
    second = _imported(args, env)
    assert "submitit" in second  # submitit's own function renders the script
    assert not {n for n in second if n.split(".")[0] in ("pydantic", "pydantic_core", "yaml")}
    assert "jobs.spec" not in second


def test_dry_run_cache_key_follows_the_installed_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs import drycache

    key = drycache.cache_key("name: x\n", [])
    assert key == drycache.cache_key("name: x\n", [])
    stamp = drycache._library_stamp()
    assert {s[0] for s in stamp if s[0].endswith("__init__.py")} >= {
        str(Path(__import__(m).__file__)) for m in ("pydantic", "submitit", "yaml")
    }
    monkeypatch.setattr(drycache, "_library_stamp", lambda: [*stamp, ["pydantic", "upgraded"]])
    assert drycache.cache_key("name: x\n", []) != key
