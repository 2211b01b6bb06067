"""Hostile strings in names, paths and variables never run anything: quoted or rejected.

The rendered script is actually run under bash with srun replaced by a stub on PATH; a canary
file that any injected command would create must never appear.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from jobs.errors import OverrideError, SpecError
from jobs.load import load_text
from jobs.render import sbatch_script
from jobs.submit import _resolved_text

HOSTILE = [
    "$(touch CANARY)",
    "`touch CANARY`",
    "; touch CANARY",
    "x && touch CANARY #",
    "a'b\"c $(touch CANARY)",
    "with  spaces\tand tab-free",
    "${PATH}$(touch CANARY)",
]


def _spec(value: str) -> str:
    # JSON strings are valid YAML scalars: the hostile value reaches the spec unchanged.
    v = json.dumps(value)
    return (
        "name: demo\n"
        f"environment:\n  variables:\n    HOSTILE: {v}\n"
        f"train:\n  data:\n    path: {v}\n"
    )


@pytest.mark.parametrize("value", [h for h in HOSTILE if "\t" not in h])
def test_rendered_script_runs_nothing_injected(
    value: str, tmp_path: Path, stub_slurm: Path
) -> None:
    loaded = load_text(_spec(value), "spec.yaml")
    run_dir = tmp_path / f"runs {value}"
    script = sbatch_script(loaded.spec, run_dir)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    (workdir / "job.sh").write_text(script)
    proc = subprocess.run(
        ["bash", "job.sh"], cwd=workdir, capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert not list(tmp_path.rglob("CANARY"))
    env = (stub_slurm / "srun-env.txt").read_text().splitlines()
    assert f"HOSTILE={value}" in env  # exported verbatim, not evaluated
    args = (stub_slurm / "srun-args.txt").read_text().splitlines()
    assert f"{run_dir}/slurm/%j_%t_log.out" in args
    assert args[-1] == f"{run_dir}/slurm"  # the submitit folder, one argument
    # The data path travels in the resolved spec file (read by train), not through the shell.
    resolved = yaml.safe_load(_resolved_text(loaded.tasks[0]))
    assert resolved["train"]["data"]["path"] == value
    assert resolved["environment"]["variables"]["HOSTILE"] == value


@pytest.mark.parametrize(
    "text",
    [
        'name: demo\ntrain: {}\nenvironment:\n  variables:\n    A: "x\\ny"\n',
        'name: demo\ntrain:\n  data:\n    path: "/data\\n$(touch CANARY)"\n',
        'name: demo\ntrain: {}\nenvironment:\n  setup: ["echo ok\\r\\ntouch CANARY"]\n',
        'name: demo\ntrain: {}\nenvironment:\n  variables:\n    A: "tab\\there"\n',
        'name: "demo\\n"\ntrain: {}\n',
    ],
)
def test_control_characters_are_rejected(text: str) -> None:
    with pytest.raises(SpecError, match="contains a newline or control character"):
        load_text(text, "spec.yaml")


@pytest.mark.parametrize(
    "override", ["environment.variables.A=x\ny", "name=a\rb", "train.data.path=\x00"]
)
def test_override_with_control_characters_is_rejected(override: str) -> None:
    with pytest.raises(OverrideError, match="newline or control character"):
        load_text("name: demo\ntrain: {}\n", "spec.yaml", [override])


@pytest.mark.parametrize("name", ["$(touch CANARY)", "`id`", "a;b", "a b", "../up", "-rf"])
def test_hostile_names_are_rejected(name: str) -> None:
    with pytest.raises(SpecError, match="is not a job name"):
        load_text(f"name: {json.dumps(name)}\ntrain: {{}}\n", "spec.yaml")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("resources.partition", "debug;touch CANARY"),
        ("resources.account", "$(id)"),
        ("resources.gres", "gpu:2 --wrap=x"),
        ("launch.mpi", "pmix;id"),
        ("environment.variables.A_B", "fine"),
    ],
)
def test_sbatch_values_are_checked_or_quoted(field: str, value: str) -> None:
    text = "name: demo\ntrain: {}\n"
    if field.startswith("environment"):
        loaded = load_text(text, "spec.yaml", [f"{field}={json.dumps(value)}"])
        assert "export A_B=fine" in sbatch_script(loaded.spec, Path("/r"))
        return
    with pytest.raises(SpecError, match="is not a valid"):
        load_text(text, "spec.yaml", [f"{field}={json.dumps(value)}"])
