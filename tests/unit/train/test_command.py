"""train.command.supervisor: supervision of ``entrypoint.command`` without Slurm (real child
processes).

A signal "from Slurm" is simulated the way Slurm delivers a step signal: to the supervisor (this
process) AND to the command's processes.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cluster.errors import ClusterError
from train.command import (
    CommandRun,
    child_environ,
    plan_stop,
    resolve_argv,
    run_command,
    selfrequeue,
)
from train.command.processes import parse_sigmask, topmost
from train.command.rootcause import write_report
from train.env import DistEnv
from train.history import RunHistory, attempt_completed_at
from train.spec.config import RunConfig
from train.stop import REQUEUE_EXIT_CODE

REPO = Path(__file__).resolve().parents[3]
USR1, USR2, TERM = int(signal.SIGUSR1), int(signal.SIGUSR2), int(signal.SIGTERM)

# A command that writes its pid, records every signal it gets, and acts on USR1 (save + exit 0)
# unless told to ignore its own handler's meaning ("stubborn").
CHILD = r"""
import os, signal, sys, time
out = os.environ["OUT"]
mode = sys.argv[1]
if os.environ.get("CYCLE"):  # an object only the collector's last pass at the exit frees
    class Cycle:
        def __init__(self, path):
            self.me, self.path, self.os_open, self.os_close = self, path, os.open, os.close
        def __del__(self):
            self.os_close(self.os_open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
    keep = Cycle(out + ".collected")
def note(s, f):
    with open(out + ".signals", "a") as fh:
        fh.write(signal.Signals(s).name + "\n")
    if mode == "saver" and s == signal.SIGUSR1:
        open(out + ".saved", "w").write(os.environ.get("TRAIN_RESTART_COUNT", "?"))
        sys.exit(0)
if mode in ("saver", "stubborn"):
    signal.signal(signal.SIGUSR1, note)
if mode == "requeuer":
    def requeue(s, f):
        open(os.environ["OUT"] + ".requeued", "w").write("1")
    signal.signal(signal.SIGUSR1, requeue)
if mode == "lightning":  # Lightning's auto_requeue: save, `scontrol requeue JOB` by name, exit
    def requeue_by_name(s, f):
        import subprocess
        rc = subprocess.call(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]])
        open(out + ".rc", "w").write(str(rc))
        sys.exit(0)
    signal.signal(signal.SIGUSR1, requeue_by_name)
open(out + ".pid", "w").write(str(os.getpid()))
if mode == "done":
    sys.exit(0)
for _ in range(600):
    time.sleep(0.05)
sys.exit(0)
"""


def _config(command: list[str], **entry: Any) -> RunConfig:
    return RunConfig.model_validate(
        {"entrypoint": {"command": command, **entry}, "requeue": {"signal_delay_s": 30}}
    )


def _script(tmp_path: Path) -> Path:
    path = tmp_path / "child.py"
    path.write_text(CHILD)
    return path


def _wait_file(path: Path, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return path.read_text()


def _slurm_signal_later(pid_file: Path, sig: int = USR2) -> threading.Thread:
    """Like a step signal: to the command's process and to us (the supervisor)."""

    def go() -> None:
        child = int(_wait_file(pid_file))
        time.sleep(0.3)  # past the child's handler installation
        os.kill(child, sig)
        os.kill(os.getpid(), sig)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def _events(run_dir: Path) -> list[str]:
    return [e["event"] for e in RunHistory(run_dir).events()]


# -- pure parts ---------------------------------------------------------------------------------
def test_resolve_argv_python_means_the_running_interpreter(tmp_path: Path) -> None:
    exe = tmp_path / "venv" / "bin" / "python"
    exe.parent.mkdir(parents=True)
    exe.write_text("")
    tool = exe.parent / "torchrun"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert resolve_argv(["python", "x.py"], str(exe)) == [str(exe), "x.py"]
    assert resolve_argv(["python3.11", "-m", "m"], str(exe)) == [str(exe), "-m", "m"]
    assert resolve_argv(["torchrun", "a"], str(exe)) == [str(tool), "a"]
    assert resolve_argv(["/opt/py/bin/python", "x.py"], str(exe)) == ["/opt/py/bin/python", "x.py"]
    assert resolve_argv(["bash", "run.sh"], str(exe)) == ["bash", "run.sh"]


def test_train_restart_count_counts_restarts_in_place_too(tmp_path: Path) -> None:
    """Issue 44: a command that resumes when TRAIN_RESTART_COUNT > 0 resumes after a restart
    in place (a new step of the same allocation: SLURM_RESTART_COUNT stays as it was)."""
    for restart, in_place, expected in ((0, 0, "0"), (0, 1, "1"), (0, 2, "2"), (2, 1, "3")):
        env = DistEnv(job_id="42", restart_count=restart, in_place=in_place)
        child = child_environ({}, env, tmp_path, None, "auto", str(tmp_path / "python"))
        assert child["TRAIN_RESTART_COUNT"] == expected, (restart, in_place)


