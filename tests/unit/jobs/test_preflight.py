"""Preflight against a cluster shape (recorded models, no Slurm needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.errors import SlurmCommandError
from cluster.models import ClusterLimits, ClusterState, Node, Partition
from jobs.errors import PreflightError
from jobs.load import load_text
from jobs.preflight import LIMITS_FILE, array_limit, cluster_limits, preflight

NODES = [
    Node("n1", "IDLE", 2, {"gpu": 2}, ("debug", "urgent")),
    Node("n2", "IDLE", 2, {"gpu": 2}, ("debug", "urgent")),
]
PARTS = [
    Partition("debug", True, 7200, ("n1", "n2"), "UP", "REQUEUE", 1, 4, {"gpu": 2}),
    Partition("urgent", False, 3600, ("n1", "n2"), "UP", "OFF", 2, 4, {"gpu": 2}),
]


class FakeClient:
    """What preflight reads: ONE cluster_state() (sinfo) per check, counted."""

    def __init__(self, nodes: list[Node] = NODES) -> None:
        self._nodes = nodes
        self.queries = 0

    def cluster_state(self) -> ClusterState:
        self.queries += 1
        return ClusterState(tuple(PARTS), tuple(self._nodes))


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


def test_preflight_is_one_query() -> None:
    client = FakeClient()
    loaded = load_text("name: d\ntrain: {batch_size: 12}\n", "spec.yaml")
    assert preflight(loaded.spec, client, loaded.where) == "debug"  # type: ignore[arg-type]
    assert client.queries == 1


class LimitsClient:
    def __init__(self, stamp: str, limits: ClusterLimits) -> None:
        self.stamp, self._limits, self.asked = stamp, limits, 0

    def conf_stamp(self) -> str:
        return self.stamp

    def limits(self) -> ClusterLimits:
        self.asked += 1
        return self._limits


def test_limits_are_cached_on_the_slurm_conf_stamp(tmp_path: Path) -> None:
    client = LimitsClient("/etc/slurm.conf:10:1", ClusterLimits(1001, 10000))
    for _ in range(3):
        assert cluster_limits(client, tmp_path) == ClusterLimits(1001, 10000)  # type: ignore[arg-type]
    assert client.asked == 1
    client.stamp, client._limits = "/etc/slurm.conf:12:2", ClusterLimits(50, 100)
    assert cluster_limits(client, tmp_path) == ClusterLimits(50, 100)  # type: ignore[arg-type]
    assert client.asked == 2
    (tmp_path / LIMITS_FILE).write_text("{damaged")
    assert cluster_limits(client, tmp_path) == ClusterLimits(50, 100)  # type: ignore[arg-type]
    assert client.asked == 3


def test_restart_levers_survive_the_cache(tmp_path: Path) -> None:
    """25.11+'s expedited requeue and requeue_delay come back from the cache as they went in."""
    levers = ClusterLimits(
        1001, 10000, expedited_requeue=True, requeue_delay_s=30, slurm_version="26.05.5",
        cred_expire_s=90,
    )  # fmt: skip
    client = LimitsClient("/etc/slurm.conf:10:1", levers)
    assert [cluster_limits(client, tmp_path) for _ in range(2)] == [levers, levers]  # type: ignore[arg-type]
    assert client.asked == 1


def test_an_entry_cached_before_the_hold_was_read_asks_again(tmp_path: Path) -> None:
    """Issue 46: a cache entry written before the requeue hold and a successor's wait were
    kept is asked again (never read as Slurm's defaults): the mode decision reads them."""
    client = LimitsClient("/etc/slurm.conf:10:1", ClusterLimits(1001, 10000, cred_expire_s=7))
    old = {"max_array_size": 1001, "max_job_count": 10000, "expedited_requeue": False}
    from jobs.confcache import write_entry

    write_entry(tmp_path, LIMITS_FILE, client.stamp, old)
    from jobs.preflight import cached_limits

    shown = cached_limits(tmp_path)  # for showing (jobs status): read, Slurm's defaults
    assert shown is not None and shown.requeue_hold_s == 120
    assert cluster_limits(client, tmp_path).requeue_hold_s == 7  # type: ignore[arg-type]
    assert client.asked == 1


def test_jobs_status_shows_the_requeue_delay_the_preflight_read(tmp_path: Path) -> None:
    """Issue 43: requeue_delay and an expedited requeue shown as the last preflight read them
    (no query); nothing where neither is set, or no (or a damaged) entry is there."""
    from jobs.preflight import cached_limits, restart_levers_line

    assert restart_levers_line(cached_limits(tmp_path)) is None  # no entry
    levers = ClusterLimits(1001, 10000, requeue_delay_s=45, slurm_version="26.05.5")
    cluster_limits(LimitsClient("/etc/slurm.conf:1:1", levers), tmp_path)  # type: ignore[arg-type]
    assert restart_levers_line(cached_limits(tmp_path)) == (
        "  requeue: Slurm 26.05.5: a requeued job waits 45 s (SchedulerParameters=requeue_delay)"
    )
    both = ClusterLimits(1, 1, expedited_requeue=True, requeue_delay_s=0)
    assert restart_levers_line(both) == (
        "  requeue: a requeued job waits 0 s (SchedulerParameters=requeue_delay); "
        "a node failure's requeue is expedited (--requeue=expedite)"
    )
    assert restart_levers_line(ClusterLimits(1, 1, slurm_version="22.05.8")) is None
    for damaged in ("{damaged", "[]", '{"max_array_size": "x"}'):
        (tmp_path / LIMITS_FILE).write_text(damaged)
        assert cached_limits(tmp_path) is None


