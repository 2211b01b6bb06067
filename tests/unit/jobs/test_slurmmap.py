"""THE table spec field -> sbatch option (jobs.slurmmap): every direction derives from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.load import load_text
from jobs.render import RESOURCE_KEYS, sbatch_script
from jobs.sbatchopts import SPEC_FIELDS, check_sbatch_arg
from jobs.slurmmap import FIELD_OF_OPTION, ROWS
from jobs.spec import JobSpec, Resources, Sweep

# A spec that sets each field to something the default does not write, by field.
_SET = {
    "name": "name: shown",
    "resources.partition": "resources: {partition: debug}",
    "resources.nodes": "resources: {nodes: 4}",
    "resources.ntasks_per_node": "resources: {ntasks_per_node: 2}",
    "resources.gres": "resources: {gres: 'nvme:1'}",
    "resources.gpus_per_node": "resources: {gpus_per_node: 2}",
    "resources.cpus_per_task": "resources: {cpus_per_task: 3}",
    "resources.mem": "resources: {mem: 16G}",
    "resources.time": "resources: {time: '1:00:00'}",
    "resources.account": "resources: {account: a1}",
    "resources.qos": "resources: {qos: high}",
    "resources.constraint": "resources: {constraint: a100}",
    "resources.exclusive": "resources: {exclusive: true}",
    "sweep": "sweep: {grid: {train.seed: [1, 2]}}",
    "sweep.max_parallel": "sweep: {max_parallel: 2, grid: {train.seed: [1, 2]}}",
}


def _description(field: str) -> str:
    section, _, name = field.rpartition(".")
    model: type = {"resources": Resources, "sweep": Sweep}.get(section, JobSpec)
    text = model.model_fields[name].description
    assert text, field
    return str(text)


def _row_fields() -> list[str]:
    return [f for row in ROWS for f in row.fields if not f.startswith("requeue.")]


@pytest.mark.parametrize("field", _row_fields())
def test_each_fields_description_names_the_option_the_script_writes(field: str) -> None:
    row = next(r for r in ROWS if field in r.fields)
    assert f"--{row.option}" in _description(field)
    text = _SET[field]
    spec = text if field == "name" else f"name: x\n{text}"
    loaded = load_text(f"{spec}\ntrain: {{}}\n", "spec.yaml", ())
    size = len(loaded.tasks) if loaded.is_array else None
    script = sbatch_script(loaded.spec, Path("/runs/x"), size)
    lines = script.splitlines()
    assert any(ln.split("=")[0] == f"#SBATCH --{row.option}" for ln in lines), field


def test_gpus_per_node_says_and_writes_gres() -> None:
    # The description said --gpus-per-node while --gres=gpu:N was written (issue 41).
    assert "--gres=gpu:N" in _description("resources.gpus_per_node")
    assert "--gpus-per-node" not in _description("resources.gpus_per_node")


def test_every_resources_field_is_a_row_of_the_table() -> None:
    # Adding a field that asks Slurm for something is one row of the table and the model.
    assert set(Resources.model_fields) == {
        f.split(".")[1] for f in _row_fields() if f.startswith("resources.")
    }


def test_the_inverse_and_the_resource_keys_derive_from_the_table() -> None:
    assert SPEC_FIELDS is FIELD_OF_OPTION
    for row in ROWS:
        for option in (row.option, *row.also):
            if row.fields and option not in ("signal", "array", "job-name"):
                field = FIELD_OF_OPTION[option]  # --gres: resources.gres (its first row)
                assert field in {f for r in ROWS if option in (r.option, *r.also) for f in r.fields}
                with pytest.raises(ValueError, match=field.replace(".", r"\.")):
                    check_sbatch_arg(option, "1")
    assert set(RESOURCE_KEYS) == {
        r.option for r in ROWS if r.fields and r.fields[0].startswith("resources.")
    }
    assert FIELD_OF_OPTION["gpus-per-node"] == "resources.gpus_per_node"
    assert FIELD_OF_OPTION["gres"] == "resources.gres"
