"""Bad specs, each with the exact one-line error the user sees (file:line:column: field: ...)."""

# ruff: noqa: E501  (the table holds whole error lines on purpose)

from __future__ import annotations

import io
from pathlib import Path

import pytest

from jobs.cli import main
from jobs.errors import SpecError
from jobs.load import load_text

BAD_SPECS = [
    pytest.param(
        "name: demo\ntrain: {}\nresorces: {nodes: 2}\n",
        "spec.yaml:3:1: resorces: unknown field (valid: entrypoint, environment, launch, name, requeue, resources, sweep, train)",
        id="unknown_top",
    ),
    pytest.param(
        "name: demo\nresources:\n  time: 90 minutes\ntrain: {}\n",
        "spec.yaml:3:9: resources.time: not a Slurm time: '90 minutes' (use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, e.g. 30, 2:00:00 or 1-12:00:00)",
        id="bad_time",
    ),
    pytest.param(
        "name: demo\nresources:\n  time: 0\ntrain: {}\n",
        "spec.yaml:3:9: resources.time: a time limit of 0 lets nothing run (give e.g. 30 or 2:00:00)",
        id="zero_time",
    ),
    pytest.param(
        "name: demo\nresources:\n  gpus_per_node: 2\n  ntasks_per_node: 4\ntrain: {}\n",
        "spec.yaml:4:20: resources.ntasks_per_node: 4 tasks per node but 2 GPUs per node: DDP runs one task per GPU (set ntasks_per_node: 2, or gpus_per_node: 4)",
        id="ddp_tasks_gt_gpus",
    ),
    pytest.param(
        "name: demo\nresources:\n  gpus_per_node: 4\n  ntasks_per_node: 4\ntrain:\n  strategy: dp\n",
        "spec.yaml:4:20: resources.ntasks_per_node: strategy dp runs one task per node that uses all its devices (set ntasks_per_node: 1, or train.strategy: ddp)",
        id="dp_tasks",
    ),
    pytest.param(
        "name: demo\nresources:\n  nodes: 2\n  gpus_per_node: 4\ntrain:\n  strategy: dp\n",
        "spec.yaml:3:10: resources.nodes: strategy dp runs in one process on one node (set nodes: 1, or train.strategy: ddp for several nodes)",
        id="dp_nodes",
    ),
    pytest.param(
        "name: 'my job'\ntrain: {}\n",
        "spec.yaml:1:7: name: 'my job' is not a job name (1-64 of letters, digits, '.', '_', '-'; starts with a letter or digit)",
        id="bad_name",
    ),
    pytest.param(
        "name: '$(touch CANARY)'\ntrain: {}\n",
        "spec.yaml:1:7: name: '$(touch CANARY)' is not a job name (1-64 of letters, digits, '.', '_', '-'; starts with a letter or digit)",
        id="hostile_name",
    ),
    pytest.param(
        "name: demo\ntrain:\n  optimizer:\n    lr: 1e-3\n",
        "spec.yaml:4:9: train.optimizer.lr: Input should be a valid number (got '1e-3'; YAML reads 1e-3 as text, write 1.0e-3)",
        id="float_e",
    ),
    pytest.param(
        "name: demo\ntrain:\n  batch_size: two\n",
        "spec.yaml:3:15: train.batch_size: Input should be a valid integer (got 'two'; write the value without quotes)",
        id="int_type",
    ),
    pytest.param(
        "train: {}\n",
        "spec.yaml:1:1: name: required field is missing (add it)",
        id="missing_name",
    ),
    pytest.param(
        "name: demo\n",
        "spec.yaml:1:1: train: give `train:` (the built-in trainer) or `entrypoint:` (your code); add `train: {}` for the trainer's defaults",
        id="no_section",
    ),
    pytest.param(
        "name: demo\ntrain:\n  model: vgg\n",
        "spec.yaml:3:10: train.model: Input should be 'resnet' or 'tinycnn' (got 'vgg')",
        id="literal",
    ),
    pytest.param(
        "name: demo\nresources:\n  nodes: 0\ntrain: {}\n",
        "spec.yaml:3:10: resources.nodes: Input should be greater than or equal to 1 (got 0)",
        id="negative_nodes",
    ),
    pytest.param(
        "name: demo\nresources:\n  gpus_per_node: 2\n  gres: gpu:2\ntrain: {}\n",
        "spec.yaml:4:9: resources.gres: gpus given twice: gpus_per_node and gres (keep one: gpus_per_node: N or gres: gpu:N)",
        id="gpus_twice",
    ),
    pytest.param(
        "name: demo\nresources:\n  mem: lots\ntrain: {}\n",
        "spec.yaml:3:8: resources.mem: 'lots' is not a valid memory size (e.g. 16G, 4000M)",
        id="bad_mem",
    ),
    pytest.param(
        "name: demo\ntrain: {}\nsweep:\n  grid:\n    train.optimizer.lrr: [0.1, 0.2]\n",
        "spec.yaml:5:5: sweep.grid.train.optimizer.lrr: no such field (valid here: lr, momentum, name, nesterov, schedule, warmup_steps, weight_decay)",
        id="sweep_unknown",
    ),
    pytest.param(
        "name: demo\ntrain: {}\nsweep:\n  grid:\n    resources.nodes: [1, 2]\n",
        "spec.yaml:5:5: sweep.grid.resources.nodes: cannot vary inside one job array, all tasks share one sbatch script (sweep train.*, entrypoint.* or requeue.max_*; submit separate specs for other fields)",
        id="sweep_resources",
    ),
    pytest.param(
        "name: demo\ntrain: {}\nsweep:\n  grid:\n    train.model: [resnet, vgg]\n",
        "spec.yaml:5:27: (sweep point train.model='vgg') train.model: Input should be 'resnet' or 'tinycnn' (got 'vgg')",
        id="sweep_bad_value",
    ),
    pytest.param(
        'name: demo\ntrain: {}\nenvironment:\n  variables:\n    GREETING: "hi\\nthere"\n',
        "spec.yaml:5:15: environment.variables.GREETING: contains a newline or control character (values must be one line of printable text)",
        id="newline_var",
    ),
    pytest.param(
        "name: demo\ntrain: {}\nenvironment:\n  variables:\n    'A-B': x\n",
        "spec.yaml:5:5: environment.variables: 'A-B' is not a variable name (letters, digits, _)",
        id="bad_var_name",
    ),
    pytest.param(
        "name: demo\ntrain: [1\n",
        "spec.yaml:3:1: yaml: while parsing a flow sequence did not find expected ',' or ']' (fix the YAML syntax)",
        id="yaml_syntax",
    ),
    pytest.param(
        "name: demo\n\ttrain: {}\n",
        "spec.yaml:2:1: yaml: while scanning a plain scalar found a tab character that violates indentation (fix the YAML syntax)",
        id="yaml_tab",
    ),
    pytest.param(
        "- name: demo\n",
        "spec.yaml:1:1: (top level): the spec must be a mapping (name:, resources:, train: ...; see examples/cifar.yaml)",
        id="not_mapping",
    ),
    pytest.param(
        "name: demo\nresources:\n  time: 1\nrequeue:\n  signal_delay_s: 90\ntrain: {}\n",
        "spec.yaml:5:19: requeue.signal_delay_s: signal 90s before the end of a 60s job would arrive at the start (lower it or raise resources.time)",
        id="signal_delay",
    ),
    pytest.param(
        "name: demo\nrequeue:\n  signal: KILL\ntrain: {}\n",
        "spec.yaml:3:11: requeue.signal: unknown or uncatchable signal 'KILL'; use one of USR1, USR2, TERM, INT, HUP",
        id="bad_signal",
    ),
    pytest.param(
        "name: demo\nresources:\n  nodes: 3\ntrain:\n  batch_size: 128\n",
        "spec.yaml:5:15: train.batch_size: global batch 128 does not split evenly over 3 ranks x 1 micro-steps (use a multiple of 3)",
        id="batch_split",
    ),
    pytest.param(
        "name: demo\nlaunch:\n  sbatch_args:\n    output: /tmp/x\ntrain: {}\n",
        "spec.yaml:4:5: launch.sbatch_args: --output is set by jobs itself and cannot be overridden",
        id="reserved_sbatch",
    ),
    pytest.param(
        "name: demo\nlaunch:\n  srun_args: [x]\ntrain: {}\n",
        "spec.yaml:3:14: launch.srun_args: 'x' is not an option; write each as --name=value",
        id="srun_arg",
    ),
]