@pytest.mark.parametrize(
    ("tasks", "limits", "expected"),
    [
        (1500, ClusterLimits(1001, 10000), 1001),
        (4, ClusterLimits(1001, 10000), 1001),
        (1500, ClusterLimits(10, 150), 10),
    ],
)
def test_array_limit(tasks: int, limits: ClusterLimits, expected: int) -> None:
    assert array_limit(tasks, limits) == expected


@pytest.mark.parametrize(
    ("tasks", "limits", "match"),
    [
        (4, ClusterLimits(0, 10000), r"^preflight: sweep: this cluster has job arrays turned off"),
        (1500, ClusterLimits(10, 149), r"1500 points need 150 arrays of at most 10 .*MaxJobCount"),
    ],
)
def test_impossible_sweeps_are_refused(tasks: int, limits: ClusterLimits, match: str) -> None:
    with pytest.raises(PreflightError, match=match):
        array_limit(tasks, limits)


class SubmitClient(FakeClient):
    """For jobs.submit.submit: whether Slurm is installed/answers, and what it was asked."""

    def __init__(self, installed: bool = True, answers: bool = True) -> None:
        super().__init__()
        self._installed, self._answers = installed, answers
        self.pings = 0

    def installed(self) -> bool:
        return self._installed

    def ping(self) -> bool:
        self.pings += 1
        return self._answers

    def cluster_state(self) -> ClusterState:
        if not self._answers:
            raise SlurmCommandError(
                ["sinfo"], 1, "sinfo: error: Unable to contact slurm controller"
            )
        return super().cluster_state()

    def conf_stamp(self) -> str:
        return "/etc/slurm/slurm.conf:1:1"

    def limits(self) -> ClusterLimits:
        return ClusterLimits(3, 100)

    def requeue_settings(self, partition: str) -> tuple[str, str]:
        return "1", "REQUEUE"  # JobRequeue, PreemptMode: requeue works (jobs.chain)

    def sbatch_options(self) -> frozenset[str]:
        from cluster.parse import parse_sbatch_help

        data = Path(__file__).parents[1] / "cluster" / "data" / "sbatch_help_22.05.txt"
        return parse_sbatch_help(data.read_text())


@pytest.fixture
def routes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, object]]:
    """Replace the two ways out of jobs.submit.submit by recorders."""
    from jobs import submit as mod

    taken: list[tuple[str, object]] = []
    monkeypatch.setattr(mod, "submit_local", lambda loaded, plan: taken.append(("local", None)))
    monkeypatch.setattr(
        mod,
        "submit_slurm",
        lambda loaded, plan, client, array_limit=None, after=(), cluster=None, **_: taken.append(
            ("slurm", array_limit)
        ),
    )
    return taken


@pytest.mark.parametrize(
    ("client", "preflight", "route"),
    [
        (SubmitClient(), True, ("slurm", None)),
        (SubmitClient(answers=False), True, ("local", None)),
        (SubmitClient(installed=False), True, ("local", None)),
        (SubmitClient(answers=False), False, ("local", None)),
    ],
)
def test_auto_executor_uses_the_preflight_query_as_its_ping(
    client: SubmitClient,
    preflight: bool,
    route: tuple[str, object],
    routes: list[tuple[str, object]],
    tmp_path: Path,
) -> None:
    from jobs.submit import make_plan, submit

    loaded = load_text("name: d\ntrain: {batch_size: 12}\n", "spec.yaml")
    submit(loaded, make_plan(loaded, tmp_path), client, "auto", preflight=preflight)  # type: ignore[arg-type]
    assert routes == [route]
    # One Slurm query in all: sinfo doubles as the ping; ping only without the preflight.
    assert client.queries + client.pings <= 1


