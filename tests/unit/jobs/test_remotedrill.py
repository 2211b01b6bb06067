"""``jobs drill --remote`` (jobs/remotedrill.py) with the stand-in ``ssh`` that runs the remote
line here (tests/unit/cluster/_ssh_fake.py) and a stand-in Slurm (``sbatch``, ``scontrol``) on
the "login node": the drill's loop runs HERE, each of its actions and reads is one short ssh
command that has ended before the drill waits again, and none is the drill itself."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from jobs import drill as drill_mod
from jobs import remote
from jobs.cli import main
from jobs.records import RunRecord, TaskRecord, save_record

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from _ssh_fake import fake_ssh

# the stand-in Slurm: one job whose state lives in STATE; sbatch of the preempting job preempts
# it (the trainer's records of a stop), scontrol update StartTime=now lets it resume
SLURM = r"""#!PY
import json, os, sys, time
state_file, run = os.environ["FAKE_SLURM_STATE"], os.environ["FAKE_SLURM_RUN"]
st = json.load(open(state_file))
def add(name, **rec):
    with open(os.path.join(run, name), "a") as f:
        f.write(json.dumps({"time": time.time(), **rec}) + "\n")
cmd = os.path.basename(sys.argv[0])
if cmd == "sbatch":
    st["sbatch"] = st.get("sbatch", 0) + 1
    st["urgent"] = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--job-name=")][0]
    plan = os.environ.get("FAKE_SSH_PLAN")
    if plan:  # the connection goes away for the next commands
        with open(plan, "a") as f:
            f.write("drop\n" * int(os.environ.get("FAKE_SLURM_DROPS", "0")))
    add("metrics.jsonl", kind="train", step=34)
    add("events.jsonl", event="signal", step=34, restart_count=0, received_at=time.time())
    add("events.jsonl", event="preempted", step=34, restart_count=0)
    add("events.jsonl", event="checkpoint", step=34, restart_count=0)
    st.update(then=dict(state="PENDING", restarts=1, reason="BeginTime"))  # Slurm takes a while
    print("99")
elif sys.argv[1:3] == ["show", "job"]:
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 100))
    print(f"JobId=42 JobState={st['state']} Restarts={st['restarts']} NodeList=n1 "
          f"Partition=debug StartTime={start} TimeLimit=00:20:00 Reason={st['reason']} "
          f"UserId=me({os.getuid()})")
    st.update(st.pop("then", {}))
elif cmd == "squeue":
    if "urgent" in st:
        print(f"99|{st['urgent']}|PENDING|Priority|n1|urgent|0:00|0|0|N/A|")
elif sys.argv[1] == "update":
    st.update(state="RUNNING", reason="None")
    add("events.jsonl", event="resume", step=34, restart_count=st["restarts"])
    add("metrics.jsonl", kind="train", step=35)
