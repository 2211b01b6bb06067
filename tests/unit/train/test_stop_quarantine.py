"""Bad nodes (train.stop.quarantine) and how a stop or a failure is attributed to a node.

Slurm is replaced by a small fake that answers what ``scontrol show job`` / ``show node`` /
``show partition`` answered on the local cluster after ``scontrol update nodename=n2
state=down`` under a running 2-node job (JobState=PENDING Reason=BeginTime, Restarts=1, no
PreemptTime; n2 DOWN+NOT_RESPONDING). The real thing is tests/integration/test_cluster_nodefail.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster.models import JobInfo, Node, Partition
from train.env import DistEnv
from train.history import RunHistory
from train.spec.config import RequeueConfig
from train.stop.act import claim_failure, request_requeue
from train.stop.quarantine import device_fault, exclude, explain_previous_attempt, failed_nodes


class Slurm:
    def __init__(
        self, *, restarts: int = 1, preempted: bool = False, down: tuple[str, ...] = ("n2",)
    ):
        self.job = {
            "JobState": "PENDING",
            "Reason": "BeginTime",
            "Restarts": str(restarts),
            "NumNodes": "2",
            "Partition": "debug",
            "ExcNodeList": "(null)",
            "EndTime": "2099-01-01T00:00:00",
        }
        if preempted:
            self.job["PreemptTime"] = "2026-11-23T19:09:23"
        self.down = set(down)
        self.requeued: list[str] = []
        self.excluded: list[list[str]] = []

    def show_job(self, job_id: str) -> dict[str, str]:
        return dict(self.job)

    def nodes(self) -> list[Node]:
        return [
            Node(n, "DOWN+NOT_RESPONDING" if n in self.down else "IDLE", 2)
            for n in ("n1", "n2", "n3")
        ]

    def partition(self, name: str) -> Partition:
        return Partition(name, True, None, ("n1", "n2", "n3"), "UP", "REQUEUE", 1, 6)

    def requeue(self, job_id: str) -> None:
        self.requeued.append(job_id)

    def exclude_nodes(self, job_id: str, nodes: list[str]) -> list[str]:
        self.excluded.append(list(nodes))
        self.job["ExcNodeList"] = ",".join(nodes)
        return sorted(nodes)


def _env(rank: int = 0) -> DistEnv:
    return DistEnv(
        rank=rank, world_size=2, node_rank=rank, num_nodes=2, job_id="7", hosts=("n1", "n2")
    )


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return RunHistory(run_dir).events()


@pytest.mark.parametrize(
    "text",
    [
        "RuntimeError: CUDA error: uncorrectable ECC error encountered",
        "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
        "torch.distributed.DistBackendError: NCCL error in: ..., unhandled system error",
        "RuntimeError: CUDA error: unspecified launch failure",
    ],
)
def test_device_faults_are_recognised(text: str) -> None:
    assert device_fault("ignored", text)


@pytest.mark.parametrize(
    "text",
    [
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "RuntimeError: CUDA error: device-side assert triggered",
        "ValueError: Expected input batch_size (32) to match target batch_size (16)",
        "RuntimeError: Connection closed by peer [127.0.0.1]:29500",
        None,
    ],
)
def test_bugs_and_peers_are_not_device_faults(text: str | None) -> None:
    assert not device_fault(text)


def test_failed_nodes_needs_slurms_requeue_without_preemption_and_a_down_node() -> None:
    hosts = ("n1", "n2")
    slurm = Slurm()
    assert failed_nodes(slurm.show_job("7"), 0, hosts, slurm) == {"n2": "DOWN+NOT_RESPONDING"}
    # not requeued yet (restarts == ours), preempted, or every node fine: not a node failure
    assert failed_nodes(Slurm(restarts=0).job, 0, hosts, Slurm()) is None
    assert failed_nodes(Slurm(preempted=True).job, 0, hosts, Slurm()) is None
    assert failed_nodes(Slurm().job, 0, hosts, Slurm(down=())) is None
    assert failed_nodes(Slurm().job, 0, (), slurm) is None  # outside Slurm: no hosts


def test_a_stop_under_a_node_failure_is_recorded_as_such_and_the_node_quarantined(
    tmp_path: Path,
) -> None:
    slurm = Slurm()
    code = request_requeue(_env(), tmp_path, RequeueConfig(), "signal", step=40, client=slurm)
    assert code == 0
    names = [e["event"] for e in _events(tmp_path)]
    assert names == ["node_fail", "quarantine"], names  # no preemption, no budget, no requeue
    assert slurm.requeued == []  # Slurm requeued it already
    assert slurm.excluded == [["n2"]]
    history = RunHistory(tmp_path)
    assert history.to_dict()["node_failures"] == 1
    assert "n2 excluded after node failure at step 40" in history.summary()


def test_the_peers_connection_error_after_a_node_failure_is_not_a_failure(
    tmp_path: Path,
) -> None:
    """The surviving rank's collective fails when its peer's node dies: that is the node's
    failure, not the training code's, and spends no max_failures."""
    slurm = Slurm()
    code = request_requeue(
        _env(),
        tmp_path,
        RequeueConfig(max_failures=0),
        "failure",
        step=40,
        client=slurm,
        error="RuntimeError: Connection closed by peer",
    )
    assert code == 0
    names = [e["event"] for e in _events(tmp_path)]
    assert names == ["node_fail", "quarantine"], names


