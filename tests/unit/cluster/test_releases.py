"""The parsers on what each Slurm release printed (recorded from live local clusters by
``scripts/record_slurm_outputs.py --slurm RELEASE`` into ``data/<release>/``; ``jobs.json`` says
which job is which and the state it must parse to)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster import parse
from cluster.errors import SlurmParseError
from cluster.local.release import RELEASES

DATA = Path(__file__).parent / "data"


def test_every_release_is_recorded() -> None:
    assert sorted(p.name for p in DATA.iterdir() if p.is_dir()) == sorted(RELEASES)


@pytest.fixture(params=sorted(RELEASES))
def rec(request: pytest.FixtureRequest) -> tuple[str, Path, dict]:
    release = request.param
    folder = DATA / release
    manifest = json.loads((folder / "jobs.json").read_text())
    assert manifest["version"].endswith(f" {release}") or f" {release}." in manifest["version"]
    return release, folder, manifest


def _ids(manifest: dict) -> dict[str, str]:
    return {role: j["id"] for role, j in manifest["jobs"].items()}


def test_cluster_shape(rec: tuple[str, Path, dict]) -> None:
    _, folder, _ = rec
    state = parse.parse_sinfo((folder / "sinfo.txt").read_text())
    parts = {p.name: p for p in state.partitions}
    assert set(parts) == {"debug", "urgent"} and parts["debug"].default
    assert (parts["debug"].max_time_s, parts["urgent"].max_time_s) == (7200, 3600)
    assert parts["debug"].gres_per_node == {"gpu": 2} and parts["debug"].total_cpus == 6
    assert {n.name for n in state.nodes} == {"n1", "n2", "n3"}
    assert all(n.usable and n.gres == {"gpu": 2} for n in state.nodes)
    nodes = parse.parse_nodes((folder / "scontrol_nodes.txt").read_text())
    assert [(n.name, n.cpus, n.gres) for n in nodes] == [
        (f"n{i}", 2, {"gpu": 2}) for i in (1, 2, 3)
    ]
    partitions = {
        p.name: p
        for p in parse.parse_partitions((folder / "scontrol_partitions.txt").read_text(), nodes)
    }
    assert partitions["debug"].preempt_mode == "REQUEUE" and partitions["debug"].grace_time_s == 20
    assert partitions["urgent"].priority_tier > partitions["debug"].priority_tier
    config = (folder / "scontrol_config.txt").read_text()
    assert parse.parse_config_limits(config).max_array_size == 1001
    assert parse.parse_slurm_user_uid(config) == 0


def test_sacct_states_and_exit_codes(rec: tuple[str, Path, dict]) -> None:
    _, folder, manifest = rec
    jobs = parse.parse_sacct((folder / "sacct.txt").read_text())
    ids = _ids(manifest)
    for role, job in manifest["jobs"].items():
        key = job["id"] if role != "array" else f"{job['id']}_0"
        assert jobs[key].state == job["state"], role
    assert jobs[ids["failed"]].exit_code == 3 and jobs[ids["completed"]].exit_code == 0
    assert [f"{ids['array']}_{i}" in jobs for i in range(3)] == [True] * 3
    assert jobs[ids["cancelled"]].nodelist == ""  # "None assigned"


def test_squeue_states_and_exit_codes(rec: tuple[str, Path, dict]) -> None:
    """22.05 prints the raw wait status (768: exit 3), 24.11 and later ``3:0``: both parse to
    the job's exit code."""
    _, folder, manifest = rec
    jobs = parse.parse_squeue((folder / "squeue.txt").read_text())
    ids = _ids(manifest)
    for role, job in manifest["jobs"].items():
        key = job["id"] if role != "array" else f"{job['id']}_0"
        assert jobs[key].state == job["state"], role
    assert (jobs[ids["failed"]].exit_code, jobs[ids["failed"]].signal) == (3, None)
    assert jobs[ids["completed"]].exit_code == 0
    assert jobs[ids["requeued"]].restarts == 1 and jobs[ids["running"]].exit_code is None


