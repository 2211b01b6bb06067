"""One spec run on both executors (issue 45, one spec, one behaviour): a command that writes
what it saw of the spec's ``environment`` (its variables, a setup line's export, the setup's
working directory and umask). tests/unit/jobs/test_local.py runs it locally,
tests/integration/test_jobs_cluster.py on Slurm and locally, and compares."""

from __future__ import annotations

import shlex
from pathlib import Path

SPEC = """name: env-probe
resources: {{nodes: 1, ntasks_per_node: 2, time: 5}}
environment:
  variables: {{STEPS: 60, FLAG: true, QUOTED: "a b;$HOME 'x'"}}
  setup:
    - export FROM_SETUP="steps=$STEPS"
    - umask 027
    - cd {work}
entrypoint:
  command: [sh, -c, '{{ env; echo "pwd=$(pwd)"; echo "umask=$(umask)"; }} > "$RUN_DIR/seen-$RANK"']
"""
KEYS = ("STEPS", "FLAG", "QUOTED", "FROM_SETUP", "pwd", "umask")
EXPECTED = {
    "STEPS": "60",
    "FLAG": "true",
    "QUOTED": "a b;$HOME 'x'",
    "FROM_SETUP": "steps=60",
    "umask": "0027",
}


def write_spec(folder: Path, work: Path, *, setup_exit: int | None = None) -> Path:
    """The probe spec in ``folder``, its setup ending in ``cd work`` (and ``exit N``)."""
    text = SPEC.format(work=shlex.quote(str(work)))
    if setup_exit is not None:
        text = text.replace("    - umask 027\n", f"    - umask 027\n    - exit {setup_exit}\n")
    path = folder / "env-probe.yaml"
    path.write_text(text)
    return path


def seen(run_dir: Path, rank: int) -> dict[str, str]:
    """What rank ``rank`` saw: :data:`KEYS` (``<unset>`` for a variable it did not have)."""
    lines = (run_dir / f"seen-{rank}").read_text().splitlines()
    values = dict(line.split("=", 1) for line in lines if "=" in line)
    return {k: values.get(k, "<unset>") for k in KEYS}
