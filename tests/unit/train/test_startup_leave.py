"""The end of a task's process after a stop of the built-in trainer (train.startup, issue 46):
what Python's exit does that anything relies on, in its order, and not the teardown of the
modules; nothing of it where user code ran in the process or the run ended well."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

# A process as the task's: a non-daemon thread still writing, an atexit function, a buffered
# line on stdout (a pipe), and an object that only the teardown of its module frees.
_TASK = """
import atexit, sys, threading, time
from pathlib import Path
out = Path(sys.argv[1])
class Freed:
    def __del__(self):
        (out / "freed").write_text("teardown ran")
KEPT = Freed()  # a module global: freed at the teardown only
def late():
    time.sleep(0.3)
    (out / "thread").write_text("joined")
threading.Thread(target=late).start()
atexit.register(lambda: (out / "atexit").write_text("ran"))
sys.stdout.write("buffered line\\n")  # not flushed: a pipe buffers it
from train.startup import leave, ours_only
if sys.argv[2] == "ours":
    ours_only()
{ending}
"""


def _run(tmp_path: Path, mark: str, ending: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "task.py"
    script.write_text(_TASK.format(ending=ending))
    return subprocess.run(
        [sys.executable, "-P", str(script), str(tmp_path), mark],
        cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_stop_of_our_trainer_ends_without_the_teardown(tmp_path: Path) -> None:
    done = _run(tmp_path, "ours", "leave(75)\nraise SystemExit(1)  # never reached")
    assert done.returncode == 75
    assert done.stdout == "buffered line\n"
    assert (tmp_path / "thread").read_text() == "joined"  # joined before the end
    assert (tmp_path / "atexit").read_text() == "ran"
    assert not (tmp_path / "freed").exists()  # the teardown skipped


@pytest.mark.parametrize(
    ("mark", "code"),
    [("user", 3), ("ours", 0)],  # user code ran in the process; the run ended well
)
def test_python_ends_the_process_as_it_does_otherwise(tmp_path: Path, mark: str, code: int) -> None:
    done = _run(tmp_path, mark, f"leave({code})\nraise SystemExit({code})")
    assert done.returncode == code
    assert done.stdout == "buffered line\n"
    assert (tmp_path / "thread").read_text() == "joined"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "freed").read_text() == "teardown ran"


def test_the_task_entry_ends_a_stop_of_our_trainer_without_the_teardown(tmp_path: Path) -> None:
    """``python -m jobs.taskstart -- -m MODULE``: the module's ``SystemExit`` at a stop (as
    TrainLaunch raises it inside submitit's) ends the task through ``leave``."""
    pkg = tmp_path / "mods"
    pkg.mkdir()
    (pkg / "stopping.py").write_text(_TASK.format(ending="raise SystemExit(75)"))
    done = subprocess.run(
        [sys.executable, "-P", "-m", "jobs.taskstart", "--task", "", "--", "-m", "stopping",
         str(tmp_path), "ours"],
        cwd=REPO, env={"PYTHONPATH": f"{REPO}:{pkg}", "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 75, done.stderr[-2000:]
    assert (tmp_path / "atexit").read_text() == "ran"
    assert not (tmp_path / "freed").exists()


def test_an_executors_idle_worker_does_not_hold_the_end(tmp_path: Path) -> None:
    """A thread pool never shut down (its idle worker, non-daemon, waits for work): Python's
    exit tells it to end before it joins it, and so does the end after a stop."""
    ending = (
        "from concurrent.futures import ThreadPoolExecutor\n"
        "pool = ThreadPoolExecutor(1)\n"
        "pool.submit(lambda: None).result()\n"
        "leave(75)"
    )
    done = _run(tmp_path, "ours", ending)
    assert done.returncode == 75
    assert (tmp_path / "atexit").read_text() == "ran"
    assert not (tmp_path / "freed").exists()
