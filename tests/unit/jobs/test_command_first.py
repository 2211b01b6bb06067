"""Issue 46: the user's command starts first, before the spec models and the run session are
imported and set up (jobs.launch.TrainLaunch + train.command.prestart), and only where the
resume decision is known without them; its supervisor takes it over, never a second start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.launch import command_first
from train.command.prestart import can_prestart
from train.procfs import STEP_BACK_NICE

REPO = Path(__file__).resolve().parents[3]

# Runs TrainLaunch in a fresh interpreter (as submitit's runtime would, no Slurm around) and
# reports, for every process started, whether the spec models (pydantic) or train's CLI were
# imported by then; last, whether a command started first is still running.
_DRIVER = r"""
import json, os, subprocess, sys
nice0 = os.getpriority(os.PRIO_PROCESS, 0)
setup = []  # the nice when the spec models are first imported: the run's set-up
mark = os.environ.get("MARK")  # whether this file exists then (what the command did by then)
marked = []
def audit(event, args):
    if event == "import" and args[0] == "pydantic" and not setup:
        setup.append(os.getpriority(os.PRIO_PROCESS, 0))
        marked.append(bool(mark) and os.path.exists(mark))
sys.addaudithook(audit)
seen = []
_Popen = subprocess.Popen
class Popen(_Popen):
    def __init__(self, args, *a, **k):
        seen.append({"argv": list(args), "pydantic": "pydantic" in sys.modules,
                     "train.cli": "train.cli" in sys.modules})
        super().__init__(args, *a, **k)
subprocess.Popen = Popen
from jobs.launch import TrainLaunch
config, run_dir, command = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
code = 0
try:
    TrainLaunch(config, run_dir, command=tuple(command))()
except SystemExit as exc:
    code = exc.code
from train.command import prestart
alive = [s.proc.poll() is None for s in prestart._STARTED]
nice = os.getpriority(os.PRIO_PROCESS, 0)
print(json.dumps({"code": code, "seen": seen, "alive": alive, "nice0": nice0, "nice": nice,
                  "setup": setup, "marked": marked}))
