"""Preflight against a cluster shape (recorded models, no Slurm needed)."""

from __future__ import annotations

import pytest

from cluster.models import Node, Partition
from jobs.errors import PreflightError
from jobs.load import load_text
from jobs.preflight import preflight

NODES = [
    Node("n1", "IDLE", 2, {"gpu": 2}, ("debug", "urgent")),
    Node("n2", "IDLE", 2, {"gpu": 2}, ("debug", "urgent")),
]
PARTS = [
    Partition("debug", True, 7200, ("n1", "n2"), "UP", "REQUEUE", 1, 4, {"gpu": 2}),
    Partition("urgent", False, 3600, ("n1", "n2"), "UP", "OFF", 2, 4, {"gpu": 2}),
]


class FakeClient:
    def __init__(self, nodes: list[Node] = NODES) -> None:
        self._nodes = nodes

    def nodes(self) -> list[Node]:
        return self._nodes

    def partitions(self) -> list[Partition]:
        return PARTS


def _check(*overrides: str, client: FakeClient | None = None) -> str:
    loaded = load_text("name: d\ntrain: {batch_size: 12}\n", "spec.yaml", overrides)
    return preflight(loaded.spec, client or FakeClient(), loaded.where)  # type: ignore[arg-type]


def test_fits() -> None:
    assert _check("resources.nodes=2") == "debug"
    assert _check("resources.partition=urgent", "resources.gpus_per_node=2") == "urgent"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["resources.partition=gpu"],
            "--set resources.partition=gpu: resources.partition: partition 'gpu' does not exist "
            "on this cluster (available: debug, urgent)",
        ),
        (
            ["resources.time=3:00:00"],
            "--set resources.time=3:00:00: resources.time: 3:00:00 is over partition debug's "
            "MaxTime 02:00:00 (ask for at most 02:00:00; preemption-safe training resumes "
            "across shorter jobs)",
        ),
        (
            ["resources.nodes=3"],
            "--set resources.nodes=3: resources.nodes: 3 nodes but partition debug has 2 (n1, "
            "n2); ask for at most 2",
        ),
        (
            ["resources.gpus_per_node=3", "resources.ntasks_per_node=1"],
            "--set resources.gpus_per_node=3: resources.gpus_per_node: 3 GPUs per node; nodes in "
            "debug have at most 2 (lower the request or pick another partition)",
        ),
        (
            ["resources.ntasks_per_node=3"],
            "--set resources.ntasks_per_node=3: resources.ntasks_per_node: 3 tasks x 1 CPUs per "
            "node; nodes in debug have at most 2 CPUs (lower the request or pick another "
            "partition)",
        ),
    ],
)
def test_rejects_with_reason(overrides: list[str], expected: str) -> None:
    with pytest.raises(PreflightError) as info:
        _check(*overrides)
    assert str(info.value) == expected


def test_down_nodes_are_not_counted() -> None:
    nodes = [NODES[0], Node("n2", "DOWN", 2, {"gpu": 2}, ("debug",))]
    with pytest.raises(PreflightError, match=r"only 1 usable nodes in debug \(n1=IDLE, n2=DOWN\)"):
        _check("resources.nodes=2", client=FakeClient(nodes))
