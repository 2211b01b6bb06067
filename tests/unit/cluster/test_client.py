"""SlurmClient's orchestration with recorded command outputs (stub commands on PATH)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from cluster.client import SlurmClient
from cluster.errors import SlurmCommandError, SlurmNotFoundError, SlurmTimeoutError


def _stub(bin_dir: Path, name: str, stdout: str, rc: int = 0, stderr: str = "") -> None:
    calls = bin_dir / "calls.log"
    script = bin_dir / name
    script.write_text(
        "#!/bin/bash\n"
        f'echo "{name} $*" >> {calls}\n'
        f"cat <<'OUT'\n{stdout}OUT\n"
        f"cat >&2 <<'ERR'\n{stderr}ERR\n"
        f"exit {rc}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def _client(bin_dir: Path) -> SlurmClient:
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_CONF": "/nonexistent/slurm.conf"}
    return SlurmClient(environ=env, timeout=10)


def _calls(bin_dir: Path) -> list[str]:
    path = bin_dir / "calls.log"
    return path.read_text().splitlines() if path.exists() else []


def test_finished_jobs_need_one_sacct_call(tmp_path: Path) -> None:
    _stub(tmp_path, "sacct", "1|a|COMPLETED|0:0|00:00:01|n1|debug|None\n"
                             "2|b|FAILED|1:0|00:00:01|n2|debug|None\n")  # fmt: skip
    _stub(tmp_path, "squeue", "")
    states = _client(tmp_path).job_states(["1", "2"])
    assert {k: v.state for k, v in states.items()} == {"1": "COMPLETED", "2": "FAILED"}
    assert _calls(tmp_path) == [
        "sacct -X -n -P -o JobID,JobName,State,ExitCode,Elapsed,NodeList,Partition,Reason -j 1,2"
    ]


def test_controller_overrides_stale_or_missing_accounting(tmp_path: Path) -> None:
    # sacct: 3 still REQUEUED (stale), 4 a placeholder record, 5 unknown yet.
    _stub(tmp_path, "sacct", "1|a|COMPLETED|0:0|00:00:01|n1|debug|None\n"
                             "3|c|REQUEUED|0:0|00:00:01|n1|debug|None\n"
                             "4|allocation|COMPLETED|0:0|00:00:00|n1||None\n")  # fmt: skip
    _stub(tmp_path, "squeue", "3|c|CANCELLED|None|n1|debug|0:00|15|\n"
                              "4|d|COMPLETED|None|n[1-2]|debug|0:03|0|\n"
                              "5|e|PENDING|Priority||debug|0:00|0|\n")  # fmt: skip
    states = _client(tmp_path).job_states(["1", "3", "4", "5"])
    assert states["1"].source == "sacct"
    assert (states["3"].state, states["3"].source) == ("CANCELLED", "squeue")
    assert (states["4"].nodelist, states["4"].name) == ("n[1-2]", "d")
    assert states["5"].state == "PENDING"
    assert _calls(tmp_path)[1].endswith("-j 3,4,5")


def test_a_node_failed_attempt_is_settled_by_the_controller(tmp_path: Path) -> None:
    """sacct keeps showing the NODE_FAIL of a job Slurm requeued (seen on the local cluster
    right after the requeue): the controller says it is pending again; a NODE_FAIL the
    controller no longer knows is final."""
    _stub(tmp_path, "sacct", "8|a|NODE_FAIL|0:0|00:00:04|n[1-2]|debug|None\n"
                             "9|b|NODE_FAIL|0:0|00:00:04|n[1-2]|debug|None\n")  # fmt: skip
    _stub(tmp_path, "squeue", "8|a|PENDING|BeginTime||debug|0:00|0|\n")
    states = _client(tmp_path).job_states(["8", "9"])
    assert (states["8"].state, states["8"].source) == ("PENDING", "squeue")
    assert states["9"].state == "NODE_FAIL" and states["9"].terminal


def test_preempted_is_final_unless_the_controller_has_the_job_pending_again(
    tmp_path: Path,
) -> None:
    """Seen on the local cluster: a requeueable job, preempted, is PENDING in squeue at once
    while sacct says PREEMPTED for ~3 s; a job that may not be requeued stays PREEMPTED in
    both, for good (a follow of it used to never end)."""
    _stub(tmp_path, "sacct", "5|a|PREEMPTED|0:0|00:00:39|n3|debug|None\n"
                             "6|b|PREEMPTED|0:0|00:00:39|n3|debug|None\n")  # fmt: skip
    _stub(tmp_path, "squeue", "5|a|PENDING|BeginTime||debug|0:00|0|\n"
                              "6|b|PREEMPTED|None|n3|debug|0:39|0|\n")  # fmt: skip
    states = _client(tmp_path).job_states(["5", "6"])
    assert (states["5"].state, states["5"].terminal) == ("PENDING", False)
    assert (states["6"].state, states["6"].terminal) == ("PREEMPTED", True)
    polled = _client(tmp_path).poll_states(["5", "6"])
    assert not polled["5"].terminal and polled["6"].terminal


def test_attempts_lists_every_run_of_a_requeued_job(tmp_path: Path) -> None:
    _stub(tmp_path, "sacct", "8|a|NODE_FAIL|0:0|00:00:04|n[1-2]|debug|None\n"
                             "8|a|RUNNING|0:0|00:00:09|n[1,3]|debug|None\n")  # fmt: skip
    runs = _client(tmp_path).attempts("8")
    assert [(r.state, r.nodelist) for r in runs] == [("NODE_FAIL", "n[1-2]"), ("RUNNING", "n[1,3]")]
    assert _calls(tmp_path)[0].startswith("sacct -D -X -n -P -o ")


def test_squeue_fallback_when_accounting_is_off(tmp_path: Path) -> None:
    _stub(tmp_path, "sacct", "", rc=1, stderr="Slurm accounting storage is disabled\n")
    _stub(tmp_path, "squeue", "7|x|FAILED|NonZeroExitCode|n1|debug|0:09|512|\n")
    info = _client(tmp_path).job_states(["7"])["7"]
    assert (info.state, info.exit_code, info.source) == ("FAILED", 2, "squeue")


def test_unknown_ids_to_squeue_are_not_an_error(tmp_path: Path) -> None:
    _stub(tmp_path, "sacct", "")
    _stub(tmp_path, "squeue", "", rc=1, stderr="slurm_load_jobs error: Invalid job id specified\n")
    assert _client(tmp_path).job_states(["99"]) == {}


def test_errors_carry_command_exit_code_and_stderr(tmp_path: Path) -> None:
    _stub(tmp_path, "sbatch", "", rc=1, stderr="sbatch: error: invalid partition specified: x\n")
    with pytest.raises(SlurmCommandError, match="invalid partition specified: x") as info:
        _client(tmp_path).submit(tmp_path / "job.sh", ["-p", "x"])
    assert info.value.returncode == 1 and info.value.cmd[:3] == ["sbatch", "--parsable", "-p"]


def test_cancel_for_good_makes_jobs_non_requeueable_first(tmp_path: Path) -> None:
    _stub(tmp_path, "scontrol", "")
    _stub(tmp_path, "scancel", "")
    _client(tmp_path).cancel(["7", "8_2"], no_requeue=True)
    assert _calls(tmp_path) == [
        "scontrol update JobId=7 Requeue=0",
        "scontrol update JobId=8_2 Requeue=0",
        "scancel 7 8_2",
    ]


def test_missing_command(tmp_path: Path) -> None:
    client = SlurmClient(environ={"PATH": str(tmp_path)})
    with pytest.raises(SlurmNotFoundError, match="scancel: not found"):
        client.cancel(["1"])
    assert not client.installed() and not client.ping()


@pytest.mark.parametrize(
    ("stdout", "rc", "release"),
    [
        ("slurm 24.11.5\n", 0, "24.11.5"),
        ("slurm-wlm 22.05.8\n", 0, "22.05.8"),  # Debian's
        ("slurm-wlm unknown\n", 0, None),
        ("", 1, None),
    ],
)
def test_installed_release_is_the_scontrol_programs_own_answer(
    tmp_path: Path, stdout: str, rc: int, release: str | None
) -> None:
    """``scontrol --version`` (no daemon asked); an answer it cannot read, a failed or missing
    scontrol: None, never an error."""
    _stub(tmp_path, "scontrol", stdout, rc)
    assert _client(tmp_path).installed_release() == release
    assert _calls(tmp_path) == ["scontrol --version"]
    assert SlurmClient(environ={"PATH": str(tmp_path / "none")}).installed_release() is None


class _RecordedSleeps:
    """cluster.client's ``time``: its sleeps are recorded, not slept; the rest is the real
    module. (Patching ``time.sleep`` itself also recorded subprocess's own polls while it waited
    for the stub to exit: [2.0, 0.001, 0.002, ...] when the machine was busy.)"""

    def __init__(self, slept: list[float]) -> None:
        self.sleep = slept.append

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_release_waits_for_the_requeue_to_settle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release at once after a requeue gets the job killed by slurmctld ("Job credential
    revoked"): the release waits first, then asks for StartTime=now."""
    slept: list[float] = []
    monkeypatch.setattr("cluster.client.time", _RecordedSleeps(slept))
    _stub(tmp_path, "scontrol", "")
    _client(tmp_path).release("7")
    assert slept == [2.0]
    assert _calls(tmp_path) == ["scontrol update JobId=7 StartTime=now"]
    _client(tmp_path).release("8", settle_s=0)
    assert slept == [2.0]