"""


def _spec(tmp_path: Path, command: list[str]) -> Path:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: t\n"
        "resources: {partition: debug, nodes: 1, ntasks_per_node: 1, time: '00:10:00'}\n"
        f"entrypoint: {{command: {json.dumps(command)}}}\n"
    )
    return spec


def _launch(
    tmp_path: Path, config: Path, run_dir: Path, command: list[str], **extra: str
) -> dict[str, object]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path), **extra}
    out = subprocess.run(
        [sys.executable, "-P", "-c", _DRIVER, str(config), str(run_dir), json.dumps(command)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_the_command_starts_before_the_spec_is_read_again(tmp_path: Path) -> None:
    done = tmp_path / "done"
    command = ["python", "-c", f"open({str(done)!r}, 'w').write('ran')"]
    run_dir = tmp_path / "run"
    result = _launch(tmp_path, _spec(tmp_path, command), run_dir, command)
    assert result["code"] == 0
    seen = result["seen"]
    assert isinstance(seen, list)
    assert len(seen) == 1  # started once: the supervisor took it over, no second start
    assert seen[0]["argv"][1:] == command[1:]
    assert seen[0]["pydantic"] is False and seen[0]["train.cli"] is False
    assert done.read_text() == "ran"
    events = [json.loads(ln)["event"] for ln in (run_dir / "events.jsonl").read_text().split("\n")
              if ln]  # fmt: skip
    assert events == ["start", "complete"]  # the records as for a command it started itself


def test_checkpoints_of_ours_keep_the_decision_before_the_start(tmp_path: Path) -> None:
    # A fresh run in a directory that holds checkpoints of an earlier run is refused: a
    # command started first would have trained on it before the refusal.
    done = tmp_path / "done"
    command = ["python", "-c", f"open({str(done)!r}, 'w').write('ran')"]
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step-5").mkdir(parents=True)
    result = _launch(tmp_path, _spec(tmp_path, command), run_dir, command)
    assert result["code"] == 2
    assert result["seen"] == [] and result["alive"] == []
    assert not done.exists()


def test_a_run_that_does_not_start_stops_the_command_started_first(tmp_path: Path) -> None:
    command = ["python", "-c", "import time; time.sleep(120)"]
    result = _launch(tmp_path, tmp_path / "missing.yaml", tmp_path / "run", command)
    assert result["code"] == 2  # the spec is gone: one line, exit 2
    assert result["alive"] == [False]  # never left training unsupervised


@pytest.mark.parametrize(
    ("command", "first"),
    [
        (["python", "train.py", "--lr", "0.1"], True),
        (["python", "train.py", "--out", "${RUN_DIR}/x"], False),  # the allocation tells
        (["torchrun", "--nproc-per-node", "2", "train.py"], False),  # told the nodes
        (["python", "-m", "torch.distributed.run", "train.py"], False),
    ],
)
def test_which_commands_start_first(command: list[str], first: bool) -> None:
    assert command_first(command) == (tuple(command) if first else ())


def test_only_a_run_directory_without_checkpoints_of_ours(tmp_path: Path) -> None:
    assert can_prestart(tmp_path / "run")  # not made yet
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    assert can_prestart(tmp_path / "run")
    (tmp_path / "run" / "checkpoints" / ".step-3.tmp").mkdir()  # an interrupted save
    assert not can_prestart(tmp_path / "run")


_NICE = "import os, sys; open(sys.argv[1], 'w').write(str(os.getpriority(os.PRIO_PROCESS, 0)))"


@pytest.mark.parametrize(("first", "out"), [(True, "nice.txt"), (False, "${RUN_DIR}/../nice.txt")])
def test_the_task_steps_back_for_the_command_once_it_started(
    tmp_path: Path, first: bool, out: str
) -> None:
    # Issue 46: the command runs at the task's own priority; the task (the supervisor: its
    # set-up after a command started first, its polls, the watcher it starts) steps back after
    # the command's start, whether it was started first or by the supervisor.
    command = ["python", "-c", _NICE, str(tmp_path / out) if first else out]
    assert bool(command_first(command)) is first
    # what jobs submit pickles: the command where it starts first, else none
    started_first = list(command_first(command))
    result = _launch(tmp_path, _spec(tmp_path, command), tmp_path / "run", started_first)
    assert result["code"] == 0
    nice0 = result["nice0"]
    assert isinstance(nice0, int)
    assert int((tmp_path / "nice.txt").read_text()) == nice0  # never inherited
    assert result["nice"] == max(nice0, STEP_BACK_NICE)
    # the set-up of a command started first waits for the CPU the command leaves; the
    # supervisor that starts the command itself has set up before it
    assert result["setup"] == [max(nice0, STEP_BACK_NICE) if first else nice0]


# A command whose start keeps its core busy (a loop of pure Python, as an import is), then says
# so in a file and trains quietly (sleeps), then exits.
_BUSY_THEN_QUIET = (
    "import sys, time; sum(i * i for i in range(3_000_000)); "
    "open(sys.argv[1], 'w').write('started'); time.sleep(2)"
)


def test_the_set_up_waits_behind_the_commands_own_start(tmp_path: Path) -> None:
    # Issue 46: after the command started first, our set-up (the spec models, the session)
    # begins only once the command's start is over: here, once its busy part is done
    started = tmp_path / "started"
    command = ["python", "-c", _BUSY_THEN_QUIET, str(started)]
    run_dir = tmp_path / "run"
    result = _launch(tmp_path, _spec(tmp_path, command), run_dir, command, MARK=str(started))
    assert result["code"] == 0 and result["marked"] == [True]
    (start,) = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()
                if json.loads(ln)["event"] == "start"]  # fmt: skip
    # the wait is its own phase of the start's record, before the supervisor's
    phases = list(start["startup"])
    assert phases.index("behind_command") < phases.index("main")
