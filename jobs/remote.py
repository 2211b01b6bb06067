"""``python -m jobs ... --remote HOST``: the same commands, for a cluster reached over SSH.

One code path: the login node runs the project's own command line (``python -m jobs submit``,
``status``, ``logs``, ``cancel``, ``drill``, ``plot``, ``list``), once per command, through ONE
ssh command each (:mod:`cluster.ssh`: the user's OpenSSH configuration, the shared connection
``jobs login HOST`` started, BatchMode). Nothing stays running on the login node: ``--follow``
and ``logs -f`` poll from here, each poll one ssh round trip that asks Slurm (through the
remote ``jobs status``) and reads the new bytes of the log together.

    laptop                                       login node (HOST)
    jobs submit SPEC --remote HOST
      spec checked here (the same one-line errors)
      rsync: the git-tracked files  ───────────▶ ~/slurm-train/code/NAME (or --remote-dir)
      one ssh: cd DIR; environment.setup;
               PY -m jobs submit SPEC --json ──▶ preflight + sbatch there; its run.json
      $SLURM_TRAIN_STATE_DIR/remote.jsonl ◀──── host, remote run dir, job id (this module)

Every remote command starts with the same checks, in the same round trip: the folder, the
spec's ``environment.setup`` (shell code by design, as in the batch script), the Python
(``--remote-python``) and slurm-train installed in it; each missing piece is one line here.
"""

from __future__ import annotations

import codecs
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from cluster import TERMINAL_STATES
from jobs.errors import InputError, JobsError, RunNotFoundError
from train.schema import Schema, check_lines

if TYPE_CHECKING:
    from cluster import SshTarget

#: the local record of runs submitted to other machines (one JSON line each)
REMOTE_INDEX = "remote.jsonl"
#: where the code goes on the remote host when no --remote-dir names it (relative: its home)
CODE_ROOT = "slurm-train/code"
DEFAULT_PYTHON = "python3"
#: seconds one remote command may take (a submit runs a preflight and sbatch there)
COMMAND_TIMEOUT_S = 120.0
#: the most bytes of a log one poll brings (a long log comes over in pieces, as jobs.follow reads)
LOG_PIECE = 1 << 20
_LOG_MARK = "\x1eslurm-train-log\x1e"
# the exit codes of the checks that open every remote command (_prelude)
_NO_DIR, _SETUP_FAILED, _NO_PYTHON, _NO_PACKAGE = 91, 92, 93, 94
INSTALL_HINT = (
    "install it there: PY -m pip install slurm-train (or, in a checkout of it, "
    "PY -m pip install -e .), or name a Python that has it with --remote-python"
)

REMOTE_ENTRY = Schema(
    "remote run",
    required={"host": "str", "run_dir": "str"},
    optional={
        "run_id": "str",
        "name": "str",
        "job_id": "str",
        "job_ids": "list[str]",
        "workdir": "str",
        "python": "str",
        "setup": "list[str]",
        "submitted_at": "time",
        "world_size": "count",
    },
)


_TARGETS: dict[str, SshTarget] = {}


