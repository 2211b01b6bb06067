"""resources.nodes "MIN-MAX": the spec, the sbatch line, the preflight's shapes, the history."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from cluster.models import ClusterState, Node, Partition
from jobs.errors import PreflightError
from jobs.preflight import preflight, shapes_note
from jobs.render import sbatch_script
from jobs.spec import JobSpec
from train.history import RunHistory


def spec(nodes: Any, **train: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "elastic",
            "resources": {"partition": "debug", "nodes": nodes, "ntasks_per_node": 1},
            "train": {"batch_size": 32, **train},
        }
    )


def state(*node_states: str) -> ClusterState:
    nodes = tuple(Node(f"n{i + 1}", s, 2, {}, ("debug",)) for i, s in enumerate(node_states))
    part = Partition("debug", True, None, tuple(n.name for n in nodes), "UP", "OFF", 1, 6)
    return ClusterState((part,), nodes)


@pytest.mark.parametrize(
    ("given", "kept", "sizes"),
    [("1-2", "1-2", (1, 2)), (" 2 - 4 ", "2-4", (2, 3, 4)), ("3-3", 3, (3,)), (2, 2, (2,))],
)
def test_a_range_of_nodes_is_every_world_size_in_it(given: Any, kept: Any, sizes: tuple) -> None:
    s = spec(given, batch_size=96) if 3 in sizes else spec(given)
    assert s.resources.nodes == kept and s.world_sizes == sizes
    assert s.world_size == sizes[-1]  # train.grad_accum is for the most nodes


@pytest.mark.parametrize("bad", ["2-1", "0-2", "1-2-3", "two", True, "1-"])
def test_a_bad_range_is_refused_naming_the_field(bad: Any) -> None:
    with pytest.raises(ValidationError, match=r"resources\.nodes"):
        spec(bad)


def test_the_batch_must_split_over_every_shape_the_range_allows() -> None:
    with pytest.raises(ValidationError, match=r"does not split over 3 ranks.*\[2, 3, 4\]"):
        spec("2-4", batch_size=8)  # 8 over 4 ranks, but not over 3
    with pytest.raises(ValidationError, match="strategy single runs in one process on one"):
        JobSpec.model_validate(
            {"name": "x", "resources": {"nodes": "1-2"}, "train": {"strategy": "single"}}
        )


def test_slurm_gets_the_range_and_srun_the_tasks_per_node(tmp_path: Path) -> None:
    # with --ntasks-per-node in the allocation Slurm would take the fewest nodes of the range
    script = sbatch_script(spec("1-2"), tmp_path)
    assert "#SBATCH --nodes=1-2\n" in script and "--ntasks-per-node" not in script.split("srun")[0]
    assert "#SBATCH --cpus-per-task=1\n" in script
    assert "--ntasks-per-node=1 --cpus-per-task=1" in script.split("srun")[1]
    two = JobSpec.model_validate(
        {
            "name": "e",
            "resources": {"nodes": "1-2", "ntasks_per_node": 2, "cpus_per_task": 3},
            "train": {"batch_size": 32},
        }
    )
    script = sbatch_script(two, tmp_path)
    assert "#SBATCH --cpus-per-task=6\n" in script  # one block per node: 2 tasks x 3 CPUs
    assert "--ntasks-per-node=2 --cpus-per-task=3" in script.split("srun")[1]
    fixed = sbatch_script(spec(2), tmp_path)
    assert "#SBATCH --ntasks-per-node=1\n" in fixed


def test_preflight_runs_a_range_on_what_is_free_and_says_which_shapes() -> None:
    s = spec("1-2")
    assert preflight(s, None, state=state("idle", "down")) == "debug"  # type: ignore[arg-type]
    note = shapes_note(s, state("idle", "down"))
    assert note is not None
    assert "1 node x 1 (world size 1), 2 nodes x 1 (world size 2)" in note
    assert "1 of 2 node(s) usable" in note
    assert shapes_note(spec(2), state("idle", "idle")) is None
    with pytest.raises(PreflightError, match=r"resources\.nodes: only 0 usable"):
        preflight(s, None, state=state("down", "down"))  # type: ignore[arg-type]
    with pytest.raises(PreflightError, match=r"resources\.nodes: 1-3 nodes .* at most 2"):
        preflight(spec("1-3", batch_size=96), None, state=state("idle", "idle"))  # type: ignore[arg-type]


def test_history_says_a_resume_changed_the_shape(tmp_path: Path) -> None:
    events = [
        {"event": "start", "step": 0, "world_size": 2, "num_nodes": 2},
        {"event": "preempted", "step": 40},
        {
            "event": "resume",
            "step": 40,
            "world_size": 1,
            "num_nodes": 1,
            "was_world_size": 2,
            "was_num_nodes": 2,
        },
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert "resumed at step 40 on 1 node (was 2)" in RunHistory(tmp_path).summary()
    same_nodes = {**events[2], "num_nodes": 1, "was_num_nodes": 1, "was_world_size": 4}
    (tmp_path / "events.jsonl").write_text(json.dumps(same_nodes) + "\n")
    assert "resumed at step 40 on 1 rank (was 4)" in RunHistory(tmp_path).summary()
    (tmp_path / "events.jsonl").write_text(json.dumps(events[0] | {"event": "resume"}) + "\n")
    assert RunHistory(tmp_path).summary().endswith("resumed at step 0")