def test_child_environ_documents_where_the_run_is(tmp_path: Path) -> None:
    env = DistEnv(rank=1, world_size=2, job_id="42", restart_count=3)
    exe = str(tmp_path / "bin" / "python")
    child = child_environ(
        {"PATH": "/usr/bin"}, env, tmp_path, tmp_path / "ck" / "step-5", "auto", exe
    )
    assert child["RUN_DIR"] == str(tmp_path)
    assert child["TRAIN_RESTART_COUNT"] == "3"
    assert child["TRAIN_RESUME_FROM"] == str(tmp_path / "ck" / "step-5")
    assert child["TRAIN_CHECKPOINT_DIR"] == str(tmp_path / "checkpoints")
    assert child["TRAIN_STOP_SIGNAL"] == "auto"
    assert child["PL_TRAINER_DEFAULT_ROOT_DIR"] == str(tmp_path)
    assert child["RANK"] == "1" and child["WORLD_SIZE"] == "2"
    # the venv's bin first, after our scontrol where there is a real one (test_selfrequeue.py)
    path = [p for p in child["PATH"].split(os.pathsep) if p != str(selfrequeue.SHIM_DIR)]
    assert path[0] == str(tmp_path / "bin")
    # the user's own choice of Lightning root wins; a stale resume path does not leak through
    mine = child_environ(
        {"PL_TRAINER_DEFAULT_ROOT_DIR": "/mine", "TRAIN_RESUME_FROM": "/old"},
        env,
        tmp_path,
        None,
        "none",
        exe,
    )
    assert mine["PL_TRAINER_DEFAULT_ROOT_DIR"] == "/mine"
    assert "TRAIN_RESUME_FROM" not in mine


def test_parse_sigmask_and_topmost() -> None:
    # SigCgt of a Python process with USR1 and TERM handlers (+ SIGINT, Python's own)
    assert parse_sigmask("0000000000004202") == {2, 10, 15}
    assert parse_sigmask("zz") == set()
    tree = {10: 0, 11: 10, 12: 11, 13: 10}
    assert topmost(tree, [11, 12, 13]) == [11, 13]
    assert topmost(tree, [12]) == [12]


@pytest.mark.parametrize(
    ("configured", "caught", "trigger", "slurm", "expect"),
    [
        # Lightning's SLURMEnvironment catches USR1 (and TERM): USR1, to the process catching it
        ("auto", {10: {USR1, TERM, 2}}, USR2, True, (USR1, (10,), False, False)),
        # torchrun catches TERM and passes it on: only the launcher gets it, not its workers
        ("auto", {10: {TERM}, 11: {TERM}}, USR2, True, (TERM, (10,), False, False)),
        # a wrapper shell (no handlers) around a Python script catching USR1: the script
        ("auto", {10: set(), 11: {USR1}}, USR2, True, (USR1, (11,), False, False)),
        # the command catches the job's own signal: Slurm delivered it already, once
        ("auto", {10: {USR2}}, USR2, True, (USR2, (), True, False)),
        # catches nothing: stopped at once
        ("auto", {10: {2}}, USR2, True, (None, (), False, True)),
        ("none", {10: {USR1}}, USR2, True, (None, (), False, True)),
        # told USR1, catches nothing: the command itself gets it anyway
        ("USR1", {10: set()}, USR2, True, (USR1, (10,), False, False)),
        ("USR2", {10: {USR2}}, USR2, True, (USR2, (), True, False)),
        # Slurm's TERM reaches everyone; outside Slurm it is passed on
        ("auto", {10: {USR1}}, TERM, True, (None, (), True, False)),
        ("auto", {10: {USR1}}, TERM, False, (TERM, (10,), False, False)),
    ],
)
def test_plan_stop(
    configured: str,
    caught: dict[int, set[int]],
    trigger: int,
    slurm: bool,
    expect: tuple[Any, ...],
) -> None:
    tree = {10: 0, 11: 10} if 11 in caught else {10: 0}
    plan = plan_stop(trigger, USR2, configured, 10, slurm, tree, lambda p: caught.get(p, set()))
    assert (plan.signal, plan.targets, plan.by_slurm, plan.terminate) == expect
    assert plan.note


# -- real children, no Slurm ------------------------------------------------------------------
def test_completes_and_records(tmp_path: Path) -> None:
    config = _config([sys.executable, "-c", "print('hi')"])
    assert run_command(config, DistEnv(), tmp_path) == 0
    assert _events(tmp_path) == ["complete"]


# A command that saves on USR2 and exits 0 at once (its stop_signal: Slurm's USR2 reaches it)
SAVES_ON_USR2 = r"""
import os, signal, sys, time
out = os.environ["OUT"]
def save(s, f):
    open(out + ".saved", "w").write("1")
    sys.exit(0)
signal.signal(signal.SIGUSR2, save)
open(out + ".pid", "w").write(str(os.getpid()))
for _ in range(600):
    time.sleep(0.05)
"""