def test_a_device_fault_failure_quarantines_the_failing_ranks_node(tmp_path: Path) -> None:
    slurm = Slurm(restarts=0, down=())
    code = request_requeue(
        _env(rank=1),
        tmp_path,
        RequeueConfig(),
        "failure",
        step=12,
        client=slurm,
        error="RuntimeError: CUDA error: uncorrectable ECC error encountered",
    )
    assert code == 1 and slurm.requeued == ["7"]
    assert slurm.excluded == [["n2"]]  # rank 1's node
    quarantine = [e for e in _events(tmp_path) if e["event"] == "quarantine"]
    assert quarantine[0]["reason"] == "device fault at step 12"


def test_an_ordinary_failure_quarantines_nothing(tmp_path: Path) -> None:
    slurm = Slurm(restarts=0, down=())
    request_requeue(
        _env(), tmp_path, RequeueConfig(), "failure", step=3, client=slurm, error="KeyError: 'x'"
    )
    assert slurm.excluded == [] and slurm.requeued == ["7"]


def test_never_excludes_so_many_nodes_that_the_job_cannot_run(tmp_path: Path) -> None:
    slurm = Slurm(down=("n3",))  # n3 down: only n1 would be left for a 2-node job
    assert exclude(tmp_path, "7", ["n2"], "hang at step 5", client=slurm) == []
    (event,) = _events(tmp_path)
    assert event["event"] == "quarantine" and event["nodes"] == []
    assert "needs 2 node(s)" in event["skipped"] and slurm.excluded == []


class Accounting(Slurm):
    """``sacct -D``: the attempts of job 7, oldest first."""

    def __init__(self, *states: str, down: tuple[str, ...] = ("n1",)) -> None:
        super().__init__(down=down)
        self.states = states
        self.asked = 0

    def attempts(self, job_id: str) -> list[JobInfo]:
        self.asked += 1
        return [JobInfo(job_id, s, None, None, "", "n[1-2]", 4, "debug") for s in self.states]


def test_a_silent_attempt_that_slurm_node_failed_is_recorded_at_the_next_start(
    tmp_path: Path,
) -> None:
    """Rank 0 died with its node: nothing was recorded. The next attempt asks sacct."""
    RunHistory(tmp_path).append("start", step=0, restart_count=0, job_id="7")
    slurm = Accounting("NODE_FAIL", "RUNNING")
    event = explain_previous_attempt(tmp_path, "7", 1, client=slurm)
    assert event is not None
    assert (event["event"], event["restart_count"], event["nodes"]) == ("node_fail", 0, ["n1"])
    assert event["late"] is True and event["attempt_nodes"] == ["n1", "n2"]
    assert RunHistory(tmp_path).to_dict()["node_failures"] == 1
    # `jobs status` names the node although nothing was excluded (too late for that)
    assert "node failure 1x (n1)" in RunHistory(tmp_path).summary()


def test_an_attempt_that_went_on_in_place_and_then_fell_silent_is_explained_late(
    tmp_path: Path,
) -> None:
    """A failure decided "restart in place" does not end the attempt: its next step (or the
    batch script, before it) died with its node, silently. The next attempt asks sacct."""
    history = RunHistory(tmp_path)
    history.append("start", step=0, restart_count=0, job_id="7")
    history.append("failure", step=None, restart_count=0, job_id="7", action="restart_in_place")
    history.append("restart_in_place", step=None, restart_count=0, job_id="7", next_in_place=1)
    slurm = Accounting("NODE_FAIL", "RUNNING")
    event = explain_previous_attempt(tmp_path, "7", 1, client=slurm)
    assert event is not None and event["event"] == "node_fail" and event["late"] is True
    assert slurm.asked == 1


def test_an_explained_attempt_costs_no_slurm_query(tmp_path: Path) -> None:
    history = RunHistory(tmp_path)
    history.append("preempted", step=5, restart_count=0, job_id="7")
    slurm = Accounting("NODE_FAIL", "RUNNING")
    assert explain_previous_attempt(tmp_path, "7", 1, client=slurm) is None
    assert slurm.asked == 0
    # the first attempt, and runs outside Slurm, have nothing to explain
    assert explain_previous_attempt(tmp_path, "7", 0, client=slurm) is None
    assert explain_previous_attempt(tmp_path, None, 3, client=slurm) is None
    assert slurm.asked == 0


def test_a_silent_attempt_that_was_not_a_node_failure_is_left_alone(tmp_path: Path) -> None:
    slurm = Accounting("REQUEUED", "RUNNING")  # requeued from outside (an admin)
    assert explain_previous_attempt(tmp_path, "7", 1, client=slurm) is None
    assert RunHistory(tmp_path).events() == []


class _AskedSlurm(Slurm):
    """The same Slurm, keeping what it was asked (a caller may swallow a failed query)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def show_job(self, job_id: str) -> dict[str, str]:
        self.asked.append("show_job")
        return super().show_job(job_id)

    def nodes(self) -> list[Node]:
        self.asked.append("nodes")
        return super().nodes()


def test_a_stop_after_another_rank_claimed_the_failure_asks_slurm_nothing(
    tmp_path: Path,
) -> None:
    # srun ends the step of a failed rank: rank 0's TERM is the echo of a failure already
    # recorded (train.stop.act.ended_elsewhere); whatever Slurm would say, the decision is none
    env = _env()
    assert claim_failure(tmp_path, "7", env.attempt, is_main=False)
    slurm = _AskedSlurm()
    code = request_requeue(env, tmp_path, RequeueConfig(), "signal", step=40, client=slurm)
    assert code == 1
    assert _events(tmp_path) == [] and slurm.asked == []
