"""The user's command as processes: what it runs as and with which environment, which signals
its processes catch and which one it gets on a stop (:func:`plan_stop`, pure), its stderr tail.

Linux only where it matters (``/proc``); elsewhere the detection finds nothing and the caller
falls back to what the spec says. Torch-free and side-effect free except :func:`signal_group`,
:func:`stop_group` and :class:`StderrTail`.

Why this exists: Slurm delivers a job step's signal (``--signal``, ``scancel --signal``, the
preemption warning) to EVERY process of the step, children of children included, whatever their
session or process group (checked on the local cluster with ``proctrack/linuxproc``; cgroup
tracking does the same). A command that does not handle the requeue signal would die of it, and
one that does would get it twice if we forwarded it too. So the command starts with the job's
signal ignored (an ignored disposition survives ``exec``; a program that installs its own
handler replaces it) and we send the signal it listens for ourselves, once.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from train.command import fastexit, selfrequeue
from train.env import DistEnv
from train.procfs import PROC, process_tree, session_is_ours, status, step_back, stepped_from
from train.runfiles import CHECKPOINTS

__all__ = [
    "StderrTail",
    "StopPlan",
    "caught_signals",
    "child_environ",
    "is_launcher",
    "parse_sigmask",
    "plan_stop",
    "resolve_argv",
    "signal_group",
    "signal_name",
    "signum_of",
    "step_back_for_command",
    "stop_group",
    "topmost",
    "wait_exit",
    "wchar",
]


def parse_sigmask(text: str) -> set[int]:
    """Signal numbers in a ``/proc/PID/status`` mask (``SigCgt: 0000000000004a02``)."""
    try:
        mask = int(text.strip(), 16)
    except ValueError:
        return set()
    return {n + 1 for n in range(64) if mask >> n & 1}


def caught_signals(pid: int, proc: Path = PROC) -> set[int]:
    """Signals process ``pid`` has a handler for (empty when it is gone or /proc is absent)."""
    return parse_sigmask(status(pid, proc).get("SigCgt", ""))


#: Launchers whose own writes are not training (torchrun's agent writes a few KB of rendezvous
#: keep-alive every 5 s, stuck workers or not): a script's name, or a module run with ``-m``.
LAUNCHER_SCRIPTS = frozenset({"torchrun"})
LAUNCHER_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch"})


def is_launcher(argv: Sequence[str]) -> bool:
    """Whether a process's command line is a known launcher agent (``torchrun ...``,
    ``python -m torch.distributed.run ...``; the interpreter and its flags may come first)."""
    head = list(argv[:6])
    for i, arg in enumerate(head):
        if os.path.basename(arg) in LAUNCHER_SCRIPTS:
            return True
        if arg == "-m" and i + 1 < len(argv):
            return argv[i + 1] in LAUNCHER_MODULES
        if not arg.startswith("-") and i > 0:
            return False  # the script or program the interpreter runs: not a launcher
    return False


def _argv(pid: int, proc: Path) -> list[str]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def written_bytes(root: int, proc: Path = PROC) -> int:
    """Bytes the training processes of ``root``'s tree have written so far (``wchar`` of
    ``/proc/PID/io``: output, files, pipes, and sockets written with write/writev, as gloo
    does); 0 where /proc does not say. A launcher agent's own writes do not count
    (:func:`is_launcher`): its workers' do. A command's progress: it only grows while the
    training does something."""
    return sum(
        wchar(pid, proc) for pid in process_tree(root, proc) if not is_launcher(_argv(pid, proc))
    )


def wchar(pid: int, proc: Path = PROC) -> int:
    """Bytes process ``pid`` alone has written so far (``wchar`` of ``/proc/PID/io``); 0 where
    it is gone or not ours to read."""
    try:
        text = (proc / str(pid) / "io").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("wchar:"):
            value = line.split(":", 1)[1].strip()
            return int(value) if value.isdigit() else 0
    return 0


def topmost(tree: Mapping[int, int], members: Iterable[int]) -> list[int]:
    """The members none of whose ancestors (within ``tree``) is a member: a launcher that
    catches a signal (torchrun) passes it on to its workers, so they must not get it twice."""
    chosen = set(members)
    out = []
    for pid in sorted(chosen):
        parent = tree.get(pid, 0)
        while parent and parent not in chosen:
            parent = tree.get(parent, 0)
        if not parent:
            out.append(pid)
    return out


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid`` (the command's own session); False when gone.

    Only ever called with the pgid of a child we started with ``start_new_session`` while it
    (or its group) still exists: the kernel does not reuse a pid as long as it names a group.
    """
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


#: Seconds a stopped command's group gets after TERM (and again after KILL) to exit.
TERM_WAIT_S = 5.0


