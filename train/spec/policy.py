"""The ``requeue`` and ``entrypoint`` sections of a job spec (torch-free).

    requeue:      RequeueConfig     signal, its lead time, requeue budgets, hang detection
    entrypoint:   EntrypointConfig  optional: run the user's function or command instead

:mod:`train.spec.config` composes them with ``train`` into :class:`train.spec.config.RunConfig` (and
re-exports them); ``SIGNALS`` are the signals a run can be warned with.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import PurePath
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from train.spec.base import StrictModel

__all__ = ["SIGNALS", "EntrypointConfig", "FailureRule", "RequeueConfig", "launches_torchrun"]


# The signals a run can be warned with (train.stop.signals handles them; the others kill or stop
# it).
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP")


class FailureRule(StrictModel):
    """One row of ``requeue.failure_rules``: a failure whose text matches is of that class."""

    match: Annotated[
        str,
        Field(description="regular expression searched in the failure's text (the error line, a "
              "command's exit and the last lines of its stderr)", min_length=1, max_length=500),
    ]  # fmt: skip
    cause: Annotated[
        Literal["user", "infra", "unknown"],
        Field(description="user: an error of the code or config, not retried; infra: the "
              "machines, retried in place first; unknown: retried within max_failures"),
    ]  # fmt: skip

    @field_validator("match")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression ({exc}); escape special characters "
                             "with a backslash") from None  # fmt: skip
        return value


class RequeueConfig(StrictModel):
    """How the job is warned before preemption / time limit, and how often it may come back."""

    signal: Annotated[
        str, Field(description="signal Slurm sends before the end (sbatch --signal=B:SIG@delay)")
    ] = "USR2"
    signal_delay_s: Annotated[
        int, Field(description="seconds before the end the signal is sent", ge=10, le=65535)
    ] = 90
    max_preemptions: Annotated[
        int,
        Field(description="requeues after preemption before giving up, per submission (a new "
              "jobs submit of the run directory starts afresh)", ge=0),
    ] = 20  # fmt: skip
    max_timeouts: Annotated[
        int,
        Field(description="requeues after hitting the time limit before giving up, per "
              "submission", ge=0),
    ] = 10  # fmt: skip
    max_failures: Annotated[
        int,
        Field(description="restarts after a failure of unknown cause (non-zero exit) before "
              "giving up, per submission", ge=0),
    ] = 3  # fmt: skip
    max_infra_failures: Annotated[
        int,
        Field(description="restarts after a failure of the infrastructure (collective time-out, "
              "connection reset between ranks, device fault, a rank killed from outside), per "
              "submission", ge=0),
    ] = 10  # fmt: skip
    max_user_failures: Annotated[
        int,
        Field(description="restarts after an error of the code or config (ImportError, "
              "SyntaxError, a bad config): 0, a retry fails the same way; per submission", ge=0),
    ] = 0  # fmt: skip
    max_restarts_in_place: Annotated[
        int,
        Field(description="restarts inside the allocation (a new step on the same nodes, no "
              "trip through the queue) after a failure or a hang, before requeueing; per "
              "allocation (each start of the job from the queue has its own)", ge=0),
    ] = 3  # fmt: skip
    max_restarts_without_progress: Annotated[
        int,
        Field(description="consecutive restarts after a failure or a hang that resumed from the "
              "same checkpoint step with no newer checkpoint since: then the run stops "
              "(budget_exhausted); per submission", ge=1),
    ] = 3  # fmt: skip
    failure_rules: Annotated[
        list[FailureRule],
        Field(description="your own rules sorting failures by cause, each line on its own: "
              "after the built-in evidence of the machines (a device, the node's driver, the "
              "environment missing on the node), before the built-in rest (train.stop.causes)"),
    ] = []  # fmt: skip  # noqa: RUF012
    mode: Annotated[
        Literal["auto", "requeue", "chain", "fastest"],
        Field(description="how a stopped run comes back: requeue (the same Slurm job, "
              "scontrol requeue), chain (a chain of jobs, each resuming from the last "
              "checkpoint: for sites where requeue is off or a preempted job is cancelled), "
              "auto (chain where jobs submit's preflight finds requeue does not work), "
              "fastest (auto, and chain also where a successor queued ahead is back sooner "
              "than a requeued job, which Slurm holds in BeginTime: the cluster's "
              "cred_expire or requeue_delay against its scheduling pass)"),
    ] = "auto"  # fmt: skip
    chain_depth: Annotated[
        int,
        Field(description="chain mode: links queued ahead of the running one, each starting "
              "only when the one before did not complete (afternotok)", ge=1, le=10),
    ] = 2  # fmt: skip
    chain_stall_links: Annotated[
        int,
        Field(description="chain mode: end the chain when this many links in a row ended "
              "without a new checkpoint", ge=1),
    ] = 3  # fmt: skip
    max_hangs: Annotated[
        int,
        Field(description="requeues after a hang (the hang watchdog) before giving up, per "
              "submission", ge=0),
    ] = 2  # fmt: skip
    hang_watchdog: Annotated[
        bool,
        Field(description="watch every rank's progress; a rank without a step for "
              "hang_timeout_s: dump stacks, record a hang, requeue (false: off)"),
    ] = True  # fmt: skip
    hang_timeout_s: Annotated[
        float | None,
        Field(description="seconds without a completed step that count as a hang; default: "
              "max(60, 20 x the mean step time, 3 x the longest pause seen)", ge=1),
    ] = None  # fmt: skip

    @field_validator("signal", mode="before")
    @classmethod
    def _signal_name(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        # ASCII only: str.upper() maps some non-ASCII letters to ASCII ones ("ſ" -> "S").
        name = value.strip()
        name = name.upper().removeprefix("SIG") if name.isascii() else name
        if name not in SIGNALS:
            raise ValueError(
                f"unknown or uncatchable signal {value!r}; use one of {', '.join(SIGNALS)}"
            )
        return name

    def budgets(self) -> dict[str, int]:
        """Each requeue budget by its field's name (the owner's table names a budget so:
        ``train.runfiles.BUDGETS``; tests/unit/train/test_history.py checks they agree)."""
        return {
            "max_preemptions": self.max_preemptions,
            "max_timeouts": self.max_timeouts,
            "max_failures": self.max_failures,
            "max_infra_failures": self.max_infra_failures,
            "max_user_failures": self.max_user_failures,
            "max_hangs": self.max_hangs,
        }


_FUNCTION_RE = re.compile(
    r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$", re.ASCII
)


_PYTHON = re.compile(r"python(3(\.\d+)?)?")
_MODULES = ("torch.distributed.run",)


def launches_torchrun(argv: Sequence[str]) -> int | None:
    """Where torchrun's own options start in ``argv`` when the command is torchrun
    (``torchrun ...``, a path ending in ``/torchrun``, ``python -m torch.distributed.run ...``),
    else None."""
    if not argv:
        return None
    first = PurePath(argv[0]).name
    if first == "torchrun":
        return 1
    if _PYTHON.fullmatch(first):
        rest = list(argv[1:])
        # python [-P] [-u] ... -m torch.distributed.run: interpreter flags before -m
        for i, arg in enumerate(rest):
            if arg == "-m":
                if i + 1 < len(rest) and rest[i + 1] in _MODULES:
                    return i + 3
                return None
            if arg.startswith("-m") and len(arg) > 2:
                return i + 2 if arg[2:] in _MODULES else None
            if not arg.startswith("-"):
                return None
    return None


class EntrypointConfig(StrictModel):
    """Run the user's own code instead of the built-in trainer (exactly one of the two)."""

    function: Annotated[
        str | None,
        Field(description='"pkg.module:function" called with a train.entry.TrainContext'),
    ] = None
    command: Annotated[
        list[str] | None,
        Field(
            description="argv exec'd (no shell) with RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/PORT "
            "and RUN_DIR exported; ${NAME} is replaced by that variable's value; a torchrun "
            "command (torchrun or python -m torch.distributed.run) runs once per node and is "
            "given --nnodes, --node-rank, --master-addr/--master-port, --nproc-per-node and "
            "--max-restarts=0 where not set"
        ),
    ] = None
    stop_signal: Annotated[
        str,
        Field(
            description="command only: the signal it saves on, sent once at a preemption or "
            "before the time limit: auto (the one its processes catch: USR1, else USR2, else "
            "TERM), none (stop it at once), or USR1/USR2/TERM/INT/HUP"
        ),
    ] = "auto"
    stop_grace_s: Annotated[
        int,
        Field(
            description="command only: seconds it has after that signal to save and exit "
            "before the job is requeued (at most requeue.signal_delay_s - 10)",
            ge=1,
            le=3600,
        ),
    ] = 30

    @field_validator("stop_signal", mode="before")
    @classmethod
    def _stop_signal_name(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        if value.strip().lower() in ("auto", "none"):
            return value.strip().lower()
        try:
            return RequeueConfig._signal_name(value)
        except ValueError as exc:
            raise ValueError(f"{exc}, or auto (detect it) or none (stop it at once)") from exc

    @property
    def torchrun(self) -> bool:
        """Whether the command is torchrun, which starts each node's processes itself
        (:mod:`train.command.launchers`): one task per node."""
        return self.command is not None and launches_torchrun(self.command) is not None

    @model_validator(mode="after")
    def _exactly_one(self) -> EntrypointConfig:
        if (self.function is None) == (self.command is None):
            raise ValueError(
                'entrypoint needs exactly one of `function: "pkg.mod:fn"` or `command: [argv...]`'
            )
        if self.function is not None and not _FUNCTION_RE.match(self.function):
            raise ValueError(
                f'entrypoint.function {self.function!r} is not of the form "pkg.module:function"'
            )
        if self.command is not None:
            if not self.command:
                raise ValueError("entrypoint.command is empty; give the program and its arguments")
            for arg in self.command:
                if "\x00" in arg or "\n" in arg:
                    raise ValueError(
                        "entrypoint.command arguments must not contain NUL or newlines"
                    )
        return self
