"""Start, check and stop the local cluster's daemons through pid files.

Each daemon we start carries the marker variable ``SLURM_TRAIN_LOCAL_CLUSTER=<state dir>`` in
its environment (inherited by slurmstepd), so ``down`` can prove that nothing of ours is left
behind without touching any other process on the machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.errors import LocalClusterError

MARKER_ENV = "SLURM_TRAIN_LOCAL_CLUSTER"


@dataclass(frozen=True)
class DaemonStatus:
    name: str
    pid: int | None
    alive: bool
    log: Path


def read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def read_text(path: Path, *, strip: bool = True) -> str | None:
    """A small state file's text (stripped), or None when it is missing or unreadable."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    return text.strip() if strip else text


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive for our purposes; reap it when it is our own child.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def pid_runs(pid: int | None, program: str) -> bool:
    """Alive and running ``program``: a stale pid file whose pid was reused does not count."""
    if not pid_alive(pid):
        return False
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return True
    return comm == program[:15]


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        data = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(data[-lines:]) if data else f"(empty log {path})"


def run_checked(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout: float = 60,
    input_text: str | None = None,
    what: str,
    log: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a set-up command; failure raises LocalClusterError naming ``what``."""
    try:
        proc = subprocess.run(
            list(cmd),
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input_text,
            check=False,
        )
    except FileNotFoundError as exc:
        raise LocalClusterError(f"{what}: {cmd[0]} not found ({exc})") from exc
    except subprocess.TimeoutExpired as exc:
        raise LocalClusterError(f"{what}: `{cmd[0]}` did not finish within {timeout:g}s") from exc
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()
        tail = f"\n--- {log} (last lines) ---\n{log_tail(log)}" if log else ""
        raise LocalClusterError(f"{what}: `{cmd[0]}` exited {proc.returncode}: {detail}{tail}")
    return proc


def run_ok(cmd: list[str], env: dict[str, str], input_text: str | None = None) -> str | None:
    """Stdout of a probe command, or None if it failed or is missing (used while waiting)."""
    try:
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=15, input=input_text,
            check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def spawn_detached(cmd: Sequence[str], *, env: Mapping[str, str], log: Path) -> int:
    """Start a process that does not daemonize itself, in its own session, output to ``log``."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(cmd),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc.pid


#: How long a pid file must name the same dead process before a start counts as failed.
DEAD_PID_S = 1.0


def wait_until(
    check: Callable[[], bool], *, timeout: float, what: str, log: Path, pid_file: Path | None = None
) -> None:
    """Poll ``check`` until true; on time-out raise naming the daemon with its log tail."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    how = f"did not become ready within {timeout:g}s"
    dead: tuple[int | None, float] | None = None  # a dead pid in the pid file, since when
    while time.monotonic() < deadline:
        if check():
            return
        if pid_file is not None and pid_file.exists():
            pid = read_pid(pid_file)
            if pid_alive(pid):
                dead = None
            elif dead is None or dead[0] != pid:
                dead = (pid, time.monotonic())
            elif time.monotonic() - dead[1] >= DEAD_PID_S:
                # the same dead pid for a while: not a daemonizing parent's, which the
                # daemon replaces with its own a moment later (26.05's slurmctld was seen so)
                how = "exited before it was ready"
                break
        time.sleep(delay)
        # Capped low: slurmctld answers a ping ~1 s after its start; a long sleep here is
        # most of a cold `up`.
        delay = min(delay * 1.5, 0.2)
    raise LocalClusterError(f"{what} {how}\n--- {log} (last lines) ---\n{log_tail(log)}")


def stop_pid(pid: int, *, timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL if it is still there after ``timeout``."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.1)


def marked_processes(state_dir: Path) -> list[int]:
    """Pids whose environment carries our marker for ``state_dir`` (excluding this process)."""
    needle = f"{MARKER_ENV}={state_dir}".encode()
    me = os.getpid()
    pids: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            pids.append(int(entry.name))
    return pids