def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    """``proc``'s exit code if it exits within ``timeout`` seconds, else None (still running)."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def stop_group(proc: subprocess.Popen[bytes], wait_s: float = TERM_WAIT_S) -> None:
    """Stop the command we started (its own session): TERM to its group, KILL if still there
    ``wait_s`` seconds later; nothing when it has already exited."""
    if proc.poll() is None:
        signal_group(proc.pid, signal.SIGTERM)
        if wait_exit(proc, wait_s) is None:
            signal_group(proc.pid, signal.SIGKILL)
            wait_exit(proc, wait_s)


def signal_name(sig: int) -> str:
    """``SIGUSR2`` for 12; the number as text when it has no name."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


_PYTHON = re.compile(r"python(3(\.\d+)?)?")
# auto: the signals a framework may checkpoint on, in the order we look for a handler
_AUTO_ORDER = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)


def signum_of(name: str) -> signal.Signals:
    """``signal.SIGUSR1`` for ``"USR1"``/``"SIGUSR1"``."""
    name = name.strip().upper()
    return signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]


def resolve_argv(argv: Sequence[str], executable: str = sys.executable) -> list[str]:
    """``python``/``python3`` -> ``executable``; another bare name that exists beside it
    (``torchrun``) -> that file; a path, or a name not found there, stays as written."""
    first = argv[0]
    if os.sep in first:
        return list(argv)
    if _PYTHON.fullmatch(first):
        return [executable, *argv[1:]]
    beside = Path(executable).parent / first
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside), *argv[1:]]
    return list(argv)


def shields(job_signal: int, stop_signal: str) -> bool:
    """Whether the command starts with the job's signal ignored (Slurm sends it to every
    process of the step): not for TERM, not when it is the command's stop signal, and not
    for USR1 under ``auto``, which Lightning listens for (it installs its handler only where
    the signal is not ignored) -- there the command gets Slurm's USR1 itself, once."""
    name = signal_name(job_signal).removeprefix("SIG")
    if job_signal == signal.SIGTERM or stop_signal == name:
        return False
    return not (stop_signal == "auto" and job_signal == signal.SIGUSR1)


def spawn(
    argv: Sequence[str], environ: Mapping[str, str], job_signal: int, stop_signal: str
) -> subprocess.Popen[bytes]:
    """Start the command (the user's own argv, no shell) in its own session (we stop all of
    it at once), its stderr piped (its tail), the job's signal ignored where :func:`shields`
    says so (only a signal disposition in the child, then exec). OSError when it cannot."""
    shield = shields(job_signal, stop_signal)

    prior = stepped_from()

    def before_exec() -> None:
        if prior is not None:  # started after we stepped back: the command's own priority
            with contextlib.suppress(OSError):  # where the kernel allows it (privileged)
                os.setpriority(os.PRIO_PROCESS, 0, prior)
        if shield:
            signal.signal(job_signal, signal.SIG_IGN)

    return subprocess.Popen(
        list(argv),
        env=dict(environ),
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=before_exec,
    )


def step_back_for_command() -> None:
    """The command has started: from now on this process (the supervisor: its set-up, the
    hang watcher it starts, its polls) gives the CPU to the command first
    (:func:`train.procfs.step_back`; the session's autogroup too where it holds only this
    task's processes). Once: a supervisor that took over a command started first finds it
    done. Never before the command is started: it would inherit it."""
    if stepped_from() is None:
        step_back(session=session_is_ours(os.getpid()))


def child_environ(
    base: Mapping[str, str],
    env: DistEnv,
    run_dir: Path,
    resume_from: Path | None,
    stop_signal: str,
    executable: str = sys.executable,
    checkpoint_world_size: int | None = None,
) -> dict[str, str]:
    """The command's environment: ours plus the documented variables (README, "Bring your own
    training code")."""
    child = dict(base)
    env.export(child)
    child["RUN_DIR"] = str(run_dir)
    # every restart of the job so far: Slurm's requeues and this allocation's restarts in place
    # (a command that resumes when it is > 0 must resume after a restart in place too)
    child["TRAIN_RESTART_COUNT"] = str(env.restart_count + env.in_place)
    child["TRAIN_CHECKPOINT_DIR"] = str(run_dir / CHECKPOINTS)
    child["TRAIN_STOP_SIGNAL"] = stop_signal
    child.pop("TRAIN_RESUME_FROM", None)
    child.pop("TRAIN_CHECKPOINT_WORLD_SIZE", None)
    if resume_from is not None:
        child["TRAIN_RESUME_FROM"] = str(resume_from)
        if checkpoint_world_size is not None:  # another size than WORLD_SIZE: reshard
            child["TRAIN_CHECKPOINT_WORLD_SIZE"] = str(checkpoint_world_size)
    # Lightning reads Trainer defaults from PL_TRAINER_*: its hpc_ckpt_N.ckpt (saved on the
    # requeue signal, restored on the next start) then lives in the run directory.
    child.setdefault("PL_TRAINER_DEFAULT_ROOT_DIR", str(run_dir))
    # Helpers the command runs by name (`python` in a wrapper script) come from our environment.
    bin_dir = str(Path(executable).parent)
    path = child.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        child["PATH"] = os.pathsep.join(filter(None, [bin_dir, path]))
    # its own `scontrol requeue` during a stop is its supervisor's (train.command.selfrequeue)
    child.pop(selfrequeue.STATE_ENV, None)
    child.pop(selfrequeue.SCONTROL_ENV, None)
    state = selfrequeue.state_path(run_dir, env)
    selfrequeue.export(child, state)
    # at a stop its interpreters skip the collector's last passes (train.command.fastexit)
    fastexit.export(child, selfrequeue.stopping_path(state))
    return child