@dataclass(frozen=True)
class Remote:
    """Where and how the remote command line runs: host, folder, environment, Python."""

    host: str
    workdir: str = ""  # "" : the remote home
    python: str = DEFAULT_PYTHON
    setup: tuple[str, ...] = ()

    def target(self) -> SshTarget:
        """``ssh -G HOST``, once per process (a --follow polls for days)."""
        from cluster import ssh_resolve as resolve

        if self.host not in _TARGETS:
            _TARGETS[self.host] = resolve(self.host)
        return _TARGETS[self.host]

    def shell(self, argv: Sequence[str], tail: str = "") -> str:
        """The remote shell line: the checks, then ``PY -m jobs ARGV`` (every word quoted),
        then ``tail`` (already quoted)."""
        py = shlex.quote(self.python)
        jobs = " ".join([py, "$P", "-m", "jobs", *(shlex.quote(a) for a in argv)])
        return f"{_prelude(self)}{jobs}{tail}"

    def run(
        self,
        argv: Sequence[str],
        *,
        tail: str = "",
        timeout: float | None = COMMAND_TIMEOUT_S,
        capture: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """ONE ssh command running the remote CLI; its checks' failures become one line."""
        return self.run_line(self.shell(argv, tail), timeout=timeout, capture=capture)

    def run_line(
        self, line: str, *, timeout: float | None = COMMAND_TIMEOUT_S, capture: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """ONE ssh command running the shell line ``line`` there (every word in it quoted)."""
        from cluster import SshConnectionError
        from cluster import ssh_classify as classify

        target = self.target()
        cmd = ["ssh", *target.option_args(), "--", self.host, line]
        try:
            raw = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if capture else None,
                stderr=subprocess.PIPE,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:  # a connection that hangs: retryable, as a drop
            raise SshConnectionError(self.host, f"no answer in {timeout} s") from None
        # stdout keeps every byte (a log's piece may end inside a character): surrogateescape
        done = subprocess.CompletedProcess(
            cmd,
            raw.returncode,
            (raw.stdout or b"").decode("utf-8", "surrogateescape"),
            (raw.stderr or b"").decode("utf-8", "replace"),
        )
        failed = classify(self.host, done.returncode, done.stderr or "")
        if failed is not None:
            raise failed
        self._check(done)
        return done

    def _check(self, done: subprocess.CompletedProcess[str]) -> None:
        where = self.workdir or "~"
        why = {
            _NO_DIR: f"no folder {where} there (the code goes there with `jobs submit "
            "--remote`; name where it is with --remote-dir)",
            _SETUP_FAILED: "environment.setup failed there: "
            + _last_line(done.stderr, "(no message)"),
            _NO_PYTHON: f"no Python {self.python!r} there (name one with --remote-python PATH, "
            "or make it with environment.setup)",
            _NO_PACKAGE: f"slurm-train is not installed for {self.python} there: "
            + INSTALL_HINT.replace("PY", self.python),
        }.get(done.returncode)
        if why is not None:
            raise JobsError(f"{self.host}: {why}")


#: prints -P where the remote Python has it (3.11+): imports only sys, safe in any folder
_SAFE_PATH_PROBE = 'import sys; print("-P" if sys.version_info >= (3, 11) else "")'


def setup_prelude(remote: Remote) -> str:
    """The folder and the spec's ``environment.setup`` every remote command opens with (exit
    91-92: see :meth:`Remote._check`); a Slurm command there too (:mod:`jobs.remotedrill`)."""
    parts = []
    if remote.workdir:
        parts.append(f"cd {_remote_path(remote.workdir)} 2>/dev/null || exit {_NO_DIR}; ")
    if remote.setup:  # the spec's own shell code (README: the one exception to quoting)
        body = "\n".join(remote.setup)
        parts.append(f"{{ {body}\n}} >&2 || exit {_SETUP_FAILED}; ")
    return "".join(parts)


def _prelude(remote: Remote) -> str:
    """The checks every remote command opens with (exit 91-94: see :meth:`Remote._check`)."""
    parts = [setup_prelude(remote)]
    py = shlex.quote(remote.python)
    parts.append(f"command -v {py} >/dev/null 2>&1 || exit {_NO_PYTHON}; ")
    # the user's code folder may hold a train.py or a jobs/ of theirs: our interpreter never takes
    # a package from it (-P, Python 3.11+; the same as train.safepath does here)
    parts.append(f"P=$({py} -c {shlex.quote(_SAFE_PATH_PROBE)}); ")
    parts.append(f"{py} $P -c 'import jobs.cli' >/dev/null 2>&1 || exit {_NO_PACKAGE}; ")
    return "".join(parts)


def _printable(text: str) -> str:
    """What :meth:`Remote.run` read, with bytes that are not UTF-8 shown as U+FFFD."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _remote_path(path: str) -> str:
    """``path`` quoted for the remote shell; a leading ``~/`` stays the remote home."""
    if path == "~":
        return "~"
    if path.startswith("~/"):
        return f"~/{shlex.quote(path[2:])}"
    return shlex.quote(path)


def _last_line(text: str | None, default: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else default


# -- the local record --------------------------------------------------------------------------
@dataclass(frozen=True)
class RemoteRun:
    """A run submitted to another machine, as this machine recorded it."""

    remote: Remote
    run_dir: str  # on the remote host
    run_id: str = ""
    name: str = ""
    job_id: str = ""
    job_ids: tuple[str, ...] = ()
    submitted_at: float = 0.0
    world_size: int = 1

    def entry(self) -> dict[str, Any]:
        return {
            "host": self.remote.host,
            "run_dir": self.run_dir,
            "run_id": self.run_id,
            "name": self.name,
            "job_id": self.job_id,
            "job_ids": list(self.job_ids),
            "workdir": self.remote.workdir,
            "python": self.remote.python,
            "setup": list(self.remote.setup),
            "submitted_at": self.submitted_at,
            "world_size": self.world_size,
        }

    @classmethod
    def from_entry(cls, e: dict[str, Any]) -> RemoteRun:
        remote = Remote(
            e["host"],
            e.get("workdir") or "",
            e.get("python") or DEFAULT_PYTHON,
            tuple(e.get("setup") or ()),
        )
        return cls(
            remote,
            e["run_dir"],
            e.get("run_id") or "",
            e.get("name") or "",
            e.get("job_id") or "",
            tuple(e.get("job_ids") or ()),
            float(e.get("submitted_at") or 0.0),
            int(e.get("world_size") or 1),
        )


def index_path() -> Path:
    from jobs.records import state_dir

    return state_dir() / REMOTE_INDEX


def record(run: RemoteRun) -> None:
    """One line in ``$SLURM_TRAIN_STATE_DIR/remote.jsonl``, beside the run index: in the state
    folder proven ours, appended by :func:`train.runfiles.append_line` (O_APPEND, no link, a
    torn last line not glued onto)."""
    from jobs.records import ensure_state_dir
    from train import runfiles

    line = json.dumps(run.entry(), sort_keys=True)
    runfiles.append_line(ensure_state_dir() / REMOTE_INDEX, line, durable=False)


def read_remote_index() -> list[RemoteRun]:
    """Recorded remote runs, oldest first; a damaged or foreign line is skipped (one line)."""
    try:
        data = index_path().read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return []
    runs, bad = [], 0
    for number, entry in check_lines(data.split(b"\n")):
        if entry is not None and REMOTE_ENTRY.problem(entry) is None:
            try:
                runs.append(RemoteRun.from_entry(entry))
                continue
            except (TypeError, ValueError):
                pass
        bad += bool(number)
    if bad:
        print(f"jobs: warning: {index_path()}: skipped {bad} damaged line(s)", file=sys.stderr)
    return runs


def find_remote(query: str | None, host: str | None = None) -> RemoteRun | None:
    """The newest recorded remote run named ``query`` (run id, job id, name, remote run dir)."""
    for run in reversed(read_remote_index()):
        if host is not None and run.remote.host != host:
            continue
        base = query.split("_", 1)[0] if query else None
        if query is None or query in (run.run_id, run.name, run.job_id, run.run_dir):
            return run
        if base and base == run.job_id:
            return run
    return None


def host_remote(host: str, python: str | None = None) -> Remote:
    """How to reach ``host``: as its newest recorded run did (folder, setup, Python)."""
    from cluster import ssh_check_host as check_host

    check_host(host)
    newest = next((r for r in reversed(read_remote_index()) if r.remote.host == host), None)
    base = newest.remote if newest is not None else Remote(host)
    return base if python is None else Remote(host, base.workdir, python, base.setup)


# -- submit ------------------------------------------------------------------------------------
@dataclass
class SubmitOptions:
    host: str
    spec: str
    overrides: list[str] = field(default_factory=list)
    remote_dir: str | None = None
    python: str | None = None
    no_preflight: bool = False
    continue_files: bool = False
    runs_dir: str | None = None


def submit(opts: SubmitOptions, out: IO[str]) -> tuple[int, RemoteRun | None]:
    """Check here, send the code, submit there (one ssh command), record here."""
    from cluster import ssh_check_host as check_host
    from jobs.load import load_spec

    check_host(opts.host)
    loaded = load_spec(opts.spec, opts.overrides)  # the same one-line errors as a local submit
    spec_path = Path(opts.spec).absolute()
    if opts.remote_dir is not None:
        workdir, remote_spec = opts.remote_dir, _send_spec(opts.host, spec_path, opts.remote_dir)
    else:
        workdir, remote_spec = push_code(opts.host, spec_path)
    remote = Remote(
        opts.host,
        workdir,
        opts.python or DEFAULT_PYTHON,
        tuple(loaded.spec.environment.setup),
    )
    argv = ["submit", remote_spec, "--json", "--executor", "slurm"]
    for item in opts.overrides:
        argv += ["--set", item]
    if opts.no_preflight:
        argv.append("--no-preflight")
    if opts.continue_files:
        argv.append("--continue-files")
    if opts.runs_dir:
        argv += ["--runs-dir", opts.runs_dir]
    done = remote.run(argv)
    sys.stderr.write(done.stderr)  # the remote side's one-line errors, notes
    if done.returncode != 0:
        return done.returncode, None
    try:
        data = json.loads(done.stdout.strip().splitlines()[-1])
        run = RemoteRun(
            remote,
            str(data["run_dir"]),
            str(data["run_id"]),
            loaded.spec.name,
            str(data["job_id"]),
            tuple(str(j) for j in data.get("job_ids") or [data["job_id"]]),
            time.time(),
            int(loaded.spec.world_size),
        )
    except (ValueError, KeyError, IndexError, TypeError):
        raise JobsError(
            f"{opts.host}: the remote submit answered something unexpected: "
            f"{_last_line(done.stdout, '(nothing)')}"
        ) from None
    record(run)
    out.write(f"{run.job_id}\n")
    out.flush()
    print(
        f"jobs: submitted {run.run_id} on {opts.host}; run dir {opts.host}:{run.run_dir}",
        file=sys.stderr,
    )
    return 0, run


def _rsync_ssh(host: str) -> str:
    """rsync's ``-e``: ssh with the same options (BatchMode, the shared connection)."""
    return shlex.join(["ssh", *Remote(host).target().option_args()])


def push_code(host: str, spec: Path) -> tuple[str, str]:
    """The git-tracked files of the working tree the spec is in (the current folder's where
    the spec is outside any) to ``~/slurm-train/code/NAME``; returns (folder, spec there)."""
    root = _git_root(spec.parent) or _git_root(Path.cwd())
    if root is None:
        raise InputError(
            "submit --remote: neither the spec's folder nor this one is in a git working tree: "
            "the code goes over as its git-tracked files (or name a remote folder where it "
            "already is with --remote-dir DIR)"
        )
    files = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout
    # a tracked file deleted in the working tree is not sent (rsync would fail on it)
    names = [n for n in files.split(b"\0") if n and os.path.lexists(root / os.fsdecode(n))]
    files = b"".join(n + b"\0" for n in names)
    workdir = f"{CODE_ROOT}/{root.name}"
    _rsync(host, root, files, workdir)
    try:
        rel = spec.relative_to(root)
    except ValueError:
        return workdir, _send_spec(host, spec, workdir)
    if str(rel).encode() not in files.split(b"\0"):  # an ignored spec: sent all the same
        _rsync(host, root, str(rel).encode() + b"\0", workdir)
    return workdir, str(rel)


def _send_spec(host: str, spec: Path, workdir: str) -> str:
    """A spec outside the sent tree goes to ``WORKDIR/.slurm-train/specs/``."""
    rel = f".slurm-train/specs/{spec.name}"
    _rsync(host, spec.parent, spec.name.encode() + b"\0", f"{workdir}/.slurm-train/specs")
    return rel


def _rsync(host: str, src: Path, files0: bytes, dest: str) -> None:
    cmd = [
        "rsync",
        "-rlt",
        "--mkpath",
        "--from0",
        "--files-from=-",
        "-e",
        _rsync_ssh(host),
        f"{src}/",
        f"{host}:{dest}/",
    ]
    try:
        done = subprocess.run(cmd, input=files0, capture_output=True, timeout=600)
    except FileNotFoundError:
        raise JobsError("rsync: not found on PATH (install rsync here)") from None
    except subprocess.TimeoutExpired:
        raise JobsError(f"{host}: rsync did not finish in 600 s") from None
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace")
        from cluster import ssh_classify as classify

        failed = (
            classify(host, 255, err)
            if "connection" in err.lower() or "permission denied" in err.lower()
            else None
        )
        if failed is not None:
            raise failed
        raise JobsError(f"{host}: rsync exited {done.returncode}: {_last_line(err, '')}")


def _git_root(folder: Path) -> Path | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None


# -- the other commands ------------------------------------------------------------------------
def passthrough(
    remote: Remote, argv: Sequence[str], out: IO[str], timeout: float = COMMAND_TIMEOUT_S
) -> int:
    """Run one remote command, then show what it printed (status, logs, cancel)."""
    done = remote.run(argv, timeout=timeout)
    out.write(_printable(done.stdout))
    out.flush()
    sys.stderr.write(done.stderr)
    return done.returncode


def plot(run: RemoteRun, output: Path | None, out: IO[str]) -> int:
    """Draw it there (its records, Slurm's times), fetch the PNG here."""
    remote_png = f"{run.run_dir}/plot.png"
    done = run.remote.run(["plot", run.run_dir, "-o", remote_png])
    sys.stderr.write(done.stderr)
    if done.returncode != 0:
        return done.returncode
    target = output or Path(f"{run.run_id or 'run'}-plot.png")
    target.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        "rsync",
        "-t",
        "-e",
        _rsync_ssh(run.remote.host),
        f"{run.remote.host}:{remote_png}",
        str(target),
    ]
    got = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if got.returncode != 0:
        raise JobsError(f"{run.remote.host}: fetching {remote_png}: {_last_line(got.stderr, '')}")
    out.write(f"{target}\n")
    return 0


def remote_states(runs: Sequence[RemoteRun]) -> dict[str, str]:
    """Per remote run dir: its state, ONE remote ``jobs list`` (one Slurm query) per host."""
    by_host: dict[str, list[RemoteRun]] = {}
    for r in runs:
        by_host.setdefault(r.remote.host, []).append(r)
    states: dict[str, str] = {}
    from cluster import ClusterError

    for host, group in by_host.items():
        try:
            done = group[-1].remote.run(["list", "--json", "-n", "1000"])
            entries = json.loads(done.stdout) if done.returncode == 0 else []
        except (ClusterError, JobsError, ValueError) as exc:
            print(f"jobs: no states from {host} ({str(exc).splitlines()[0]})", file=sys.stderr)
            continue
        for e in entries if isinstance(entries, list) else []:
            if isinstance(e, dict) and isinstance(e.get("state"), str):
                states[str(e.get("run_dir"))] = e["state"]
    return states


# -- following ---------------------------------------------------------------------------------
@dataclass
class Poll:
    """What one round trip answered: the run's tasks' states, the log's new bytes."""

    states: dict[str, str]
    log: bytes


def poll_once(run: RemoteRun, rank: int | None, offset: int, job_id: str) -> Poll:
    """ONE ssh command: the remote ``jobs status RUN --json`` (one Slurm query) and the bytes
    of rank ``rank``'s log from ``offset`` on."""
    tail = ""
    if rank is not None:
        log = f"{run.run_dir}/slurm/{job_id}_{rank}_log.out"
        tail = (
            f"; printf '\\n{_LOG_MARK}\\n'; "
            f"{{ tail -c +{offset + 1} {shlex.quote(log)} 2>/dev/null | head -c {LOG_PIECE}; }}"
            " || true"
        )
    done = run.remote.run(["status", run.run_dir, "--json", "--no-goodput"], tail=tail)
    text, _, log_text = done.stdout.partition(f"\n{_LOG_MARK}\n")
    try:
        data = json.loads(text)
    except ValueError:
        raise JobsError(
            f"{run.remote.host}: jobs status answered: {_last_line(done.stderr or text, '?')}"
        ) from None
    states = {
        str(t.get("job_id")): str(t.get("state"))
        for t in (data.get("tasks") or [] if isinstance(data, dict) else [])
        if isinstance(t, dict)
    }
    return Poll(states, log_text.encode("utf-8", errors="surrogateescape"))


# Slurm's terminal states (cluster's one list) less PREEMPTED: a preempted job is usually requeued,
# and the remote status that follows says so; the follow goes on until the run is over for good.
FINAL = TERMINAL_STATES - {"PREEMPTED"}


def follow(
    run: RemoteRun,
    out: IO[str],
    *,
    rank: int | None = None,
    show_states: bool = True,
    sleep: Callable[[float], None] = time.sleep,
    poll: Callable[[RemoteRun, int | None, int, str], Poll] = poll_once,
) -> int:
    """Until every task is over for good: 0 iff all COMPLETED. A dropped connection is tried
    again with back-off (one line each time); it never ends or changes the run."""
    from cluster import SshConnectionError
    from jobs.follow import RETRY_S, Outage, Poller

    poller, outage = Poller(), Outage()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a piece may split a char
    offset, last = 0, ""
    mid_line = False  # the log shown so far ends inside a line
    job_id = run.job_ids[0] if run.job_ids else run.job_id
    confirm = 0
    while True:
        wait = poller.next_at - poller.clock()
        if wait > 0:
            sleep(wait)
        try:
            got = poll(run, rank, offset, job_id)
        except SshConnectionError as exc:
            delay = outage.delay()
            if outage.tries == 1:  # one line per outage, however long it lasts
                print(
                    f"jobs: {exc}; trying again with back-off (up to {RETRY_S[-1]:.0f} s apart; "
                    "the run goes on)",
                    file=sys.stderr,
                )
            sleep(delay)
            continue
        if outage.over():
            print(f"jobs: {run.remote.host}: connected again", file=sys.stderr)
        changed = bool(got.log)
        if got.log:
            text = decoder.decode(got.log)
            out.write(text)
            offset += len(got.log)
            mid_line = (bool(text) and not text.endswith("\n")) or (mid_line and not text)
        now = " ".join(f"{j} {s}" for j, s in sorted(got.states.items()))
        if now != last:
            changed = True
            last = now
            if show_states:  # on a line of its own, also beside a log's unfinished line
                state = f"{time.strftime('%H:%M:%S')} {run.run_id}: {now or 'no state yet'}\n"
                out.write(("\n" if mid_line else "") + state)
                mid_line = False
        out.flush()
        if got.states and all(s in FINAL for s in got.states.values()):
            confirm += 1  # a final state seen twice (a requeue shows one for a moment)
            done = confirm >= 2 or all(s == "COMPLETED" for s in got.states.values())
            if done and len(got.log) < LOG_PIECE:  # and the log shown to its end
                return 0 if all(s == "COMPLETED" for s in got.states.values()) else 1
            poller.polled(changed)
            poller.soon()
            continue
        confirm = 0
        poller.polled(changed)
        if len(got.log) >= LOG_PIECE:
            poller.hurry()  # more of the log is there: the next piece at once


# -- the command line ---------------------------------------------------------------------------
def remote_run(args: Any) -> RemoteRun | None:
    """The remote run a command names: ``--remote HOST`` (the run named as the remote side
    knows it), or a run found in this machine's record of remote runs where no local run has
    that name. None: a local run."""
    query: str | None = getattr(args, "run", None)
    host: str | None = getattr(args, "remote", None)
    python: str | None = getattr(args, "remote_python", None)
    if host is not None:
        known = find_remote(query, host) if query else None
        if known is not None:
            return known if python is None else _with_python(known, python)
        return RemoteRun(host_remote(host, python), query or "")
    if not query or Path(query).is_dir():  # a run directory here is a local run
        return None
    from jobs.records import find_run

    try:
        find_run(query)
        return None
    except RunNotFoundError:
        known = find_remote(query)
        if known is None:
            raise
        return known if python is None else _with_python(known, python)


def _with_python(run: RemoteRun, python: str) -> RemoteRun:
    r = run.remote
    return RemoteRun(
        Remote(r.host, r.workdir, python, r.setup),
        run.run_dir,
        run.run_id,
        run.name,
        run.job_id,
        run.job_ids,
        run.submitted_at,
        run.world_size,
    )


def dispatch(args: Any, out: IO[str]) -> int | None:
    """``status``, ``logs``, ``cancel``, ``plot`` of a remote run; None: local. (``drill``:
    :mod:`jobs.remotedrill`, its loop here.)"""
    run = remote_run(args)
    if run is None:
        return None
    target = run.run_dir or (run.run_id if run.run_id else "")
    if args.command == "plot":
        return plot(run, args.output, out)
    if args.command == "logs" and args.follow:
        if not run.job_ids and not run.job_id:
            run = learn(run)
        return follow(run, out, rank=args.rank, show_states=False)
    argv: list[str] = [args.command, *([target] if target else [])]
    if args.command == "status" and args.json:
        argv.append("--json")
    if args.command == "logs":
        argv += ["--rank", str(args.rank)]
    return passthrough(run.remote, argv, out)


def learn(run: RemoteRun) -> RemoteRun:
    """A run named only by ``--remote``: its directory and job id from the remote status."""
    done = run.remote.run(["status", run.run_dir, "--json"])
    try:
        data = json.loads(done.stdout)
        return RemoteRun(
            run.remote,
            str(data["run_dir"]),
            str(data["run_id"]),
            str(data.get("name", "")),
            str(data["job_id"]),
            tuple(str(t["job_id"]) for t in data.get("tasks") or []),
        )
    except (ValueError, KeyError, TypeError):
        sys.stderr.write(done.stderr)
        raise RunNotFoundError(f"{run.remote.host}: no run {run.run_dir!r} there") from None


def login(host: str, out: IO[str]) -> int:
    """``jobs login HOST``: the one interactive connection; later commands share it."""
    from cluster import ssh_login
    from cluster import ssh_master_running as master_running
    from cluster import ssh_resolve as resolve

    target = resolve(host)
    code = ssh_login(target)
    if code != 0:
        raise JobsError(f"ssh {host}: login failed (ssh exited {code})")
    if master_running(target):
        out.write(
            f"jobs: logged in to {host}: later commands share this connection "
            f"(it ends after {_persist(target)} unused, or with `ssh -O exit {host}`)\n"
        )
    else:
        out.write(
            f"jobs: {host} answers; it is reached through a ProxyJump or without "
            "multiplexing, so each command connects afresh (with your key or agent)\n"
        )
    return 0


def _persist(target: SshTarget) -> str:
    from cluster import SSH_CONTROL_PERSIST as CONTROL_PERSIST

    own = target.options.get("controlpersist", "no")
    return CONTROL_PERSIST if "controlpath" not in target.options or own == "no" else own
