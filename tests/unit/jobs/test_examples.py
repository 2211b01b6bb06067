"""Every shipped example (``examples/**/*.yaml``) is accepted by the command its own header gives,
and ``jobs`` and ``train`` accept the same spec files (one rule: train.spec.config.check_sections).

Every command line of an example's header comment is run as written there: ``python -m jobs
submit`` with ``--dry-run`` in place of ``--follow`` (nothing is submitted), ``python -m train``
for two steps in a temporary run directory (its own ``--run-dir`` replaced).
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


def _header_commands(path: Path) -> list[list[str]]:
    """The commands (``python -m ...``) the comment at the top of ``path`` gives, in order."""
    out = []
    for line in (REPO / path).read_text().splitlines():
        if not line.startswith("#"):
            break
        if "python -m " in line:
            out.append(shlex.split(line[line.index("python -m ") :]))
    return out


COMMANDS = [
    pytest.param(example, argv, id=f"{example}:{i}")
    for example in EXAMPLES
    for i, argv in enumerate(_header_commands(example))
]


def test_there_are_examples_in_subfolders_too() -> None:
    assert len(EXAMPLES) >= 7
    assert any(len(p.parts) > 2 for p in EXAMPLES)


def test_every_example_names_its_jobs_submit_command() -> None:
    for example in EXAMPLES:
        commands = _header_commands(example)
        assert any(c[:4] == ["python", "-m", "jobs", "submit"] for c in commands), example
        assert all(str(example) in c for c in commands), (example, commands)


@pytest.mark.parametrize(("example", "argv"), COMMANDS)
def test_every_example_is_accepted_by_the_commands_its_header_gives(
    example: Path, argv: list[str], tmp_path: Path
) -> None:
    assert argv[:2] == ["python", "-m"] and argv[2] in ("jobs", "train"), argv
    run = [sys.executable, *argv[1:]]
    if argv[2] == "jobs":
        assert argv[3] == "submit", argv
        run = [a for a in run if a != "--follow"] + ["--dry-run"]
    else:  # python -m train: two steps, in a directory of the test's own
        if "--run-dir" in run:
            run[run.index("--run-dir") + 1] = str(tmp_path / "run")
        run += ["--set", "train.max_steps=2"]
    proc = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"{shlex.join(argv)}: {proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr


#: a pipeline (``stages:``, jobs.pipeline) is no spec train runs: each of its stages is
PIPELINES = [p for p in EXAMPLES if "\nstages:" in (REPO / p).read_text()]


@pytest.mark.parametrize("example", [p for p in EXAMPLES if p not in PIPELINES], ids=str)
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