@dataclass(frozen=True)
class StopPlan:
    """What to do with the command when a stop signal arrives.

    ``signal``/``targets``: send this signal to these pids (each once); ``by_slurm``: the command
    listens for the signal Slurm already delivered to it; ``terminate``: nothing listens, stop the
    command now; ``note`` says why (logged and recorded).
    """

    signal: int | None
    targets: tuple[int, ...]
    by_slurm: bool
    terminate: bool
    note: str


def plan_stop(
    trigger: int,
    job_signal: int,
    configured: str,
    root: int,
    under_slurm: bool,
    tree: Mapping[int, int] | None = None,
    caught: Callable[[int], set[int]] | None = None,
) -> StopPlan:
    """Which signal the command gets on ``trigger`` (pure: ``tree``/``caught`` describe it)."""
    tree = tree if tree is not None else {root: 0}
    caught = caught or (lambda pid: set())
    if trigger == signal.SIGTERM:
        # Slurm's TERM (grace time over, scancel, requeue) reaches every process of the step.
        if under_slurm:
            return StopPlan(None, (), True, False, "SIGTERM reached the command from Slurm")
        return StopPlan(signal.SIGTERM, (root,), False, False, "SIGTERM passed on")
    if configured == "none":
        return StopPlan(None, (), False, True, "stop_signal none: stopping the command")

    def catchers(sig: int) -> list[int]:
        return topmost(tree, [pid for pid in tree if sig in caught(pid)])

    if configured != "auto":
        sig = int(signum_of(configured))
        if sig == job_signal and under_slurm:
            return StopPlan(sig, (), True, False, f"{signal_name(sig)} delivered by Slurm")
        targets = catchers(sig) or [root]
        return StopPlan(sig, tuple(targets), False, False, f"stop_signal {signal_name(sig)}")
    if job_signal in {s for pid in tree for s in caught(pid)} and under_slurm:
        name = signal_name(job_signal)
        return StopPlan(job_signal, (), True, False, f"the command catches {name} (from Slurm)")
    for sig in _AUTO_ORDER:
        if sig == job_signal:
            continue
        targets = catchers(int(sig))
        if targets:
            return StopPlan(int(sig), tuple(targets), False, False, f"it catches {sig.name}")
    return StopPlan(None, (), False, True, "it catches no stop signal: stopping it")


class StderrTail:
    """Copies the child's stderr to ours as it comes and keeps its last lines (for the failure
    event: the real error, not the batch step's exit code). Progress bars (``\\r``) count as
    line ends, so a tqdm bar does not grow one endless line."""

    def __init__(self, source: IO[bytes], sink: IO[bytes] | None = None, keep: int = 20) -> None:
        self._source = source
        self._sink = sink if sink is not None else sys.stderr.buffer
        self._lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._partial = b""
        self.bytes = 0  # read so far: the command's progress (train.command.supervisor watches it)
        self._thread = threading.Thread(target=self._pump, name="command-stderr", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        fd = self._source.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.bytes += len(chunk)
            try:
                self._sink.write(chunk)
                self._sink.flush()
            except (OSError, ValueError):
                pass  # our own stderr is gone: keep the tail anyway
            self._keep(chunk)
        if self._partial.strip():
            self._lines.append(self._partial.decode("utf-8", "replace")[-300:])
        self._partial = b""

    def _keep(self, chunk: bytes) -> None:
        parts = (self._partial + chunk).replace(b"\r", b"\n").split(b"\n")
        self._partial = parts.pop()[-4096:]
        for part in parts:
            if part.strip():
                self._lines.append(part.decode("utf-8", "replace").rstrip()[-300:])

    def lines(self, wait_s: float = 2.0) -> list[str]:
        """The last lines, after the child's stderr closed (or ``wait_s`` passed)."""
        self._thread.join(wait_s)
        return list(self._lines)