@pytest.mark.parametrize(("state", "refused"), [("RUNNING", False), ("PENDING", True)])
def test_a_release_refused_because_the_job_started_meanwhile_is_done(
    tmp_path: Path, state: str, refused: bool
) -> None:
    """An expedited requeue (26.05 here) starts the job at once: the release, refused for a job
    no longer pending, had nothing to do; refused for a job that still waits: an error."""
    script = tmp_path / "scontrol"
    script.write_text(
        "#!/bin/bash\n"
        f'echo "scontrol $*" >> {tmp_path / "calls.log"}\n'
        'if [ "$1" = update ]; then echo "refused" >&2; exit 1; fi\n'
        f'echo "JobId=7 JobState={state} Restarts=1"\n'
    )
    script.chmod(0o755)
    if refused:
        with pytest.raises(SlurmCommandError, match="refused"):
            _client(tmp_path).release("7", settle_s=0)
    else:
        _client(tmp_path).release("7", settle_s=0)
    assert _calls(tmp_path)[0] == "scontrol update JobId=7 StartTime=now"


_SINFO_OUT = (Path(__file__).parent / "data" / "sinfo.txt").read_text()


def test_a_prefetched_sinfo_is_read_by_the_next_cluster_state(tmp_path: Path) -> None:
    _stub(tmp_path, "sinfo", _SINFO_OUT)
    client = _client(tmp_path)
    client.prefetch_cluster_state()
    client.prefetch_cluster_state()  # one at a time
    state = client.cluster_state()  # reads the prefetched one
    assert _calls(tmp_path)[0].startswith("sinfo -h -a -N -o ")
    assert len(_calls(tmp_path)) == 1
    client.cluster_state()  # the next one asks again
    assert len(_calls(tmp_path)) == 2
    assert state == client.cluster_state()