def test_a_command_that_exits_0_on_the_stop_signal_is_stopped_not_complete(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The race seen on the cluster: the command saves on Slurm's signal and exits 0 before the
    supervisor's own copy of that signal is handled. Recorded ``complete``, the run would end
    with its work left; it is a stop (requeued), as the local executor and the after-step then
    agree (no ``complete`` for this attempt: train.history.attempt_completed_at)."""
    out = tmp_path / "c"
    monkeypatch.setenv("OUT", str(out))
    script = tmp_path / "saver2.py"
    script.write_text(SAVES_ON_USR2)
    config = _config(["python", str(script)], stop_signal="USR2")
    run = CommandRun(config, DistEnv(), tmp_path, None)
    run.stop_beat_s = 20.0  # the beat under test, long enough for a loaded machine

    def slurm() -> None:  # the command gets the signal first; ours comes after its exit
        os.kill(int(_wait_file(Path(f"{out}.pid"))), USR2)
        _wait_file(Path(f"{out}.saved"))
        time.sleep(0.5)
        os.kill(os.getpid(), USR2)

    previous = signal.signal(USR2, lambda s, f: None)  # a late USR2 must not end pytest
    try:
        t = threading.Thread(target=slurm, daemon=True)
        t.start()
        code = run.run()
        t.join()
    finally:
        signal.signal(USR2, previous)
    assert _events(tmp_path) == ["preempted", "requeue"]
    assert code == REQUEUE_EXIT_CODE  # outside Slurm: the launcher requeues on 75
    assert attempt_completed_at(RunHistory(tmp_path).events(), job_id=None, restart_count=0) is None


def test_the_commands_first_output_is_on_its_events(tmp_path: Path) -> None:
    """Its first write (here after 0.6 s of silence: its "imports") is on the events rank 0
    records after it, for the goodput ledger's start-up; a silent command has none."""
    quiet_then_speak = (
        "import time, pathlib, sys; time.sleep(0.6); "
        "pathlib.Path(sys.argv[1]).write_text(repr(time.time())); print('step 1', flush=True); "
        "time.sleep(3)"
    )
    config = _config([sys.executable, "-c", quiet_then_speak, str(tmp_path / "spoke")])
    started = time.time()
    assert run_command(config, DistEnv(), tmp_path / "run") == 0
    (complete,) = RunHistory(tmp_path / "run").events()
    spoke = float((tmp_path / "spoke").read_text())
    # the event keeps milliseconds: a look right after the write may round to just before it
    assert started + 0.5 < spoke <= complete["first_output_at"] + 0.001 <= spoke + 3, complete
    config = _config([sys.executable, "-c", "import time; time.sleep(0.5)"])
    assert run_command(config, DistEnv(), tmp_path / "silent") == 0
    (complete,) = RunHistory(tmp_path / "silent").events()
    assert "first_output_at" not in complete


def test_failure_records_exit_code_and_stderr_tail(tmp_path: Path) -> None:
    code = "import sys; print('line one', file=sys.stderr); sys.exit('ValueError: bad lr')"
    config = _config(["python", "-c", code])
    assert run_command(config, DistEnv(), tmp_path) == 1
    (failure,) = [e for e in RunHistory(tmp_path).events() if e["event"] == "failure"]
    assert "exited 1" in failure["error"] and "ValueError: bad lr" in failure["error"]
    assert failure["exit_code"] == 1
    assert failure["stderr_tail"][-2:] == ["line one", "ValueError: bad lr"]


def test_killed_by_a_signal_is_named(tmp_path: Path) -> None:
    config = _config(["python", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"])
    assert run_command(config, DistEnv(), tmp_path) == 128 + signal.SIGSEGV
    (failure,) = [e for e in RunHistory(tmp_path).events() if e["event"] == "failure"]
    assert "killed by SIGSEGV" in failure["error"]
    assert failure["signal"] == "SIGSEGV"


def test_unstartable_command_is_bad_input(tmp_path: Path) -> None:
    from train.errors import EntrypointError

    with pytest.raises(EntrypointError, match="no-such-program"):
        run_command(_config(["no-such-program-h7"]), DistEnv(), tmp_path)


def test_saver_gets_usr1_once_and_is_requeued(tmp_path: Path, monkeypatch: Any) -> None:
    out = tmp_path / "c"
    monkeypatch.setenv("OUT", str(out))
    config = _config(["python", str(_script(tmp_path)), "saver"])
    t = _slurm_signal_later(Path(f"{out}.pid"))
    code = run_command(config, DistEnv(restart_count=2), tmp_path)
    t.join()
    assert code == REQUEUE_EXIT_CODE  # outside Slurm: the launcher requeues on 75
    assert Path(f"{out}.saved").read_text() == "2"
    # USR2 (the job's signal) was ignored by the command; USR1 came once, from us
    assert Path(f"{out}.signals").read_text().split() == ["SIGUSR1"]
    history = RunHistory(tmp_path)
    assert _events(tmp_path) == ["preempted", "requeue"]
    assert history.to_dict()["preemptions"] == 1


def test_command_ignoring_signals_is_stopped_not_failed(tmp_path: Path, monkeypatch: Any) -> None:
    out = tmp_path / "c"
    monkeypatch.setenv("OUT", str(out))
    config = _config(["python", str(_script(tmp_path)), "plain"])
    t = _slurm_signal_later(Path(f"{out}.pid"))
    started = time.monotonic()
    code = run_command(config, DistEnv(), tmp_path)
    t.join()
    assert code == REQUEUE_EXIT_CODE
    assert time.monotonic() - started < 15  # stopped at once, not after the grace time
    assert _events(tmp_path) == ["preempted", "requeue"]


def test_grace_time_then_stopped(tmp_path: Path, monkeypatch: Any) -> None:
    out = tmp_path / "c"
    monkeypatch.setenv("OUT", str(out))
    config = _config(["python", str(_script(tmp_path)), "stubborn"])
    run = CommandRun(config, DistEnv(), tmp_path, None)
    run.grace_s = 1.0
    t = _slurm_signal_later(Path(f"{out}.pid"))
    assert run.run() == REQUEUE_EXIT_CODE
    t.join()
    assert Path(f"{out}.signals").read_text().split() == ["SIGUSR1"]
    assert _events(tmp_path) == ["preempted", "requeue"]


class FakeSlurm:
    """What ``scontrol show job`` says; the job counts as requeued once ``flag`` exists. As
    Slurm 22.05 does (checked on the local cluster), a second requeue of a requeued job is
    refused ("Job is pending execution"; its Restarts unchanged)."""

    def __init__(self, flag: Path) -> None:
        self.flag = flag
        self.requeues: list[str] = []
        self.calls: list[str] = []  # in order: "show_job", "requeue"

    def restarts(self) -> str:
        return "1" if self.flag.exists() else "0"

    def installed_release(self) -> str | None:
        return None  # scontrol cannot say: the stop asks for the requeue itself (22.05's way)

    def show_job(self, job_id: str) -> dict[str, str]:
        self.calls.append("show_job")
        return {
            "JobState": "RUNNING",
            "EndTime": "2099-01-01T00:00:00",
            "Restarts": self.restarts(),
        }

    def requeue(self, job_id: str) -> None:
        self.calls.append("requeue")
        if self.restarts() != "0":
            raise ClusterError(f"Job is pending execution for job {job_id}")
        self.requeues.append(job_id)


def _preempted_under_slurm(
    tmp_path: Path, monkeypatch: Any, mode: str, slurm: FakeSlurm, grace_s: float | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """The test script in ``mode`` as job 77's command under ``slurm``, preempted once it runs:
    (the task's exit code, the events recorded)."""
    out = tmp_path / "c"
    monkeypatch.setenv("OUT", str(out))
    config = _config(["python", str(_script(tmp_path)), mode])
    run = CommandRun(config, DistEnv(job_id="77"), tmp_path, None, client=slurm)
    if grace_s is not None:
        run.grace_s = grace_s
    t = _slurm_signal_later(Path(f"{out}.pid"))
    code = run.run()
    t.join()
    return code, RunHistory(tmp_path).events()


def test_self_requeueing_framework_is_not_requeued_twice(tmp_path: Path, monkeypatch: Any) -> None:
    slurm = FakeSlurm(tmp_path / "c.requeued")
    code, events = _preempted_under_slurm(tmp_path, monkeypatch, "requeuer", slurm, 3.0)
    assert code == 0 and slurm.requeues == []
    assert [e["event"] for e in events] == ["preempted", "requeue"]
    assert events[-1]["via"] == "command"


def test_a_commands_own_scontrol_requeue_in_a_stop_is_the_stops_one_requeue(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # Lightning's handler runs `scontrol requeue $SLURM_JOB_ID` by name: ours first on its PATH
    # takes it (the real one, here a stand-in that would requeue, is never run), the command
    # sees a requeue that succeeded, and the stop requeues the job once, saying who asked
    real = tmp_path / "slurm-bin"
    real.mkdir()
    (real / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "real-calls"}\n')
    (real / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{real}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    (tmp_path / "node-tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "node-tmp"))  # the markers' node
    slurm = FakeSlurm(tmp_path / "never")
    code, events = _preempted_under_slurm(tmp_path, monkeypatch, "lightning", slurm)
    assert (tmp_path / "c.rc").read_text() == "0"
    assert not (tmp_path / "real-calls").exists()
    assert code == 0 and slurm.requeues == ["77"]
    assert [e["event"] for e in events] == ["preempted", "requeue"]
    assert events[-1]["via"] == "scontrol" and events[-1]["asked_by"] == "command"
    # its markers were on the node, and are gone with their attempt's folder
    assert [p.name for p in (tmp_path / "node-tmp").iterdir()] == [f"slurm-train-{os.getuid()}"]
    assert list((tmp_path / "node-tmp").rglob("*requeue*")) == []


def test_a_stopped_commands_interpreter_exits_without_the_last_collection(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # issue 46: at a stop the job's nodes wait for the command's exit; its interpreter skips the
    # collector's passes over what is still alive (train.command.fastexit): an object only that
    # pass would free is never freed
    monkeypatch.setenv("CYCLE", "1")
    (tmp_path / "node-tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "node-tmp"))  # the markers' node
    slurm = FakeSlurm(tmp_path / "never")
    code, events = _preempted_under_slurm(tmp_path, monkeypatch, "saver", slurm)
    assert code == 0 and slurm.requeues == ["77"]
    assert [e["event"] for e in events] == ["preempted", "requeue"]
    assert (tmp_path / "c.saved").exists() and not (tmp_path / "c.collected").exists()


def test_a_command_that_completes_exits_as_python_makes_it(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("CYCLE", "1")
    monkeypatch.setenv("OUT", str(tmp_path / "c"))
    (tmp_path / "node-tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "node-tmp"))
    config = _config(["python", str(_script(tmp_path)), "done"])
    run = CommandRun(config, DistEnv(job_id="77"), tmp_path, None, client=FakeSlurm(tmp_path / "x"))
    assert run.run() == 0 and _events(tmp_path)[-1] == "complete"
    assert (tmp_path / "c.collected").exists()


class SlurmRequeuesOnceTheCommandIsGone(FakeSlurm):
    """A preemption's grace ending while a stuck command is being stopped: Slurm requeues the
    job (``Restarts`` 1) once the command's process (its pid in ``pid_file``) is gone."""

    def restarts(self) -> str:
        try:
            os.kill(int(self.flag.read_text()), 0)
        except (OSError, ValueError):
            return "1" if self.flag.exists() else "0"
        return "0"


def test_a_requeue_after_the_command_was_stopped_is_slurms_not_the_commands(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # the command got the save signal but never exited (Lightning's save deadlocked on a
    # barrier); we stop it at the grace's end and Slurm's own requeue lands meanwhile: recorded
    # as Slurm's, and not requeued a second time by us
    slurm = SlurmRequeuesOnceTheCommandIsGone(tmp_path / "c.pid")
    code, events = _preempted_under_slurm(tmp_path, monkeypatch, "stubborn", slurm, 1.0)
    assert code == 0 and slurm.requeues == []
    assert [e["event"] for e in events] == ["preempted", "requeue"]
    assert events[-1]["via"] == "slurm"


class SlurmSeesTheCommand(FakeSlurm):
    """Which calls come while the command (its pid in ``pid_file``) is still there."""

    def __init__(self, flag: Path, pid_file: Path) -> None:
        super().__init__(flag)
        self.pid_file = pid_file
        self.seen: list[tuple[str, bool]] = []

    def _alive(self) -> bool:
        try:
            os.kill(int(self.pid_file.read_text()), 0)
        except (OSError, ValueError):
            return False
        return True

    def show_job(self, job_id: str) -> dict[str, str]:
        self.seen.append(("show_job", self._alive()))
        return super().show_job(job_id)

    def requeue(self, job_id: str) -> None:
        self.seen.append(("requeue", self._alive()))
        super().requeue(job_id)


def test_the_requeue_is_the_one_call_after_the_commands_exit(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # Issue 46: the job leaves its nodes one Slurm call after the command exits: no look at
    # Slurm between its exit and the requeue (the facts were gathered while it saved)
    slurm = SlurmSeesTheCommand(tmp_path / "never", tmp_path / "c.pid")
    code, events = _preempted_under_slurm(tmp_path, monkeypatch, "saver", slurm)
    assert code == 0 and slurm.requeues == ["77"]
    after_exit = [call for call, alive in slurm.seen if not alive]
    assert after_exit == ["requeue"]
    assert [e["event"] for e in events] == ["preempted", "requeue"]


def test_the_requeue_says_when_the_command_was_seen_gone(tmp_path: Path, monkeypatch: Any) -> None:
    # Issue 46: the requeue event carries when the supervisor saw the command's exit, so the
    # time from that exit to the requeue (ours) is read from the run's own records (the bench)
    slurm = FakeSlurm(tmp_path / "never")
    code, events = _preempted_under_slurm(tmp_path, monkeypatch, "saver", slurm)
    assert code == 0 and slurm.requeues == ["77"]
    requeue = events[-1]
    assert requeue["event"] == "requeue" and requeue["via"] == "scontrol"
    last_line = (tmp_path / "c.saved").stat().st_mtime  # the command's last write, then exit
    assert last_line - 0.01 <= requeue["exited_at"] <= requeue["time"]
    assert "exited_at" not in events[0]  # the decision was recorded before the exit


def test_rank_0_says_when_it_saw_every_ranks_command_gone(tmp_path: Path) -> None:
    run = CommandRun(
        _config(["true"]), DistEnv(job_id="77", world_size=2), tmp_path, None,
        client=FakeSlurm(tmp_path / "never"),
    )  # fmt: skip
    markers = run._marker_dir()
    markers.mkdir(parents=True)
    (markers / "0").touch()
    assert run._wait_ranks(time.time() + 0.2) is None  # rank 1's command never went: no time
    (markers / "1").touch()
    before = time.time()
    seen = run._wait_ranks(time.time() + 5)
    assert seen is not None and before <= seen <= time.time()


def test_saver_under_slurm_is_requeued_by_us(tmp_path: Path, monkeypatch: Any) -> None:
    slurm = FakeSlurm(tmp_path / "never")
    code, events = _preempted_under_slurm(tmp_path, monkeypatch, "saver", slurm)
    assert code == 0 and slurm.requeues == ["77"]
    assert [e["event"] for e in events] == ["preempted", "requeue"]
    assert events[-1]["via"] == "scontrol"


SAVES_ON_TERM = SAVES_ON_USR2.replace("SIGUSR2", "SIGTERM")


@pytest.mark.parametrize("a_rank_failed", [False, True])
def test_an_operators_term_to_a_command_run_saves_and_requeues(
    tmp_path: Path, monkeypatch: Any, a_rank_failed: bool
) -> None:
    """Item 7 for entrypoint.command: ``scancel --signal=TERM`` while Slurm runs the job on,
    under a batch script that restarts steps in place. No rank's command reported a failure:
    an operator's stop, recorded and requeued like the requeue signal (README); a rank's
    command that failed first (not by a TERM): srun is ending the step, nothing recorded."""
    if a_rank_failed:
        write_report(tmp_path, "77", 0, 1, time.time(), "command exited 1: boom", ["boom"])
    write_report(tmp_path, "77", 0, 1, time.time() + 1, "command killed by SIGTERM", [],
                 "SIGTERM")  # fmt: skip
    out = tmp_path / "c"
    monkeypatch.setenv("OUT", str(out))
    script = tmp_path / "saver_term.py"
    script.write_text(SAVES_ON_TERM)
    slurm = FakeSlurm(tmp_path / "never")
    env = DistEnv(job_id="77", world_size=2, in_place_supervised=True)
    run = CommandRun(_config(["python", str(script)]), env, tmp_path, None, client=slurm)
    run.stop_beat_s = 20.0
    previous = signal.signal(TERM, lambda s, f: None)  # a late TERM must not end pytest
    try:
        t = _slurm_signal_later(Path(f"{out}.pid"), TERM)
        code = run.run()
        t.join()
    finally:
        signal.signal(TERM, previous)
    events = [e["event"] for e in RunHistory(tmp_path).events()]
    if a_rank_failed:
        assert (code, events, slurm.requeues) == (1, [], [])
    else:
        assert (code, events, slurm.requeues) == (0, ["preempted", "requeue"], ["77"])


class SlowController(FakeSlurm):
    """A busy controller: every ``scontrol`` answer takes ``delay`` s; the job is preempted
    from a partition with GraceTime ``grace``."""

    def __init__(self, flag: Path, delay: float, grace: int) -> None:
        super().__init__(flag)
        self.delay, self.grace = delay, grace
        self.asked_at: list[float] = []

    def show_job(self, job_id: str) -> dict[str, str]:
        self.asked_at.append(time.time())
        time.sleep(self.delay)
        return {
            **super().show_job(job_id),
            "Partition": "debug",
            "PreemptTime": "2026-01-01T00:00:00",
        }

    def partition(self, name: str) -> Any:
        return type("Partition", (), {"grace_time_s": self.grace})()


def test_rank0_forwards_before_asking_slurm_and_fits_the_grace_time(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Every rank's command gets its signal at once (Lightning's handler runs a barrier: ranks
    signalled seconds apart block each other), and a preempted command is stopped before
    Slurm's GraceTime kill, with time left for our requeue."""
    out = tmp_path / "c"
    monkeypatch.setenv("OUT", str(out))
    config = _config(["python", str(_script(tmp_path)), "stubborn"])  # stop_grace_s 30
    slurm = SlowController(tmp_path / "never", delay=1.5, grace=9)
    run = CommandRun(config, DistEnv(job_id="77"), tmp_path, None, client=slurm)
    t = _slurm_signal_later(Path(f"{out}.pid"))
    started = time.monotonic()
    assert run.run() == 0
    took = time.monotonic() - started
    t.join()
    signalled_at = Path(f"{out}.signals").stat().st_mtime
    assert signalled_at < slurm.asked_at[0] + 1.0  # not after the slow first answer
    assert Path(f"{out}.signals").read_text().split() == ["SIGUSR1"]
    assert run.grace_s == 4.0  # GraceTime 9 s - 5 s for the requeue
    assert took < 20, took  # stopped at the partition's grace, not after stop_grace_s=30
    assert slurm.requeues == ["77"]
    assert _events(tmp_path) == ["preempted", "requeue"]


def test_a_stop_over_the_budget_still_saves_and_is_not_requeued(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Issue 24: a command over its budget used to get TERM without its save signal, losing its
    work since the last periodic save. It saves (at once, like any stop) and is not requeued."""
    out = tmp_path / "c"
    monkeypatch.setenv("OUT", str(out))
    config = RunConfig.model_validate(
        {
            "entrypoint": {"command": ["python", str(_script(tmp_path)), "saver"]},
            "requeue": {"signal_delay_s": 30, "max_preemptions": 0},
        }
    )
    slurm = SlowController(tmp_path / "never", delay=0.1, grace=9)
    run = CommandRun(config, DistEnv(job_id="77"), tmp_path, None, client=slurm)
    t = _slurm_signal_later(Path(f"{out}.pid"))
    assert run.run() == 3  # BUDGET_EXHAUSTED_EXIT_CODE: never restarted
    t.join()
    assert Path(f"{out}.saved").exists()  # nothing since the last periodic save is lost
    assert Path(f"{out}.signals").read_text().split() == ["SIGUSR1"]
    assert slurm.requeues == []
    assert _events(tmp_path) == ["preempted", "budget_exhausted"]


class HeldStop:
    """A guard that caught the job's signal while the run was being set up."""

    requested = True
    signal_name = "SIGUSR2"
    received_at = 1.0


def test_stop_during_set_up_requeues_without_starting(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    config = _config(["python", "-c", f"open({str(marker)!r}, 'w')"])
    code = run_command(config, DistEnv(), tmp_path, early=HeldStop())
    assert code == REQUEUE_EXIT_CODE
    assert not marker.exists()
    assert _events(tmp_path) == ["preempted", "requeue"]


def test_history_of_a_command_shows_the_real_cause(tmp_path: Path) -> None:
    # a module of the user's own (a missing 'torch' is the node's: train.stop.causes)
    code = "import sys; sys.exit(\"ModuleNotFoundError: No module named 'mymodel'\")"
    config = RunConfig.model_validate(
        {"entrypoint": {"command": ["python", "-c", code]}, "requeue": {"max_failures": 0}}
    )
    assert run_command(config, DistEnv(restart_count=2), tmp_path) == 3  # budget spent
    d = RunHistory(tmp_path).to_dict()
    assert d["last_failure"]["exit_code"] == 1 and d["restarts"] == 2
    summary = RunHistory(tmp_path).summary()
    assert "failed 1x" in summary and "No module named 'mymodel'" in summary
    assert "None" not in summary


def test_history_of_a_completed_command_has_no_step(tmp_path: Path) -> None:
    assert run_command(_config(["python", "-c", "pass"]), DistEnv(), tmp_path) == 0
    assert RunHistory(tmp_path).summary() == "complete"


def test_spec_fields_for_the_stop(tmp_path: Path) -> None:
    from train.errors import ConfigError
    from train.spec.config import load_run_config

    spec = tmp_path / "s.yaml"
    spec.write_text(
        "requeue: {signal_delay_s: 20}\n"
        "entrypoint: {command: [python, x.py], stop_signal: sigterm, stop_grace_s: 60}\n"
    )
    config = load_run_config(spec)
    assert config.entrypoint is not None and config.entrypoint.stop_signal == "TERM"
    run = CommandRun(config, DistEnv(), tmp_path, None)
    assert run.grace_s == 10  # capped: gone before the time limit
    spec.write_text("entrypoint: {command: [python, x.py], stop_signal: KILL}\n")
    with pytest.raises(ConfigError, match=r"stop_signal.*or auto"):
        load_run_config(spec)


@pytest.mark.parametrize(
    ("job_signal", "stop_signal", "ignored"),
    [
        ("USR2", "auto", True),  # the default: a plain script must not die of Slurm's USR2
        ("USR1", "auto", False),  # Lightning's own signal: it must be able to install it
        ("USR2", "USR2", False),  # the command's own stop signal
        ("TERM", "auto", False),
        ("HUP", "none", True),
    ],
)
def test_which_job_signal_the_command_starts_ignoring(
    tmp_path: Path, job_signal: str, stop_signal: str, ignored: bool
) -> None:
    out = tmp_path / "disp"
    code = (
        "import signal, sys; "
        f"open({str(out)!r}, 'w').write(str(signal.getsignal(signal.SIG{job_signal}) "
        "== signal.SIG_IGN))"
    )
    config = RunConfig.model_validate(
        {
            "entrypoint": {"command": ["python", "-c", code], "stop_signal": stop_signal},
            "requeue": {"signal": job_signal},
        }
    )
    run = CommandRun(config, DistEnv(), tmp_path, None)
    assert run.shielded() is ignored
    assert run.run() == 0
    assert out.read_text() == str(ignored)


def test_stderr_tail_passes_everything_through_and_keeps_the_last_lines() -> None:
    from train.command.processes import StderrTail

    read_fd, write_fd = os.pipe()
    sink = io.BytesIO()
    tail = StderrTail(os.fdopen(read_fd, "rb"), sink, keep=3)
    data = b"epoch 1\n" + b"".join(b"\r%d%%" % i for i in range(0, 101, 25)) + b"\nboom\nlast"
    os.write(write_fd, data)
    os.close(write_fd)
    assert tail.lines() == ["75%", "100%", "boom", "last"][-3:]
    assert sink.getvalue() == data


def test_a_finished_task_ignores_late_stop_signals(tmp_path: Path) -> None:
    """A preemption signal that reaches a task while Python shuts down (it restores SIG_DFL for
    its own handlers then) would kill it and turn a COMPLETED job into FAILED (seen on the
    local cluster): jobs.launch ignores the stop signals once train returned."""
    from jobs.launch import TrainLaunch

    spec = tmp_path / "spec.yaml"
    spec.write_text("entrypoint: {command: [python, -c, pass]}\n")
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM)}
    try:
        assert TrainLaunch(str(spec), str(tmp_path / "run"))() == 0
        assert all(signal.getsignal(s) == signal.SIG_IGN for s in saved)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


# A command that writes a few lines (its progress), then stops writing: stuck in a wait.
QUIET_AFTER_A_WHILE = r"""
import sys, time
for i in range(3):
    print(f"step {i}", flush=True)
    time.sleep(0.3)
def wait_forever_in_a_collective():
    time.sleep(3600)
wait_forever_in_a_collective()
"""


def test_a_command_that_stops_writing_is_a_hang(tmp_path: Path) -> None:
    """A command's progress is its output: silent for requeue.hang_timeout_s, it is a hang
    (what the kernel says of its processes recorded), its group and the rank are ended, and the
    run requeued within max_hangs. The supervisor runs as `python -m train` (the watcher
    SIGKILLs it)."""
    script = tmp_path / "quiet.py"
    script.write_text(QUIET_AFTER_A_WHILE)
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "entrypoint:\n"
        f"  command: [python, {script}]\n"
        "requeue:\n  hang_timeout_s: 2\n  max_hangs: 2\n"
    )
    run_dir = tmp_path / "run"
    out = tmp_path / "stdout.log"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}
    with out.open("wb") as stdout:  # a file, as Slurm's task logs are: its growth is progress
        proc = subprocess.Popen(
            [sys.executable, "-m", "train", "--config", str(spec), "--run-dir", str(run_dir)],
            stdout=stdout,
            stderr=subprocess.PIPE,
            env=env,
            cwd=tmp_path,
        )
        try:
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    assert "step 2" in out.read_text()
    events = RunHistory(run_dir).events()
    (hang,) = [e for e in events if e["event"] == "hang"]
    assert hang["timeout_s"] == 2 and hang["step"] is None
    assert hang["ranks"] == [] and hang["nodes"] == []  # output names no rank: nothing quarantined
    report = (Path(hang["stacks_dir"]) / "rank-0.stacks").read_text()
    assert "quiet.py" in report and "state" in report, report
    assert [e["event"] for e in events][-1] == "requeue"  # outside Slurm: exit 75 asked
    # the command (its own session) was ended with its supervisor: nothing left behind
    leftovers = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", leftovers.stdout


# One line on stdout (the watch is armed), then silent there but writing its own file: that is
# progress too (without counting it, this would be a hang 2 s after the first line).
WRITES_A_FILE = r"""
import os, sys, time
print("starting", flush=True)
with open(sys.argv[1], "w") as f:
    for i in range(25):
        f.write(f"step {i}\n")
        f.flush()
        time.sleep(0.2)
"""


def test_a_command_writing_only_files_is_making_progress(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITES_A_FILE)
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "entrypoint:\n"
        f"  command: [python, {script}, {tmp_path / 'own.log'}]\n"
        "requeue:\n  hang_timeout_s: 2\n"
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}
    with (tmp_path / "stdout.log").open("wb") as stdout:  # a file, as Slurm's task logs are
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "train",
                "--config",
                str(spec),
                "--run-dir",
                str(tmp_path / "run"),
            ],
            stdout=stdout,
            stderr=subprocess.PIPE,
            env=env,
            cwd=tmp_path,
            timeout=60,
            check=False,
        )
    assert "starting" in (tmp_path / "stdout.log").read_text()
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]  # 5 s, never 2 s without a write
    assert _events(tmp_path / "run") == ["start", "complete"]


def test_a_rank_whose_command_dies_after_rank_0_completed_the_run_is_no_failure(
    tmp_path: Path,
) -> None:
    """Seen on the real cluster: Lightning's rank 1 aborts at exit ("terminate called without
    an active exception", SIGABRT) just after rank 0 recorded the run complete. Requeued, the
    whole run trained again."""
    config = _config(["python", "-c", "import os, time; time.sleep(0.5); os.abort()"])
    env = DistEnv(rank=1, world_size=2, job_id="7", restart_count=1)

    def rank0_completes() -> None:
        time.sleep(1.5)
        RunHistory(tmp_path).append("complete", step=None, restart_count=1, job_id="7")

    t = threading.Thread(target=rank0_completes)
    t.start()
    assert CommandRun(config, env, tmp_path, None).run() == 0
    t.join()
    assert _events(tmp_path) == ["complete"]  # no failure, no requeue
    assert not (tmp_path / ".failures" / "7-1").exists()  # nobody claimed a failure


def test_a_rank_whose_command_hangs_at_exit_after_rank_0_completed_is_stopped(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Seen with the README's plain script under torchrun: rank 1 stuck at its exit (gloo's
    process group destroyed by DDP's reducer with the GIL held) after rank 0 finished; the
    job would hold its nodes until the command hang timeout (30 min). Stopped stop_grace_s
    after rank 0's complete; a complete of an older attempt is not this run's."""
    monkeypatch.setattr("train.command.supervisor._QUIET_LOOK_S", 0.3)
    pid_file = tmp_path / "pid"
    hung = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    config = RunConfig.model_validate(
        {  # the watchdog off: the look needs none (its own scan of the command's writes)
            "entrypoint": {"command": ["python", "-c", hung], "stop_grace_s": 1},
            "requeue": {"signal_delay_s": 30, "hang_watchdog": False},
        }
    )
    env = DistEnv(rank=1, world_size=2, job_id="7", restart_count=1)
    history = RunHistory(tmp_path)
    history.append("complete", step=None, restart_count=0, job_id="7")  # an older attempt

    def rank0_completes() -> None:
        time.sleep(1.5)
        history.append("complete", step=None, restart_count=1, job_id="7")

    t = threading.Thread(target=rank0_completes)
    t.start()
    began = time.monotonic()
    assert CommandRun(config, env, tmp_path, None).run() == 0
    took = time.monotonic() - began
    t.join()
    assert 2.5 <= took < 60, took  # not before this attempt's complete and its grace
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)  # the command is gone
    assert _events(tmp_path) == ["complete", "complete"]  # nothing recorded by rank 1


def test_a_rank_whose_command_dies_while_rank_0_trains_is_a_failure(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr("train.command.supervisor._COMPLETE_WAIT_S", 1.0)
    config = _config(["python", "-c", "import os; os.abort()"])
    env = DistEnv(rank=1, world_size=2, job_id="7", restart_count=1)
    RunHistory(tmp_path).append(
        "complete", step=None, restart_count=0, job_id="7"
    )  # an older attempt
    code = CommandRun(config, env, tmp_path, None).run()
    assert code != 0
    assert "failure" in _events(tmp_path)  # recorded by this rank, the first to fail


@pytest.mark.parametrize(
    ("argv", "launcher"),
    [
        (["/venv/bin/python3", "/venv/bin/torchrun", "--nproc-per-node=2", "train.py"], True),
        (["torchrun", "--standalone", "train.py"], True),
        (["python", "-u", "-m", "torch.distributed.run", "train.py"], True),
        (["python", "-m", "torch.distributed.launch", "train.py"], True),
        (["python", "train.py", "--torchrun"], False),  # a worker, whatever its arguments
        (["python", "-m", "mypkg.train"], False),
        (["bash", "-c", "torchrun train.py"], False),  # the shell: its torchrun child is one
        ([], False),
    ],
)
def test_which_processes_are_launcher_agents(argv: list[str], launcher: bool) -> None:
    from train.command.processes import is_launcher

    assert is_launcher(argv) is launcher


def _fake_process(proc: Path, pid: int, parent: int, argv: list[str], wchar: int) -> None:
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "status").write_text(f"Name:\tx\nPPid:\t{parent}\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "io").write_text(f"rchar: 1\nwchar: {wchar}\nsyscr: 1\n")


def test_a_launchers_own_writes_are_not_progress(tmp_path: Path) -> None:
    """Issue 25: torchrun's agent writes rendezvous keep-alive every 5 s whether its workers
    train or hang; only the workers' writes count."""
    from train.command.processes import written_bytes

    proc = tmp_path / "proc"
    _fake_process(proc, 10, 1, ["python", "/venv/bin/torchrun", "train.py"], 5_000)
    _fake_process(proc, 11, 10, ["python", "-u", "train.py"], 300)
    _fake_process(proc, 12, 10, ["python", "-u", "train.py"], 200)
    _fake_process(proc, 13, 11, ["python", "-c", "dataloader worker"], 7)
    _fake_process(proc, 99, 1, ["python", "other.py"], 1_000_000)  # not of the command
    assert written_bytes(10, proc) == 507
    (proc / "10" / "io").write_text("rchar: 1\nwchar: 9000\n")  # the agent chatters on
    assert written_bytes(10, proc) == 507  # no progress
    _fake_process(tmp_path / "p2", 20, 1, ["python", "train.py"], 42)  # no launcher: itself
    assert written_bytes(20, tmp_path / "p2") == 42


def test_a_commands_restart_records_the_step_it_had_reported(tmp_path: Path) -> None:
    """Round 2 item 6: a command that keeps no checkpoint of ours but reports its steps
    (train.report): its restart's start event carries the last reported step, the progress the
    no-progress stop compares (train.history.budget_counts)."""
    from train.entry import run_entrypoint
    from train.report import REPORT_KIND

    line = {"kind": REPORT_KIND, "time": 1.0, "step": 42, "scalars": {}}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    config = _config([sys.executable, "-c", "pass"])
    assert run_entrypoint(config, DistEnv(restart_count=1), tmp_path, True) == 0
    start = RunHistory(tmp_path).events()[0]
    assert (start["event"], start.get("reported_step")) == ("start", 42), start
