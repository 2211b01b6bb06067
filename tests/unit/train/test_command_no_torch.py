"""A command's supervisor never imports torch (issue 28): the command imports it once, itself.

Before, ``import train.session`` imported torch, so every start of a command paid for torch twice
(the supervisor's and the command's), on the same cores. ``python -m train`` runs here in a
fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

SPEC = """\
name: no-torch
resources: {{partition: debug, nodes: 1, ntasks_per_node: 1, cpus_per_task: 1, time: "00:05:00"}}
entrypoint:
  command: [python, -c, "import os; open({out!r}, 'w').write(os.getenv('TRAIN_RESUME_FROM', ''))"]
"""


def _supervise(tmp_path: Path, run: Path, *extra: str) -> tuple[str, str]:
    spec = tmp_path / "spec.yaml"
    out = tmp_path / "child.txt"
    spec.write_text(SPEC.format(out=str(out)), encoding="utf-8")
    code = f"""
        import sys
        from train.cli import main
        rc = main(["--config", {str(spec)!r}, "--run-dir", {str(run)!r}, *{list(extra)!r}])
        print(rc, "torch" in sys.modules)
    """
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1], out.read_text(encoding="utf-8")


def test_a_command_start_imports_no_torch(tmp_path: Path) -> None:
    assert _supervise(tmp_path, tmp_path / "run") == ("0 False", "")


def test_a_command_restart_imports_no_torch(tmp_path: Path) -> None:
    # the command keeps its own files (no train.checkpoint directory to verify): a restart of
    # the run decides "start as you would" without torch. (Verifying a train.checkpoint
    # checkpoint still loads shared.pt with torch to check the model digest.)
    run = tmp_path / "run"
    assert _supervise(tmp_path, run) == ("0 False", "")
    assert _supervise(tmp_path, run, "--resume") == ("0 False", "")
