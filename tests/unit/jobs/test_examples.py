"""Every shipped example (``examples/**/*.yaml``) is accepted by the command its own header gives,
and ``jobs`` and ``train`` accept the same spec files (one rule: train.spec.config.check_sections).

The command run is the first header line of the example that names ``python -m jobs submit``,
as written there, with ``--dry-run`` in place of ``--follow`` (nothing is submitted).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from train.errors import SpecError
from train.spec.config import load_run_config

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted(p.relative_to(REPO) for p in (REPO / "examples").rglob("*.yaml"))


def _header_command(path: Path) -> list[str]:
    """The first comment line at the top of ``path`` that names ``python -m jobs submit``."""
    for line in (REPO / path).read_text().splitlines():
        if not line.startswith("#"):
            break
        text = line.lstrip("#").strip()
        if "python -m jobs submit" in text:
            argv = shlex.split(text[text.index("python -m jobs submit") :])
            return [a for a in argv if a != "--follow"]
    raise AssertionError(f"{path}: no `python -m jobs submit` line in its header comment")


def test_there_are_examples_in_subfolders_too() -> None:
    assert len(EXAMPLES) >= 7
    assert any(len(p.parts) > 2 for p in EXAMPLES)


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_every_example_is_accepted_by_its_own_command(example: Path, tmp_path: Path) -> None:
    argv = _header_command(example)
    assert argv[:4] == ["python", "-m", "jobs", "submit"] and str(example) in argv, argv
    proc = subprocess.run(
        [sys.executable, *argv[1:], "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"{shlex.join(argv)} --dry-run: {proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_train_accepts_every_example_too(example: Path) -> None:
    config = load_run_config(REPO / example)
    assert config.train is not None


def test_jobs_and_train_refuse_a_spec_that_runs_nothing_in_the_same_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from jobs.cli import main

    spec = tmp_path / "spec.yaml"
    spec.write_text("name: demo\nrequeue:\n  max_preemptions: 3\n")
    assert main(["submit", str(spec), "--dry-run"]) == 2
    jobs_line = capsys.readouterr().err.strip().splitlines()[-1]
    with pytest.raises(SpecError) as info:
        load_run_config(spec)
    train_line = str(info.value).strip().splitlines()[-1]
    assert f"{spec}:1:1: train: give `train:`" in train_line
    assert jobs_line.endswith(train_line), (jobs_line, train_line)


def test_user_code_with_train_settings_skips_the_trainers_rules(tmp_path: Path) -> None:
    """``train:`` beside ``entrypoint:`` holds settings the code reads: a batch the built-in
    trainer could not split over 3 ranks is the code's business, in jobs as in train."""
    from jobs.load import load_spec

    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: demo\nresources:\n  nodes: 3\n  ntasks_per_node: 1\n"
        'entrypoint:\n  function: "pkg.mod:main"\ntrain:\n  batch_size: 128\n'
    )
    assert load_run_config(spec).train.batch_size == 128
    load_spec(spec)