def test_requeued_job_has_one_row_per_run(rec: tuple[str, Path, dict]) -> None:
    _, folder, manifest = rec
    requeued = _ids(manifest)["requeued"]
    runs = [
        info
        for line in (folder / "sacct_runs.txt").read_text().splitlines()
        for info in parse.parse_sacct(line).values()
    ]
    assert [(r.job_id, r.state) for r in runs] == [(requeued, "REQUEUED"), (requeued, "COMPLETED")]
    attempts = parse.parse_sacct_attempts((folder / "sacct_attempts.txt").read_text())
    assert [a.state for a in attempts] == ["REQUEUED", "COMPLETED"]
    assert all(a.start is not None and a.end is not None for a in attempts)
    job = parse.parse_key_values((folder / "scontrol_job.txt").read_text().strip())
    assert (job["JobId"], job["Restarts"], job["JobState"]) == (requeued, "1", "COMPLETED")


def test_sbatch_help_offers_what_the_tool_renders(rec: tuple[str, Path, dict]) -> None:
    text = (folder := rec[1] / "sbatch_help.txt").read_text()
    for option in ("--parsable", "--requeue", "--signal", "--gres",
                   "--gpus-per-node", "--ntasks-per-node", "--cpus-per-task", "--time",
                   "--partition", "--exclude", "--array", "--output"):  # fmt: skip
        assert option in text, f"{folder}: {option}"


@pytest.mark.parametrize(
    ("parser", "line", "field"),
    [
        (parse.parse_sacct, "7|wrap|FROBNICATED|0:0|00:00:01|n1|debug|None", "sacct field State"),
        (parse.parse_squeue, "7|wrap|FROBNICATED|None|n1|debug|0:01|0:0|0|", "squeue field State"),
        (parse.parse_sacct, "7|wrap|COMPLETED|0:0|00:00:01", "sacct field NodeList"),
        (parse.parse_squeue, "7|wrap|RUNNING|None|n1", "squeue field Partition"),
    ],
)
def test_unknown_output_names_the_field(parser: object, line: str, field: str) -> None:
    """A release that prints a state the tool does not know, or fewer fields, is one error
    that names the field (``jobs status`` prints it as one line), never a wrong state."""
    with pytest.raises(SlurmParseError, match=f"^{field}"):
        parser(line)  # type: ignore[operator]


def test_restart_levers_read_from_the_config(rec: tuple[str, Path, dict]) -> None:
    """The local 26.05 cluster allows expedited requeue (25.11+); 22.05 and 24.11 know none."""
    release, folder, _ = rec
    limits = parse.parse_config_limits((folder / "scontrol_config.txt").read_text())
    assert limits.expedited_requeue is (release == "26.05")
    assert limits.requeue_delay_s is None
    assert limits.slurm_version.startswith(f"{release}.")
    levers = parse.parse_config_limits(
        "SchedulerParameters     = bf_continue,requeue_delay=45\n"
        "SlurmctldParameters     = enable_expedited_requeue,preempt_send_user_signal\n"
    )
    assert (levers.expedited_requeue, levers.requeue_delay_s) == (True, 45)
    assert levers.requeue_hold_s == 45  # requeue_delay, where set, is the hold


def test_the_requeue_hold_and_a_successors_wait_read_from_the_config(
    rec: tuple[str, Path, dict],
) -> None:
    """Issue 46: the hold of a requeued job (cred_expire, Slurm's default 120 s: every local
    cluster's) and the longest a newly eligible job waits for a scheduling pass (bf_interval,
    default 30 s; sched_interval, default 60 s), as jobs submit's preflight reads them."""
    _, folder, _ = rec
    limits = parse.parse_config_limits((folder / "scontrol_config.txt").read_text())
    assert (limits.requeue_hold_s, limits.successor_wait_s) == (120, 30)
    set_ = parse.parse_config_limits(
        "AuthInfo                = cred_expire=300,socket=/run/munge/munge.socket.2\n"
        "SchedulerParameters     = bf_interval=90,sched_interval=45\n"
        "SchedulerType           = sched/backfill\n"
    )
    assert (set_.requeue_hold_s, set_.successor_wait_s) == (300, 45)
    builtin = parse.parse_config_limits(
        "SchedulerParameters     = bf_interval=5\nSchedulerType           = sched/builtin\n"
    )
    assert builtin.successor_wait_s == 60  # no backfill pass: the main one's interval


