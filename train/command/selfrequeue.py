"""A command's own ``scontrol requeue`` of its job during a stop: its supervisor's to carry out.

Lightning's ``auto_requeue`` (and scripts written like it) run ``scontrol requeue
$SLURM_JOB_ID`` in their handler of the requeue signal. Under us the stop already has its one
decision and its one requeue (:mod:`train.stop`): the command's own requeue is at best a second
one Slurm refuses, and where Slurm requeues a preempted job itself (24.11 and later:
:data:`train.stop.facts.SELF_REQUEUE_RELEASE`) it ran the job a third time after it completed
(24.11.5 on the local cluster: the requeue asked for in the grace time ends the next run
``PREEMPTED`` and queues it again). So a command supervised under Slurm starts with our
``scontrol`` first on its ``PATH`` (``train/command/bin/scontrol``, POSIX sh): while its
supervisor is stopping (a marker written before the command gets its signal), the command's
``scontrol requeue JOB`` of its own job leaves a note for the supervisor and exits 0, as a
requeue that was taken; everything else, and everything outside a stop, is the real
``scontrol``'s (found on the command's ``PATH`` as it starts, run with its arguments as they
are).

The supervisor's decision then carries the requeue out once (ours, or Slurm's own), its
``requeue`` event saying ``asked_by: "command"``. Where the spec's budget allows no more
requeues, none happens: the spec is the run's policy (the log says the command asked).

The markers are node-local (never on the shared file system), one pair per rank, in a folder
made private to the user (:func:`train.runfiles.private_dir`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import MutableMapping
from pathlib import Path

from train.env import DistEnv
from train.runfiles import node_local_parts, private_dir

__all__ = [
    "SCONTROL_ENV",
    "SHIM_DIR",
    "STATE_ENV",
    "asked",
    "clear",
    "export",
    "mark_stopping",
    "state_path",
    "stopping_path",
]

#: The folder of our ``scontrol``, put first on a supervised command's ``PATH``.
SHIM_DIR = Path(__file__).resolve().parent / "bin"
#: The prefix of this rank's markers (``PREFIX.stopping``, ``PREFIX.asked``).
STATE_ENV = "SLURM_TRAIN_REQUEUE_STATE"
#: The real ``scontrol`` our ``scontrol`` runs for everything else.
SCONTROL_ENV = "SLURM_TRAIN_SCONTROL"


def state_path(run_dir: Path, env: DistEnv, root: Path | None = None) -> Path | None:
    """This rank's marker prefix for this attempt (node-local), or None outside a Slurm job."""
    if not env.job_id:
        return None
    top = root if root is not None else Path(tempfile.gettempdir())
    user, attempt = node_local_parts(run_dir, f"{env.job_id}-{env.attempt}".replace(os.sep, "_"))
    return top / user / f"{attempt}-requeue" / f"requeue-{env.rank}"


def export(child: MutableMapping[str, str], state: Path | None) -> None:
    """Put our ``scontrol`` first on the command's ``PATH`` (``child``, its environment) with
    where the real one is and this rank's markers; nothing when ``state`` is None (no Slurm
    job), when no ``scontrol`` is on that ``PATH`` (the command could run none either) or when
    our ``scontrol`` is not there to run (an install that lost its mode)."""
    shim = SHIM_DIR / "scontrol"
    if state is None or not os.access(shim, os.X_OK):
        return
    path = [p for p in child.get("PATH", "").split(os.pathsep) if p and not _is_shim_dir(p)]
    real = shutil.which("scontrol", path=os.pathsep.join(path))
    if real is None:
        return
    child[SCONTROL_ENV] = real
    child[STATE_ENV] = str(state)
    child["PATH"] = os.pathsep.join([str(SHIM_DIR), *path])


def _is_shim_dir(entry: str) -> bool:
    # as we put it there (no resolve: every command's start pays for this, before it runs)
    return os.path.normpath(entry) == str(SHIM_DIR)


def mark_stopping(state: Path | None) -> bool:
    """The supervisor is stopping: from now on the command's requeue of its job is ours. False
    when the marker cannot be written (the command's requeue then goes to Slurm, as without
    us)."""
    if state is None:
        return False
    try:
        top = state.parents[1]
        folder = private_dir(top.parent, top.name, state.parent.name)  # proven ours, no link
        fd = os.open(folder / f"{state.name}.stopping",  # stopping_path's name
                     os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)  # fmt: skip
    except OSError:
        return False
    os.close(fd)
    return True


def stopping_path(state: Path | None) -> Path | None:
    """The marker :func:`mark_stopping` writes for ``state`` (None: no Slurm job, no marker)."""
    return None if state is None else state.with_name(f"{state.name}.stopping")


def asked(state: Path | None) -> bool:
    """Whether the command asked for its requeue during this stop."""
    return state is not None and os.path.lexists(f"{state}.asked")


def clear(state: Path | None) -> None:
    """Remove this rank's markers (a new start of the command, the supervisor's end), and the
    attempt's folder once no rank's are left. Only names of ours, never through a link."""
    if state is None:
        return
    for suffix in (".stopping", ".asked"):
        with contextlib.suppress(OSError):
            os.unlink(f"{state}{suffix}")
    with contextlib.suppress(OSError):
        if not state.parent.is_symlink():
            state.parent.rmdir()  # only when empty