json.dump(st, open(state_file, "w"))
"""


@pytest.fixture
def login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The login node's run (its files, its run.json) and Slurm; returns the run directory."""
    env = fake_ssh(tmp_path)
    run_dir = tmp_path / "there" / "run"
    run_dir.mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    for name in ("sbatch", "scontrol", "squeue"):
        (bin_dir / name).write_text(SLURM.replace("PY", sys.executable, 1))
        (bin_dir / name).chmod(0o755)
    state = tmp_path / "slurm.json"
    state.write_text(json.dumps({"state": "RUNNING", "restarts": 0, "reason": "None"}))
    for key in ("PATH", "FAKE_SSH_LOG"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("FAKE_SLURM_STATE", str(state))
    monkeypatch.setenv("FAKE_SLURM_RUN", str(run_dir))
    monkeypatch.delenv("SLURM_TRAIN_SSH_CONFIG", raising=False)
    monkeypatch.setattr("cluster.client.RELEASE_SETTLE_S", 0.0)
    remote._TARGETS.clear()
    now = time.time()
    with (run_dir / "events.jsonl").open("w") as f:
        f.write(json.dumps({"time": now, "event": "start", "step": 0, "restart_count": 0}) + "\n")
    with (run_dir / "metrics.jsonl").open("w") as f:
        for step in (10, 20, 30):
            f.write(json.dumps({"time": now, "kind": "train", "step": step}) + "\n")
    fields: dict[str, Any] = {"run_id": "r-1", "name": "r", "run_dir": str(run_dir)}
    fields.update(executor="slurm", job_id="42", tasks=[TaskRecord(0, str(run_dir))])
    save_record(RunRecord(**fields))
    return run_dir


def test_remote_drill_waits_here_and_no_remote_command_outlives_a_poll(
    login: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[tuple[subprocess.Popen[Any], float | None]] = []
    original = subprocess.Popen

    class Tracked(original):  # type: ignore[valid-type,misc]
        def __init__(self, args: Any, *a: Any, **kw: Any) -> None:
            super().__init__(args, *a, **kw)
            if list(args)[:1] == ["ssh"] and "-G" not in args:
                started.append((self, None))

    monkeypatch.setattr(subprocess, "Popen", Tracked)
    timeouts: list[float | None] = []
    run_orig = subprocess.run

    def run(args: Any, *a: Any, **kw: Any) -> Any:
        if list(args)[:1] == ["ssh"] and "-G" not in args:
            timeouts.append(kw.get("timeout"))
        return run_orig(args, *a, **kw)

    monkeypatch.setattr(subprocess, "run", run)
    waits = []

    def sleep(seconds: float) -> None:  # the drill waits between polls: nothing there runs
        alive = [p.args for p, _ in started if p.poll() is None]
        assert not alive, f"a remote command outlives the poll: {alive}"
        waits.append(seconds)

    clock = SimpleNamespace(time=time.time, monotonic=time.monotonic, sleep=sleep)
    monkeypatch.setattr(drill_mod, "time", clock)  # the drill's own clock only
    # a run submitted from here (this machine's record of remote runs names its host)
    monkeypatch.setenv("SLURM_TRAIN_STATE_DIR", str(tmp_path / "state"))
    remote.record(
        remote.RemoteRun(
            remote.Remote("login1", "", sys.executable), str(login), "r-1", "r", "42", ("42",)
        )
    )
    out = io.StringIO()
    argv = ["drill", "r-1", "--kind", "preempt", "--partition", "urgent", "--json"]
    assert main(argv, out=out) == 0
    report = json.loads(out.getvalue())
    assert report["outcome"] == "back: resumed at step 34"
    assert report["last_completed_step"] == 34 and report["steps_lost"] == 0
    assert report["stop_event"] == "preempted" and report["held_s"] is not None
    assert (login / "drill" / "preempt.sbatch").read_text() == "#!/bin/bash\nsleep 1\n"
    # the waiting happened here, between short commands that had all ended
    assert waits and all(p.poll() is not None for p, _ in started)
    logged = (tmp_path / "ssh.log").read_text()
    lines = [ln for ln in logged.splitlines() if " -- login1 " in ln]  # the script spans lines
    assert len(lines) == len(started) and lines
    assert not [ln for ln in lines if " -m jobs " in ln]  # the remote CLI never runs the drill
    from jobs.remotedrill import READ_TIMEOUT_S

    assert all(t is not None and t <= READ_TIMEOUT_S for t in timeouts)
    reads = [ln for ln in lines if "events.jsonl" in ln]
    shows = [ln for ln in lines if "scontrol show job" in ln]
    assert len(reads) >= len(waits) and len(shows) >= len(waits)  # one of each per poll
    assert any("sbatch" in ln for ln in lines) and any("StartTime=now" in ln for ln in lines)


def test_remote_files_come_over_a_piece_at_a_time(login: Path, tmp_path: Path) -> None:
    """Each poll brings only the new bytes; a file replaced by a shorter one is copied afresh."""
    from jobs.remotedrill import RemoteRunFiles

    run_ = remote.RemoteRun(remote.Remote("login1", "", sys.executable), str(login), "r-1")
    cache = tmp_path / "cache"
    cache.mkdir()
    files = RemoteRunFiles(run_, str(login), cache)
    files.refresh()
    assert (cache / "events.jsonl").read_bytes() == (login / "events.jsonl").read_bytes()
    assert not (cache / "resolved.yaml").exists()
    first = files.offsets["metrics.jsonl"]
    with (login / "metrics.jsonl").open("ab") as f:
        f.write(b'{"time": 1, "kind": "train", "step": 40}\n')
    files.refresh()
    assert (cache / "metrics.jsonl").read_bytes() == (login / "metrics.jsonl").read_bytes()
    assert files.offsets["metrics.jsonl"] > first
    (login / "metrics.jsonl").write_bytes(b"{}\n")
    files.refresh()
    assert (cache / "metrics.jsonl").read_bytes() == b"{}\n"
    assert files.uid() == __import__("os").getuid()


def _drill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, login: Path, *argv: str) -> Any:
    """``jobs drill r-1 --json ARGV`` of the recorded remote run, on the drill's own clock:
    returns (exit code, stdout, stderr, the ssh commands between the drill's waits)."""
    import contextlib

    log = tmp_path / "ssh.log"
    now = [1000.0]
    between: list[int] = []
    seen = [0]

    def count() -> int:
        text = log.read_text() if log.exists() else ""
        return sum(" -- login1 " in ln for ln in text.splitlines())

    def sleep(seconds: float) -> None:
        total = count()
        between.append(total - seen[0])
        seen[0] = total
        now[0] += seconds

    clock = SimpleNamespace(time=time.time, monotonic=lambda: now[0], sleep=sleep)
    monkeypatch.setattr(drill_mod, "time", clock)
    monkeypatch.setenv("SLURM_TRAIN_STATE_DIR", str(tmp_path / "state"))
    remote.record(
        remote.RemoteRun(
            remote.Remote("login1", "", sys.executable), str(login), "r-1", "r", "42", ("42",)
        )
    )
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["drill", "r-1", "--json", *argv], out=out)
    return code, out.getvalue(), err.getvalue(), between