@pytest.mark.parametrize(("text", "expected"), BAD_SPECS)
def test_bad_spec_exact_error(text: str, expected: str) -> None:
    with pytest.raises(SpecError) as info:
        load_text(text, "spec.yaml")
    assert str(info.value) == expected
    assert "\n" not in str(info.value)


def test_unknown_train_field_lists_valid_names() -> None:
    with pytest.raises(
        SpecError, match=r"^spec\.yaml:3:3: train\.modle: unknown field \(valid: .*model,"
    ):
        load_text("name: demo\ntrain:\n  modle: resnet\n", "spec.yaml")


def test_several_problems_one_line_each() -> None:
    text = "name: demo\nresources:\n  nodes: 0\n  mem: lots\ntrain: {}\n"
    with pytest.raises(SpecError) as info:
        load_text(text, "spec.yaml")
    assert info.value.lines == [
        "spec.yaml:3:10: resources.nodes: Input should be greater than or equal to 1 (got 0)",
        "spec.yaml:4:8: resources.mem: 'lots' is not a valid memory size (e.g. 16G, 4000M)",
    ]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["train.max_steps=abc"],
            "--set train.max_steps=abc: train.max_steps: Input should be a valid integer "
            "(got 'abc'; write the value without quotes)",
        ),
        (
            ["resources.nodes=0"],
            "--set resources.nodes=0: resources.nodes: Input should be greater than or equal to 1 "
            "(got 0)",
        ),
        (
            ["resources.time=1:00:00:00:00"],
            "--set resources.time=1:00:00:00:00: resources.time: not a Slurm time: '1:00:00:00:00' "
            "(use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, e.g. 30, 2:00:00 or "
            "1-12:00:00)",
        ),
        (
            ["name=$(touch CANARY)"],
            "--set name=$(touch CANARY): name: '$(touch CANARY)' is not a job name (1-64 of "
            "letters, digits, '.', '_', '-'; starts with a letter or digit)",
        ),
    ],
)
def test_override_errors_point_at_the_override(overrides: list[str], expected: str) -> None:
    with pytest.raises(SpecError) as info:
        load_text("name: demo\ntrain: {}\n", "spec.yaml", overrides)
    assert str(info.value) == expected


def test_cli_prints_the_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: demo\nresources:\n  time: 90 minutes\ntrain: {}\n")
    code = main(["submit", str(spec), "--dry-run"], out=io.StringIO())
    err = capsys.readouterr().err
    assert code == 2
    assert err == (
        f"{spec}:3:9: resources.time: not a Slurm time: '90 minutes' (use minutes, MM:SS, "
        "HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, e.g. 30, 2:00:00 or 1-12:00:00)\n"
    )
    assert "Traceback" not in err