def test_a_sweep_gets_the_clusters_array_limit(
    routes: list[tuple[str, object]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.submit import make_plan, submit

    monkeypatch.setenv("SLURM_TRAIN_STATE_DIR", str(tmp_path / "state"))
    text = "name: d\ntrain: {batch_size: 12}\nsweep: {grid: {train.seed: [1, 2, 3, 4, 5]}}\n"
    loaded = load_text(text, "spec.yaml")
    client = SubmitClient()
    submit(loaded, make_plan(loaded, tmp_path), client, "slurm")  # type: ignore[arg-type]
    assert routes == [("slurm", 3)] and client.queries == 1


def test_a_run_whose_stops_need_more_than_the_warning_is_told_so(tmp_path: Path) -> None:
    """Issue 26: the warning fits the save. Resubmitting a run directory whose stops measured
    45 s from the signal to a saved checkpoint, with requeue.signal_delay_s: 30, says so (and
    a partition whose GraceTime is known and shorter, too); a fresh run says nothing."""
    import dataclasses

    from jobs.preflight import save_lead_notes
    from train.history import RunHistory

    loaded = load_text("name: d\ntrain: {}\nrequeue: {signal_delay_s: 30}\n", "spec.yaml", ())
    state = ClusterState((dataclasses.replace(PARTS[0], grace_time_s=20), PARTS[1]), tuple(NODES))
    assert save_lead_notes(loaded.spec, [tmp_path], "debug", state) == []
    RunHistory(tmp_path).append("checkpoint", step=40, since_signal_s=45.0)
    notes = save_lead_notes(loaded.spec, [tmp_path], "debug", state)
    assert len(notes) == 2 and all("\n" not in n for n in notes)
    assert "requeue.signal_delay_s is 30" in notes[0] and "at least 55" in notes[0]
    assert "partition debug" in notes[1] and "20 s (GraceTime)" in notes[1]


# -- the hand-kept sbatch options against the release the preflight talks to (issue 43) --------
_HELP = Path(__file__).parents[1] / "cluster" / "data"


def _live(release: str) -> frozenset[str]:
    from cluster.parse import parse_sbatch_help

    return parse_sbatch_help((_HELP / f"sbatch_help_{release}.txt").read_text())


class HelpClient:
    """``sbatch --help`` (counted) and the stamp of the cluster's slurm.conf."""

    def __init__(self, release: str) -> None:
        self.release = release
        self.asked = 0

    def conf_stamp(self) -> str:
        return f"/etc/slurm/slurm.conf:{self.release}"

    def sbatch_options(self) -> frozenset[str]:
        self.asked += 1
        return _live(self.release)


@pytest.mark.parametrize(
    ("args", "release", "match"),
    [
        # a prefix unique on 22.05 is two options on 26.05
        (
            "{spread: true}",
            "26.05",
            r"sbatch_args\.spread: --spread is ambiguous .*--spread-segments",
        ),
        # an option of a later release, on an earlier one
        ("{tres-per-task: 'gres/gpu:1'}", "22.05", r"--tres-per-task is not an option of this"),
    ],
)
def test_sbatch_args_against_the_clusters_release(args: str, release: str, match: str) -> None:
    from jobs.preflight import check_sbatch_release

    loaded = load_text(f"name: d\ntrain: {{}}\nlaunch: {{sbatch_args: {args}}}\n", "s.yaml", ())
    with pytest.raises(PreflightError, match=match):
        check_sbatch_release(loaded.spec, _live(release), loaded.where)
    # the same spec on a release where it is fine
    fine = "22.05" if release == "26.05" else "24.11"
    check_sbatch_release(loaded.spec, _live(fine), loaded.where)


def test_every_option_jobs_writes_is_in_each_release() -> None:
    from jobs.preflight import check_sbatch_release

    text = (
        "name: d\nresources: {partition: debug, gpus_per_node: 1, gres: 'nvme:1', mem: 1G,"
        " cpus_per_task: 1, account: a, qos: q, constraint: c, exclusive: true}\ntrain: {}\n"
        "sweep: {grid: {train.seed: [1, 2]}}\n"
    )
    loaded = load_text(text, "s.yaml", ())
    for release in ("22.05", "24.11", "26.05"):
        check_sbatch_release(loaded.spec, _live(release), loaded.where)
    with pytest.raises(PreflightError, match=r"^preflight: jobs writes --gres but"):
        check_sbatch_release(loaded.spec, _live("22.05") - {"gres"})


def test_sbatch_options_are_asked_once_per_cluster(tmp_path: Path) -> None:
    import json

    from jobs.preflight import SBATCH_OPTIONS_FILE, SBATCH_OPTIONS_TTL_S, sbatch_options

    client = HelpClient("22.05")
    for _ in range(3):
        assert sbatch_options(client, tmp_path) == _live("22.05")  # type: ignore[arg-type]
    assert client.asked == 1
    client.release = "26.05"  # slurm.conf edited (the upgrade restarted the daemons): asked again
    assert "spread-segments" in (sbatch_options(client, tmp_path) or ())  # type: ignore[arg-type]
    assert client.asked == 2
    (tmp_path / SBATCH_OPTIONS_FILE).write_text('{"stamp": 1, "options": "x"}')  # foreign
    assert sbatch_options(client, tmp_path) == _live("26.05")  # type: ignore[arg-type]
    assert client.asked == 3
    path = tmp_path / SBATCH_OPTIONS_FILE
    old = json.loads(path.read_text())
    path.write_text(json.dumps({**old, "at": old["at"] - SBATCH_OPTIONS_TTL_S - 1}))  # a day
    assert sbatch_options(client, tmp_path) == _live("26.05")  # type: ignore[arg-type]
    assert client.asked == 4