def test_a_prefetched_failure_is_raised_where_it_is_read(tmp_path: Path) -> None:
    _stub(tmp_path, "sinfo", "", rc=1, stderr="sinfo: error: Unable to contact slurm controller\n")
    client = _client(tmp_path)
    client.prefetch_cluster_state()
    with pytest.raises(SlurmCommandError, match="Unable to contact"):
        client.cluster_state()


def test_prefetch_without_slurm_starts_nothing_and_discard_ends_a_query(tmp_path: Path) -> None:
    client = SlurmClient(environ={"PATH": str(tmp_path)})
    client.prefetch_cluster_state()  # no sinfo on PATH
    client.discard_prefetch()
    slow = tmp_path / "sinfo"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    client = _client(tmp_path)
    client.prefetch_cluster_state()
    started = client._prefetched
    assert started is not None and started.proc.poll() is None
    client.discard_prefetch()  # killed and reaped, not left behind
    assert started.proc.returncode is not None and client._prefetched is None


def test_a_started_command_is_killed_at_its_timeout(tmp_path: Path) -> None:
    slow = tmp_path / "squeue"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    client = _client(tmp_path)
    started = client.start(["squeue"], timeout=0.3)
    with pytest.raises(SlurmTimeoutError, match=r"no answer within 0\.3s"):
        client.finish(started)
    assert started.proc.returncode is not None


def test_a_requeue_whose_scontrol_the_requeue_itself_ended_is_done(tmp_path: Path) -> None:
    """Asked from inside the job, scontrol is killed by the SIGTERM its own requeue sends: that
    is success (CI recorded it as a failed requeue). Any other failure still raises."""
    scontrol = tmp_path / "scontrol"
    scontrol.write_text('#!/bin/sh\necho "$@" >> "$(dirname "$0")/asked"\nkill -TERM $$\n')
    scontrol.chmod(0o755)
    client = _client(tmp_path)
    client.requeue("42")
    assert (tmp_path / "asked").read_text() == "requeue 42\n"
    scontrol.write_text('#!/bin/sh\necho "Invalid job id specified" >&2\nexit 1\n')
    with pytest.raises(SlurmCommandError, match="Invalid job id"):
        client.requeue("42")


def test_a_shielded_command_outlives_the_signals_slurm_sends_the_job(tmp_path: Path) -> None:
    """A stop's `scontrol requeue` makes Slurm TERM the step the command runs in: the
    commands that follow (the requeued job's ExcNodeList) must not die of it."""
    script = tmp_path / "scontrol"
    script.write_text("#!/bin/bash\nkill -TERM $$\nkill -USR2 $$\necho alive\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "SLURM_CONF": "/nonexistent/slurm.conf"}
    done = SlurmClient(environ=env, timeout=10, shielded=True).run(["scontrol", "x"])
    assert (done.returncode, done.stdout) == (0, "alive\n")
    with pytest.raises(SlurmCommandError) as exc:
        SlurmClient(environ=env, timeout=10).run(["scontrol", "x"])
    assert exc.value.returncode == -15  # unshielded: killed by the TERM