def test_a_drill_poll_is_one_ssh_command(
    login: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slurm's answer and the files' new bytes come in ONE round trip per poll."""
    state = tmp_path / "slurm.json"
    state.write_text(json.dumps({"state": "PENDING", "restarts": 0, "reason": "Priority"}))
    argv = ("--kind", "preempt", "--partition", "urgent", "--timeout", "10")
    code, _, err, between = _drill(tmp_path, monkeypatch, login, *argv)
    assert code != 0 and "gave up after 10 s waiting for the job to run and train" in err
    assert len(between) >= 5  # the job never trains: the drill polls until its --timeout
    assert between[1:] == [1] * (len(between) - 1)  # each poll after the first: one command
    lines = (tmp_path / "ssh.log").read_text()
    assert "scontrol show job" in lines and "events.jsonl" in lines


def test_a_dropped_connection_mid_drill_is_tried_again_and_changes_nothing(
    login: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Right after the preempting job's sbatch the connection goes for 4 commands: the drill
    backs off (one line for the outage, one when it is back), sends nothing twice, and reports
    the same resume."""
    plan = tmp_path / "plan"
    plan.write_text("")
    monkeypatch.setenv("FAKE_SSH_PLAN", str(plan))
    monkeypatch.setenv("FAKE_SLURM_DROPS", "4")
    argv = ("--kind", "preempt", "--partition", "urgent")
    code, out, err, _ = _drill(tmp_path, monkeypatch, login, *argv)
    assert code == 0, err
    report = json.loads(out)
    assert report["outcome"] == "back: resumed at step 34" and report["steps_lost"] == 0
    assert err.count("trying again with back-off") == 1 and err.count("connected again") == 1
    assert plan.read_text() == ""  # every drop was met
    st = json.loads((tmp_path / "slurm.json").read_text())
    assert st["sbatch"] == 1


def test_a_lost_sbatch_reply_is_checked_not_sent_again(
    login: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preempting job's sbatch reaches Slurm but its reply is lost: the drill finds it in
    the queue (its own name) and does not submit a second one (which would preempt the job
    again after its resume)."""
    plan = tmp_path / "plan"
    plan.write_text("lose --job-name=drill-preempt\n")
    monkeypatch.setenv("FAKE_SSH_PLAN", str(plan))
    argv = ("--kind", "preempt", "--partition", "urgent")
    code, out, err, _ = _drill(tmp_path, monkeypatch, login, *argv)
    assert code == 0, err
    assert json.loads(out)["outcome"] == "back: resumed at step 34"
    assert plan.read_text() == ""
    assert json.loads((tmp_path / "slurm.json").read_text())["sbatch"] == 1
    assert "not sent again" in err
