"""``python -m jobs.localrun RUN_DIR``: run a recorded job on this machine without Slurm.

A detached supervisor (started by ``jobs submit --executor local``) runs each task's ranks as
``python -m train --config RESOLVED --run-dir DIR`` with torchrun-style variables (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT), at most
``max_parallel`` tasks at once, logs named like Slurm's (``slurm/JOB_RANK_log.out``), and keeps
``RUN_DIR/local_state.json`` with Slurm-style states so ``status``/``follow`` read it like sacct.

The same requeue contract as on Slurm (train's ``requeue:`` section and ``events.jsonl``):

- a rank that exits 75 (``REQUEUE_EXIT_CODE``: checkpointed, "run me again") restarts the
  task with resume (``TORCHELASTIC_RESTART_COUNT`` = the attempt, so train resumes from the
  newest valid checkpoint), while train's budget check allowed it;
- a failed rank (any other non-zero code but 2, bad input, and 3, budget spent) ends the task
  like ``srun --kill-on-bad-exit``, is recorded as a ``failure`` event (unless the rank did so)
  and is restarted while ``requeue.max_failures`` allows, else ``budget_exhausted``;
- SIGUSR2 to the supervisor is a requeue request: the spec's ``requeue.signal`` goes to every
  rank, they checkpoint, exit 75 and are restarted; SIGTERM cancels (forwarded, no restart).

The spec's ``environment`` is applied as the batch script applies it (one spec, one behaviour):
the same lines (:func:`jobs.render.setup_lines`: the variables, quoted, then the setup lines) run
once, in bash, before any rank starts, and every rank starts in what they left, as ``srun``
starts its tasks in the batch shell's: its exported variables, working directory and umask
(:func:`run_setup`). A setup that exits non-zero fails the run before any rank starts, like a
batch script that exits in its setup block.

No orphans: each rank gets ``PR_SET_PDEATHSIG`` (SIGTERM: it checkpoints and stops) so a
``kill -9`` of the supervisor stops it, and the supervisor records its own and every rank's
:class:`jobs.pids.ProcHandle` (PID + start time) so ``status`` and ``cancel`` can tell the
truth and never signal a process that merely reuses a PID.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

from jobs.pids import ProcHandle
from jobs.records import RunRecord, load_record
from train import runfiles
from train.env import SUBMISSION_ENV, DistEnv
from train.history import RunHistory, attempt_completed_at, over_budget
from train.safepath import python_module_argv
from train.schema import Schema, report

if TYPE_CHECKING:
    from train.spec import RequeueConfig

STATE_FILE = runfiles.LOCAL_STATE
STOP_FILE = runfiles.LOCAL_STOP  # "cancel": the ranks' stop is a cancel, not a preemption
REQUEUE_EXIT = 75  # train.stop.act.REQUEUE_EXIT_CODE
NO_RETRY_EXITS = {2, 3}  # bad input; a requeue budget is spent (train said so)
PEER_GRACE_S = 60.0  # after one rank exits 75, the others' time to exit on their own
KILL_WAIT_S = 30.0  # after a cancel's SIGTERM, the ranks' time to save and exit (Slurm's KillWait)
_PR_SET_PDEATHSIG = 1
SETUP_TIMEOUT_S = 600.0  # a setup block that never ends (a module system that hangs)


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1 (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# local_state.json (Supervisor.save writes it) and each of its tasks: their types (train.schema).
LOCAL_STATE = Schema(
    "local state",
    required={"tasks": "dict"},
    optional={"pid": "int", "supervisor": "dict", "job_id": "str"},
)
LOCAL_TASK = Schema(
    "local task",
    required={"state": "str"},
    optional={
        "exit_codes": "list[int]",
        "restarts": "count",
        "ranks": "list[dict]",
        "reason": "str",
    },
)


def read_state(run_dir: str | Path) -> dict[str, Any]:
    """``local_state.json`` through :data:`LOCAL_STATE` ({} when missing or damaged; a task
    entry that does not fit :data:`LOCAL_TASK` is left out). What does not fit is reported in
    one line (:func:`train.schema.report`)."""
    path = Path(run_dir) / STATE_FILE
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as exc:
        report(path, LOCAL_STATE.kind, [(0, f"not JSON ({type(exc).__name__})")])
        return {}
    why = LOCAL_STATE.problem(data)
    if why is not None:
        report(path, LOCAL_STATE.kind, [(0, why)])
        return {}
    tasks, unfit = {}, []
    for key, entry in data["tasks"].items():
        why = LOCAL_TASK.problem(entry)
        if why is None:
            tasks[key] = entry
        else:
            unfit.append((0, f"{key}: {why}"))
    if unfit:
        report(path, LOCAL_TASK.kind, unfit)
    return {**data, "tasks": tasks}


class SetupError(Exception):
    """The spec's setup block failed: ``str()`` is the one line to show."""


