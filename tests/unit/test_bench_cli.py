"""The dry-run's import floor (bench/bench_cli.py): a floor, not a discount. It imports only
modules the dry-run imports too, and it names exactly what the dry-run's own modules import
from pydantic (no timing here: the figures are bench's)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from bench.bench_cli import FLOOR, PYDANTIC_NAMES

REPO = Path(__file__).resolve().parents[2]

_MODULES = """
import json, runpy, sys
out = sys.argv[1]
sys.argv = sys.argv[2:]
try:
    if sys.argv[0] == "-c":
        exec(sys.argv[1], {"__name__": "__main__"})
    else:
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
except SystemExit as exc:
    assert exc.code in (0, None), exc.code
with open(out, "w") as f:
    json.dump({n: getattr(m, "__file__", None) for n, m in list(sys.modules.items())}, f)
"""


def _loaded(tmp_path: Path, name: str, *argv: str) -> dict[str, str | None]:
    out = tmp_path / f"{name}.json"
    subprocess.run(
        [sys.executable, "-c", _MODULES, str(out), *argv],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
    )
    loaded: dict[str, str | None] = json.loads(out.read_text())
    return loaded


def _pydantic_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    return {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "pydantic"
        for alias in node.names
    }


def test_the_floor_imports_nothing_the_dry_run_does_not(tmp_path: Path) -> None:
    dry = _loaded(tmp_path, "dry", "jobs", "submit", "--dry-run", "examples/cifar.yaml")
    floor = _loaded(tmp_path, "floor", "-c", FLOOR)
    assert "jobs.spec" in dry and "pydantic.main" in dry  # the dry-run ran, and validated
    extra = sorted(set(floor) - set(dry))
    assert extra == []


def test_the_floor_names_what_the_dry_runs_modules_import_from_pydantic(tmp_path: Path) -> None:
    dry = _loaded(tmp_path, "dry", "jobs", "submit", "--dry-run", "examples/cifar.yaml")
    ours = [
        Path(f)
        for f in dry.values()
        if f and Path(f).is_relative_to(REPO) and ".venv" not in Path(f).parts
    ]
    assert any(p.name == "spec.py" and p.parent.name == "jobs" for p in ours)
    names = set().union(*(_pydantic_names(p) for p in ours))
    assert names == set(PYDANTIC_NAMES)
