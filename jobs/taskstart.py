"""The task's first instructions (issue 46): the user's command starts before submitit loads.

Every job's srun line is submitit's command after our prefix (:func:`jobs.executor.task_python`)::

    python -P -u -m jobs.taskstart --task "${SLURM_ARRAY_JOB_ID:+...}" -- \
        -u -m submitit.core._submit FOLDER

Before, the task's interpreter imported submitit (numpy, asyncio, cloudpickle: ~0.15 s of an
idle core, more on a busy node), unpickled :class:`jobs.launch.TrainLaunch` and only then
started a command that could start first. Now, where ``jobs submit`` wrote the task's
first-start note beside its pickle (``FOLDER/TASK_first.json``: the command as
:func:`jobs.launch.command_first` allows it, the run directory, the signals), this module starts
the command at once (:func:`train.command.prestart.start_first`, after the early-signal store
holds the stop signals: stdlib and train's torch-free modules only), sleeps behind its start
(:func:`train.command.prestart.wait_behind`), then runs submitit's module in this same
interpreter (``runpy``, as ``python -m`` would). ``TrainLaunch`` finds the command already
started (the same argv), does not wait a second time, and goes on as before: the supervisor
takes the command over. Without a note (another entrypoint, a command that cannot start
first, an older submission), or with one that is damaged, foreign or not this run's, nothing
starts here: submitit's module runs as it always did and ``TrainLaunch`` decides.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["FIRST_NOTE_MAX_BYTES", "first_note", "main", "read_first_note"]

#: A note larger than this is not one of ours (a command line is a few hundred bytes).
FIRST_NOTE_MAX_BYTES = 1 << 16


def first_note(folder: Path, task: str) -> Path:
    """Where task ``task``'s first-start note lives (``JOBID`` or ``ARRAYID_INDEX``, as its
    pickle: :func:`jobs.render.submitted_pickle`)."""
    return folder / f"{task}_first.json"


def read_first_note(path: Path) -> dict[str, object] | None:
    """The note at ``path`` when it is a whole one of this run (``run_dir`` is the folder's
    parent); None when it is missing, a link, too big, damaged or another run's."""
    try:
        if path.is_symlink() or path.stat().st_size > FIRST_NOTE_MAX_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    command, run_dir = data.get("command"), data.get("run_dir")
    signals = (data.get("signal"), data.get("stop_signal"))
    if not (isinstance(command, list) and command and all(isinstance(a, str) for a in command)):
        return None
    if not isinstance(run_dir, str) or not all(isinstance(s, str) and s for s in signals):
        return None
    if Path(run_dir) != path.parent.parent:  # RUN_DIR/slurm/TASK_first.json
        return None
    return data


def _start_first(folder: Path, task: str) -> None:
    note = read_first_note(first_note(folder, task))
    if note is None:
        return
    from train.command import start_first, wait_behind  # torch-free, pydantic-free
    from train.stop import install_early

    signal_name, stop_signal = str(note["signal"]), str(note["stop_signal"])
    install_early(("USR2", "TERM", signal_name))  # as TrainLaunch: held, never lost
    command = note["command"]
    assert isinstance(command, list)
    started = start_first(command, Path(str(note["run_dir"])), signal_name, stop_signal)
    if started is not None:
        # submitit's import and the unpickling wait behind the command's start too (a held
        # stop signal or its exit ends the wait at once); TrainLaunch does not wait again
        wait_behind(started)


def main(argv: Sequence[str] | None = None) -> None:
    """``--task TASK -- [-u] -m MODULE ARGS...``: start the task's command first where its note
    says so, then run ``MODULE`` as ``python -m`` would (its exit is the task's)."""
    args = list(sys.argv[1:] if argv is None else argv)
    task = ""
    if len(args) >= 2 and args[0] == "--task":
        task, args = args[1], args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    while args[:1] == ["-u"]:  # the interpreter already runs unbuffered (our prefix's -u)
        args = args[1:]
    if len(args) < 2 or args[0] != "-m":
        sys.exit("jobs.taskstart: usage: --task TASK -- [-u] -m MODULE ARGS...")
    module, module_args = args[1], args[2:]
    if module_args:
        if not task:
            from train.env import DistEnv  # the one reader of SLURM_*

            task = DistEnv.from_env(dict(os.environ)).job_id or ""
        if task:
            _start_first(Path(module_args[0]), task)
    sys.argv = [module, *module_args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as ended:  # the task's exit code (TrainLaunch raises it at a stop)
        if isinstance(ended.code, int) and ended.code != 0:
            from train.startup import leave

            leave(ended.code)  # only where nothing but our trainer ran: not the teardown
        raise


if __name__ == "__main__":
    main()
