"""Parsers on outputs recorded from the local cluster (Slurm 22.05) plus real-cluster variants."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster import parse
from cluster.errors import SlurmParseError
from cluster.models import ClusterLimits

DATA = Path(__file__).parent / "data"


def test_key_values_with_spaces() -> None:
    kv = parse.parse_key_values(
        "NodeName=n1 OS=Linux 6.1 #1 SMP  RealMemory=1 Reason=bad disk [root@x]"
    )
    assert kv["OS"] == "Linux 6.1 #1 SMP"
    assert kv["RealMemory"] == "1"
    assert kv["Reason"] == "bad disk [root@x]"


@pytest.mark.parametrize(
    ("text", "gres"),
    [
        ("gpu:2", {"gpu": 2}),
        ("(null)", {}),
        ("", {}),
        ("gpu:a100:4(S:0-1)", {"gpu": 4}),
        ("gpu:a100:4(S:0-1),gpu:v100:2(S:0)", {"gpu": 6}),
        ("gpu:a100:4(S:0-1),shard:8", {"gpu": 4, "shard": 8}),
        ("gpu", {"gpu": 1}),
    ],
)
def test_gres(text: str, gres: dict[str, int]) -> None:
    assert parse.parse_gres(text) == gres


def test_nodes_recorded() -> None:
    nodes = parse.parse_nodes((DATA / "scontrol_nodes.txt").read_text())
    assert [(n.name, n.state, n.cpus, n.gres, n.partitions) for n in nodes] == [
        ("n1", "IDLE", 2, {"gpu": 2}, ("debug", "urgent")),
        ("n2", "IDLE", 2, {"gpu": 2}, ("debug", "urgent")),
    ]
    assert all(n.usable for n in nodes)


def test_node_states() -> None:
    text = (
        "NodeName=a1 CPUTot=64 Gres=gpu:a100:8(S:0-1) State=MIXED+DRAIN Partitions=gpu\n"
        "NodeName=a2 CPUTot=64 Gres=(null) State=DOWN* Partitions=cpu\n"
        "NodeName=a3 CPUTot=64 Gres=(null) State=ALLOCATED+FAIL Partitions=cpu\n"
        "NodeName=a4 CPUTot=64 Gres=(null) State=IDLE+POWERED_DOWN Partitions=cpu\n"
        "NodeName=a5 CPUTot=64 Gres=(null) State=MIXED+PLANNED Partitions=cpu\n"
    )
    a1, a2, a3, a4, a5 = parse.parse_nodes(text)
    # a draining node runs its jobs but takes no new one; a failing one neither
    assert (a1.state, a1.gres, a1.usable) == ("MIXED+DRAIN", {"gpu": 8}, False)
    assert (a2.state, a2.usable) == ("DOWN*", False)
    assert (a3.state, a3.usable) == ("ALLOCATED+FAIL", False)
    assert a4.usable and a5.usable  # powered down until needed; planned for a job
    # gone for the jobs it runs: down or failed, not draining
    assert [n.down for n in (a1, a2, a3, a4, a5)] == [False, True, True, False, False]


def test_partitions_recorded() -> None:
    nodes = parse.parse_nodes((DATA / "scontrol_nodes.txt").read_text())
    parts = parse.parse_partitions((DATA / "scontrol_partitions.txt").read_text(), nodes)
    debug, urgent = parts
    assert debug.name == "debug" and debug.default and not urgent.default
    assert debug.max_time_s == 7200 and urgent.max_time_s == 3600
    assert debug.nodes == ("n1", "n2")
    assert (debug.preempt_mode, urgent.preempt_mode) == ("REQUEUE", "OFF")
    assert (debug.priority_tier, urgent.priority_tier) == (1, 2)
    assert debug.total_cpus == 4
    assert debug.gres_per_node == {"gpu": 2}


def test_partition_gres_is_minimum_over_nodes() -> None:
    nodes = parse.parse_nodes(
        "NodeName=a1 CPUTot=8 Gres=gpu:4 State=IDLE\nNodeName=a2 CPUTot=8 Gres=gpu:2 State=IDLE\n"
    )
    (p,) = parse.parse_partitions("PartitionName=p Nodes=a[1-2] MaxTime=UNLIMITED State=UP", nodes)
    assert p.gres_per_node == {"gpu": 2} and p.max_time_s is None


def test_sbatch_job_id() -> None:
    assert parse.parse_sbatch_job_id("123\n") == "123"
    assert parse.parse_sbatch_job_id("123;cluster\n") == "123"
    with pytest.raises(SlurmParseError, match="expected a job id"):
        parse.parse_sbatch_job_id("sbatch: error: Batch job submission failed")


def test_sacct_recorded() -> None:
    jobs = parse.parse_sacct((DATA / "sacct.txt").read_text())
    assert jobs["4"].state == "FAILED" and jobs["4"].exit_code == 3
    assert jobs["5"].state == "CANCELLED"
    assert [jobs[f"3_{i}"].state for i in range(4)] == ["COMPLETED"] * 4
    # A requeued job: the newest record (PENDING, BeginTime) wins over PREEMPTED.
    assert (jobs["7"].state, jobs["7"].reason, jobs["7"].nodelist) == ("PENDING", "BeginTime", "")
    # Pending array tasks on one line are expanded; the parallelism limit is dropped.
    assert [k for k in jobs if k.startswith("8_")] == [f"8_{i}" for i in range(4, 10)]
    assert jobs["9"].state == "TIMEOUT" and jobs["9"].elapsed_s == 86407
    assert jobs["9"].terminal and not jobs["7"].terminal


def test_squeue_recorded() -> None:
    jobs = parse.parse_squeue((DATA / "squeue.txt").read_text())
    assert set(jobs) == {"335", "333_0", "333_1", "333_2", "333_3", "334"}
    assert jobs["333_2"].reason == "JobArrayTaskLimit" and jobs["333_0"].nodelist == "n1"
    assert jobs["333_0"].source == "squeue" and jobs["333_0"].exit_code is None  # running
    # exit_code is the raw wait status: 768 = exit 3; 15 = killed by SIGTERM (scancel)
    assert (jobs["334"].state, jobs["334"].exit_code, jobs["334"].signal) == ("FAILED", 3, None)
    assert (jobs["335"].state, jobs["335"].exit_code, jobs["335"].signal) == ("CANCELLED", 0, 15)


@pytest.mark.parametrize("parser", [parse.parse_sacct, parse.parse_squeue])
def test_short_lines_rejected(parser: object) -> None:
    with pytest.raises(SlurmParseError, match="fields"):
        parser("1|2|3")  # type: ignore[operator]


def test_sinfo_recorded() -> None:
    """``sinfo -h -a -N -o SINFO_FORMAT`` (the local cluster, plus two hand-made gpu lines)."""
    state = parse.parse_sinfo((DATA / "sinfo.txt").read_text())
    parts = {p.name: p for p in state.partitions}
    assert set(parts) == {"debug", "urgent", "gpu"}
    assert parts["debug"].default and not parts["urgent"].default
    assert parts["debug"].max_time_s == 7200 and parts["urgent"].max_time_s == 3600
    assert parts["gpu"].max_time_s is None and parts["gpu"].state == "DOWN"
    assert parts["debug"].nodes == ("n1", "n2", "n3") and parts["debug"].total_cpus == 6
    assert parts["gpu"].gres_per_node == {"gpu": 2}  # the minimum over its nodes
    nodes = {n.name: n for n in state.nodes}
    assert set(nodes["n1"].partitions) == {"urgent", "debug"} and nodes["n1"].usable
    assert nodes["n1"].gres == {"gpu": 2} and nodes["n1"].cpus == 2
    assert not nodes["g1"].usable and not nodes["g2"].usable


def test_config_limits_recorded() -> None:
    limits = parse.parse_config_limits((DATA / "scontrol_config.txt").read_text())
    assert limits == ClusterLimits(
        max_array_size=1001, max_job_count=10000, slurm_version="22.05.8"
    )
    assert parse.parse_config_limits("MaxArraySize = 50\n") == ClusterLimits(50, 10000)


def test_squeue_restart_count() -> None:
    """RestartCnt comes last (optional: recordings without it parse as before)."""
    jobs = parse.parse_squeue("40|wrap|PENDING|BeginTime||debug|0:00|0|2|\n")
    assert jobs["40"].restarts == 2 and jobs["40"].state == "PENDING"
    assert parse.parse_squeue((DATA / "squeue.txt").read_text())["335"].restarts is None


def test_sacct_attempts_recorded_output() -> None:
    # recorded on the local cluster: job 4 was requeued three times, then cancelled; 15 runs
    attempts = parse.parse_sacct_attempts((DATA / "sacct_attempts.txt").read_text())
    four = [a for a in attempts if a.job_id == "4"]
    assert [a.state for a in four] == ["REQUEUED", "REQUEUED", "REQUEUED", "CANCELLED"]
    starts = [a.start for a in four]
    assert all(s is not None for s in starts) and starts == sorted(starts)  # oldest first
    first = four[0]
    assert first.submit is not None and first.start is not None and first.end is not None
    assert first.start - first.submit == 1 and first.end - first.start == 3
    # the second attempt was held: eligible 2 s after its submit, started 3 s after that
    assert four[1].eligible is not None and four[1].submit is not None
    assert four[1].eligible - four[1].submit == 2
    running = attempts[-1]
    assert running.state == "RUNNING" and running.end is None  # "Unknown"


@pytest.mark.parametrize(
    "line",
    ["", "42|COMPLETED|2026-11-25T02:46:34", "|RUNNING|Unknown|Unknown|Unknown|Unknown"],
)
def test_sacct_attempts_skip_short_or_empty_lines(line: str) -> None:
    assert parse.parse_sacct_attempts(line) == []


def test_sacct_attempts_unknown_times_are_none() -> None:
    (a,) = parse.parse_sacct_attempts("7_2|PENDING|2026-11-25T02:46:34|Unknown|None|Unknown\n")
    assert (a.job_id, a.state, a.eligible, a.start, a.end) == ("7_2", "PENDING", None, None, None)


@pytest.mark.parametrize(
    ("state", "idle"),
    [("IDLE", True), ("idle", True), ("IDLE+DRAIN", False), ("IDLE*", False),
     ("MIXED", False), ("ALLOCATED", False), ("COMPLETING", False), ("DOWN*", False),
     ("IDLE+COMPLETING", False), ("IDLE+CLOUD", True)],
)  # fmt: skip
def test_a_node_is_idle_when_it_runs_nothing_and_takes_work(state: str, idle: bool) -> None:
    from cluster.models import Node

    assert Node("n1", state, 2).idle is idle