def test_the_hold_a_requeue_waits_read_from_the_config(rec: tuple[str, Path, dict]) -> None:
    """What an expedited requeue skips (slurm.conf(5)): requeue_delay where set, else AuthInfo's
    cred_expire, else Slurm's 120 s (every recorded release sets neither)."""
    _, folder, _ = rec
    limits = parse.parse_config_limits((folder / "scontrol_config.txt").read_text())
    assert (limits.cred_expire_s, limits.requeue_hold_s) == (None, 120)
    expire = parse.parse_config_limits("AuthInfo                = cred_expire=60,socket=/x\n")
    assert (expire.cred_expire_s, expire.requeue_hold_s) == (60, 60)
    both = parse.parse_config_limits(
        "AuthInfo                = socket=/x,cred_expire=60\n"
        "SchedulerParameters     = requeue_delay=15\n"
    )
    assert both.requeue_hold_s == 15


def test_sluid_per_run_where_it_exists(rec: tuple[str, Path, dict]) -> None:
    """24.11's and 26.05's accounting give each run of a requeued job its own SLUID; 22.05 has
    no such field (the recorder asks only where ``sacct --helpformat`` names it)."""
    release, folder, manifest = rec
    path = folder / "sacct_sluid.txt"
    if release == "22.05":
        assert not path.exists()
        return
    rows = [line.split("|") for line in path.read_text().splitlines()]
    assert [(r[0], r[2]) for r in rows] == [
        (manifest["jobs"]["requeued"]["id"], "REQUEUED"),
        (manifest["jobs"]["requeued"]["id"], "COMPLETED"),
    ]
    assert len({r[1] for r in rows}) == 2 and all(r[1] for r in rows)


def test_requeue_in_the_grace_time_of_a_preemption(rec: tuple[str, Path, dict]) -> None:
    """A job that requeues itself on its preemption's signal (as train's stop path does): one
    requeue on 22.05 and 26.05; on 24.11.5 the preemption's own requeue also ends the NEXT run
    (PREEMPTED after it finished its work), a third run follows (recorded; README's table)."""
    release, folder, manifest = rec
    job_id = manifest["jobs"]["requeue_in_grace"]["id"]
    runs = [
        info.state
        for line in (folder / "sacct_requeue_in_grace.txt").read_text().splitlines()
        for info in parse.parse_sacct(line).values()
        if info.job_id == job_id
    ]
    expected = ["REQUEUED", "COMPLETED"]
    if release == "24.11":
        expected = ["REQUEUED", "PREEMPTED", "COMPLETED"]
    assert runs == expected


def test_expedited_requeue_where_the_release_has_it(rec: tuple[str, Path, dict]) -> None:
    """26.05: a ``--requeue=expedite`` job whose node went down is EXPEDITING (a state the tool
    knows: not over), then RUNNING again within seconds; a plain ``--requeue`` one waits as
    PENDING (BeginTime). 22.05 and 24.11 have no such option (``sbatch --help``)."""
    release, folder, manifest = rec
    if release != "26.05":
        assert manifest["expedite"] is None
        assert "--requeue[=expedite]" not in (folder / "sbatch_help.txt").read_text()
        return
    (info,) = parse.parse_squeue((folder / "squeue_expediting.txt").read_text()).values()
    assert info.state == "EXPEDITING" and not info.terminal and info.restarts == 1
    expedite, plain = manifest["expedite"]["expedite"], manifest["expedite"]["plain"]
    assert expedite["states"][-1] == "RUNNING" and expedite["running_again_s"] <= 15
    assert plain["states"] == ["PENDING"] and plain["running_again_s"] is None


def test_exit_in_the_grace_time_of_a_preemption(rec: tuple[str, Path, dict]) -> None:
    """A preempted job that only exits on the signal: 22.05 ends it COMPLETED, never requeued
    (the stop path must ask for the requeue there); 24.11 and 26.05 requeue it themselves."""
    release, folder, manifest = rec
    job_id = manifest["jobs"]["exit_in_grace"]["id"]
    runs = [
        info.state
        for line in (folder / "sacct_exit_in_grace.txt").read_text().splitlines()
        for info in parse.parse_sacct(line).values()
        if info.job_id == job_id
    ]
    assert runs == (["COMPLETED"] if release == "22.05" else ["PREEMPTED", "COMPLETED"])