@dataclass(frozen=True)
class Setup:
    """What the batch script's setup block leaves for ``srun``'s tasks: the environment, the
    working directory and the umask."""

    env: dict[str, str]
    cwd: str
    umask: int


# Run after the setup lines by the interpreter jobs runs in (absolute: setup may change PATH).
_DUMP = (
    "import json, os, sys; m = os.umask(0); os.umask(m); "
    "json.dump({'env': dict(os.environ), 'cwd': os.getcwd(), 'umask': m}, "
    "open(sys.argv[1], 'w', encoding='utf-8'))"
)


def run_setup(run_dir: str | Path, environ: Mapping[str, str]) -> Setup:
    """Run the run's setup block (``RUN_DIR/resolved.yaml``'s ``environment``, rendered by
    :func:`jobs.render.setup_lines`, the batch script's own lines) once in bash, started from
    ``environ`` in this process's directory; return what it left. Its output goes to this
    process's (the supervisor's log). Raises :class:`SetupError`."""
    import tempfile

    from jobs.load import load_spec
    from jobs.render import setup_lines

    resolved = Path(run_dir) / "resolved.yaml"
    try:
        spec = load_spec(resolved).spec
    except Exception as exc:  # a damaged record: one line, no rank started on a guess
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SetupError(f"cannot read {resolved}: {first}") from None
    with tempfile.TemporaryDirectory(prefix="slurm-train-setup-") as tmp:
        out = Path(tmp) / "setup.json"
        script = "\n".join([
            *setup_lines(spec),
            f"exec {shlex.quote(sys.executable)} -c {shlex.quote(_DUMP)} {shlex.quote(str(out))}",
        ])  # fmt: skip
        try:
            proc = subprocess.run(
                ["bash", "-c", script],
                env=dict(environ),
                stdin=subprocess.DEVNULL,
                timeout=SETUP_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SetupError(
                f"environment.setup did not finish in {SETUP_TIMEOUT_S:.0f} s"
            ) from None
        except OSError as exc:
            raise SetupError(f"cannot run environment.setup in bash: {exc}") from None
        try:
            data = json.loads(out.read_text(encoding="utf-8"))
            setup = Setup(dict(data["env"]), str(data["cwd"]), int(data["umask"]))
        except (OSError, ValueError, KeyError, TypeError):
            raise SetupError(
                f"environment.setup exited {proc.returncode} before the ranks could start "
                "(its output is in slurm/supervisor.log)"
            ) from None
    return setup


def _die_with_parent(parent: int, umask: int | None = None) -> None:
    """In the child before exec: its own process group (the rank and its children are one
    group to stop), and SIGTERM when the supervisor dies (even by ``kill -9``); the setup
    block's umask."""
    os.setpgid(0, 0)
    if umask is not None:
        os.umask(umask)
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(1)


def _budgets(task_dir: str) -> RequeueConfig:
    """The task's requeue section (defaults when the resolved spec cannot be read)."""
    from train.spec import RequeueConfig, load_run_config

    try:
        return load_run_config(Path(task_dir) / runfiles.RESOLVED).requeue
    except Exception:
        return RequeueConfig()


class Supervisor:
    """Starts, watches, restarts and (on SIGTERM) stops the ranks of every task."""

    def __init__(self, record: RunRecord) -> None:
        self.record = record
        self.job_id = f"local-{os.getpid()}"
        self.cancelled = False
        self.cancelled_at = 0.0
        self.requeue_asked = False
        self.running: dict[int, list[subprocess.Popen[bytes]]] = {}
        self.grace: dict[int, float] = {}
        self.logs: list[IO[bytes]] = []
        self.budgets = {t.index: _budgets(t.run_dir) for t in record.tasks}
        #: what the spec's setup block left (run_setup), once before the first rank starts
        self.setup: Setup | None = None
        me = ProcHandle.of(os.getpid())
        self.state: dict[str, Any] = {
            "pid": os.getpid(),
            "supervisor": me.to_json() if me else None,
            "job_id": self.job_id,
            "tasks": {},
        }
        for t in record.tasks:
            self.state["tasks"][self.task_id(t.index)] = {
                "state": "PENDING",
                "exit_codes": [],
                "restarts": 0,
                "ranks": [],
            }

    def task_id(self, index: int) -> str:
        return self.job_id if self.record.array_size is None else f"{self.job_id}_{index}"

    def task_dir(self, index: int) -> str:
        return next(t.run_dir for t in self.record.tasks if t.index == index)

    def entry(self, index: int) -> dict[str, Any]:
        entry: dict[str, Any] = self.state["tasks"][self.task_id(index)]
        return entry

    def save(self) -> None:
        # read by other shells at any time: atomic, never through a link
        runfiles.atomic_write(
            Path(self.record.run_dir) / STATE_FILE, json.dumps(self.state, sort_keys=True)
        )

    # -- signals ---------------------------------------------------------------------------
    def _send(self, sig: int) -> None:
        for procs in self.running.values():
            for p in procs:
                if p.poll() is None:
                    p.send_signal(sig)

    def cancel(self, signum: int, frame: FrameType | None) -> None:
        self.cancelled = True
        self.cancelled_at = self.cancelled_at or time.monotonic()
        for t in self.record.tasks:
            with contextlib.suppress(OSError):
                runfiles.atomic_write(Path(t.run_dir) / STOP_FILE, "cancel\n", durable=False)
        self._send(signal.SIGTERM)

    def request_requeue(self, signum: int, frame: FrameType | None) -> None:
        self.requeue_asked = True
        for t in self.record.tasks:
            name = self.budgets[t.index].signal
            sig = getattr(signal, f"SIG{name}", signal.SIGUSR2)
            for p in self.running.get(t.index, []):
                if p.poll() is None:
                    p.send_signal(sig)

    # -- ranks -----------------------------------------------------------------------------
    def start(self, index: int) -> None:
        task_dir = self.task_dir(index)
        entry = self.entry(index)
        world = self.record.world_size
        port = free_port()
        procs = []
        parent = os.getpid()
        with contextlib.suppress(OSError):  # only a stop file of ours, never another's
            runfiles.remove(Path(task_dir) / STOP_FILE)
        setup = self.setup
        for rank in range(world):
            env = rank_environ(setup.env if setup is not None else os.environ)
            # The torchrun variables, written the one way train writes them (torch-free).
            DistEnv(
                rank=rank, local_rank=rank, world_size=world, local_world_size=world,
                master_port=port,
            ).export(env)  # fmt: skip
            env["SLURM_TRAIN_RUN_DIR"] = task_dir
            env["SLURM_TRAIN_LOCAL_SUPERVISOR"] = str(parent)  # train.stop.act: gone = no restart
            # train reads the attempt as torchrun's restart count: > 0 implies --resume.
            env["TORCHELASTIC_RESTART_COUNT"] = str(entry["restarts"])
            # the submission the events carry (no Slurm job id here): budgets per submission
            env[SUBMISSION_ENV] = self.task_id(index)
            path = self.record.log_file(self.task_id(index), rank)
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
            log = os.fdopen(runfiles.open_fd(path, flags), "ab")  # never through a link
            self.logs.append(log)
            cmd = python_module_argv("train", "--config", unbuffered=True)
            cmd += [str(Path(task_dir) / runfiles.RESOLVED), "--run-dir", task_dir]
            if entry["restarts"]:
                cmd.append("--resume")  # a restart continues this run's own checkpoints
            procs.append(
                subprocess.Popen(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=setup.cwd if setup is not None else None,
                    preexec_fn=functools.partial(
                        _die_with_parent, parent, setup.umask if setup is not None else None
                    ),
                )
            )
        self.running[index] = procs
        handles = [ProcHandle.of(p.pid) for p in procs]
        entry.update(state="RUNNING", ranks=[h.to_json() for h in handles if h], exit_codes=[])
        self.save()

    def _kill_groups(self, procs: list[subprocess.Popen[bytes]]) -> None:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)  # its own group (_die_with_parent)

    def reap(self) -> None:
        late = self.cancelled and time.monotonic() - self.cancelled_at > KILL_WAIT_S
        for index, procs in list(self.running.items()):
            if late:
                self._kill_groups(procs)  # a rank that ignores the cancel's SIGTERM
            codes = [p.poll() for p in procs]
            bad = [c for c in codes if c not in (None, 0, REQUEUE_EXIT)]
            if bad:
                # Like srun --kill-on-bad-exit: one failed rank ends the task.
                self._kill_groups(procs)
            elif REQUEUE_EXIT in codes and None in codes:
                deadline = self.grace.setdefault(index, time.monotonic() + PEER_GRACE_S)
                if time.monotonic() > deadline:
                    self._kill_groups(procs)
            if bad or all(c is not None for c in codes):
                done = [p.wait() for p in procs]
                del self.running[index]
                self.grace.pop(index, None)
                self.finish(index, done)

    def finish(self, index: int, codes: list[int]) -> None:
        """A task's ranks are all gone: record the outcome, or restart it (requeue contract)."""
        entry = self.entry(index)
        history = RunHistory(self.task_dir(index))
        attempt = int(entry["restarts"])
        entry.update(exit_codes=codes, end=time.time(), ranks=[])
        state, why = self._outcome(index, codes, history, attempt)
        if state == "REQUEUED":
            entry.update(state="REQUEUED", restarts=attempt + 1, reason=why)
            self.save()
            if not self.cancelled:
                self.start(index)
                return
            state, why = "CANCELLED", ""
        if state == "CANCELLED":
            events = history.events()
            if not events or events[-1].get("event") != "cancelled":
                step = next((e["step"] for e in reversed(events) if "step" in e), None)
                history.append("cancelled", step=step, restart_count=attempt, job_id=None,
                               submission=self.task_id(index))  # fmt: skip
        entry.update(state=state, reason=why)
        self.save()

    def _outcome(
        self, index: int, codes: list[int], history: RunHistory, attempt: int
    ) -> tuple[str, str]:
        if self.cancelled:
            return "CANCELLED", ""
        if all(c == 0 for c in codes):
            return "COMPLETED", ""
        if attempt_completed_at(history.events(), job_id=None, restart_count=attempt) is not None:
            # rank 0 recorded the run complete: a rank that exits non-zero after it (gloo's
            # abort at exit, a rank killed in teardown) does not undo it (train.history)
            return "COMPLETED", ""
        if any(c in NO_RETRY_EXITS for c in codes):
            return "FAILED", ""
        budgets = self.budgets[index]
        submission = self.task_id(index)
        if REQUEUE_EXIT in codes and all(c in (0, REQUEUE_EXIT) for c in codes):
            # train recorded the stop (preempted/timeout) and checked the budget already; a
            # program that exits 75 without recording anything is still bounded by the sum.
            over = over_budget(history.budget_counts(None, attempt, submission), budgets)
            total = budgets.max_preemptions + budgets.max_timeouts + budgets.max_failures
            if over is None and attempt >= total:
                over = f"restarted {attempt}x, the sum of the requeue budgets; not restarting"
            return ("FAILED", over) if over else ("REQUEUED", "requeued after a stop")
        failing = [(r, c) for r, c in enumerate(codes) if c not in (0, REQUEUE_EXIT, -9)]
        rank, code = failing[0] if failing else (0, codes[0])
        recorded = any(
            e.get("event") == "failure" and e.get("restart_count") == attempt
            for e in history.events()
        )
        base = {"step": None, "restart_count": attempt, "job_id": None, "submission": submission}
        if not recorded:
            # a rank died before it could record its failure: the launcher decides it, through
            # the same stop decision as every other path (train.stop)
            from train.stop import StopFacts, decide, record

            facts = StopFacts("local", restart_count=attempt)
            counts = history.budget_counts(None, attempt, submission)
            decision = decide("failure", facts, counts, budgets)
            record(decision, history, base, facts, error=f"rank {rank} exited {code}")
            if decision.exhausted:
                return "FAILED", decision.exhausted
        history.append("requeue", **base, via="local")
        return "REQUEUED", f"rank {rank} failed; requeued"

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.cancel)
        signal.signal(signal.SIGINT, self.cancel)
        signal.signal(signal.SIGUSR2, self.request_requeue)
        pending = [t.index for t in self.record.tasks]
        self.save()
        try:
            self.setup = run_setup(self.record.run_dir, rank_environ(os.environ))
        except SetupError as exc:
            print(f"jobs.localrun: {exc}", file=sys.stderr, flush=True)
            for index in pending:
                self.entry(index).update(state="FAILED", reason=str(exc), end=time.time())
            self.save()
            return 1
        while pending or self.running:
            while pending and len(self.running) < max(1, self.record.max_parallel):
                if self.cancelled:
                    break
                self.start(pending.pop(0))
            if self.cancelled and pending:
                for index in pending:
                    self.entry(index)["state"] = "CANCELLED"
                pending.clear()
                self.save()
            self.reap()
            time.sleep(0.2)
        for log in self.logs:
            log.close()
        states = [t["state"] for t in self.state["tasks"].values()]
        return 0 if all(s == "COMPLETED" for s in states) else 1


def rank_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a local rank: ours, less the variables of an enclosing Slurm job or
    step (started from a batch script or a salloc shell). A local run is never that job: its
    ranks must not take SLURM_JOB_ID for their own (a cancel would requeue the allocation)."""
    return {
        k: v
        for k, v in environ.items()
        if not k.startswith(("SLURM_", "SLURMD_", "SBATCH_", "SALLOC_", "SRUN_"))
        or k.startswith("SLURM_TRAIN_")
        or k == "SLURM_CONF"
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m jobs.localrun RUN_DIR", file=sys.stderr)
        return 2
    return Supervisor(load_record(args[0])).run()


if __name__ == "__main__":
    raise SystemExit(main())
