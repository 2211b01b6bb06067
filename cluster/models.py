"""Typed records the Slurm client returns. Plain frozen dataclasses: cheap, hashable, printable."""

from __future__ import annotations

from dataclasses import dataclass, field

# Slurm's base job states (sacct/squeue print them; sacct may add " by <uid>" to CANCELLED).
# PREEMPTED is final: a preempted job Slurm requeues goes straight back to PENDING in squeue (it
# stays PREEMPTED only when it may not be requeued); sacct shows the requeued job's old attempt
# as PREEMPTED (or NODE_FAIL) for a moment, so the client asks squeue about those two.
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "PREEMPTED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SUSPENDED",
        "COMPLETING",
        "CONFIGURING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
        "RESV_DEL_HOLD",
        # 25.11+: a --requeue=expedite job requeued after a node failure, on its way back at
        # once (recorded on 26.05: EXPEDITING, then RUNNING within seconds)
        "EXPEDITING",
    }
)


@dataclass(frozen=True)
class Partition:
    """One partition as ``scontrol show partition`` describes it."""

    name: str
    default: bool
    max_time_s: int | None  # None: UNLIMITED
    nodes: tuple[str, ...]
    state: str
    preempt_mode: str
    priority_tier: int
    total_cpus: int
    gres_per_node: dict[str, int] = field(default_factory=dict, hash=False)
    # seconds a preempted job has between Slurm's signal and its kill (GraceTime); None: unknown
    grace_time_s: int | None = None


#: ``scontrol show node`` state flags (after a ``+``) of a node that takes no new work.
_NO_WORK_FLAGS = ("DRAIN", "FAIL", "INVALID", "NOT_RESPONDING", "DOWN")


@dataclass(frozen=True)
class Node:
    """One node: name, state (``scontrol``'s whole ``IDLE+DRAIN``, or ``sinfo``'s ``draining``),
    CPUs and generic resources (e.g. ``{"gpu": 2}``)."""

    name: str
    state: str
    cpus: int
    gres: dict[str, int] = field(default_factory=dict, hash=False)
    partitions: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        """Whether the scheduler can place work on this node now or soon: its base state
        (``scontrol``'s ``IDLE+DRAIN``, ``sinfo``'s ``mixed-``) takes work and no flag says it
        takes none (draining, failing, an invalid registration)."""
        base, *flags = self.state.upper().split("+")
        if any(f.startswith(_NO_WORK_FLAGS) for f in flags):
            return False
        return base.rstrip("*~#!%$@^-") in {"IDLE", "MIXED", "ALLOCATED", "COMPLETING", "PLANNED"}

    @property
    def idle(self) -> bool:
        """Whether the node runs nothing and takes work (``IDLE``; not ``IDLE+DRAIN``, not a
        node that does not answer, ``idle*``, and not ``IDLE+COMPLETING``: a job that ended
        on it still has processes there, being ended, for up to its ``KillWait``)."""
        base, *flags = self.state.upper().split("+")
        return base == "IDLE" and "COMPLETING" not in flags and self.usable

    @property
    def down(self) -> bool:
        """Whether the node is gone for the jobs it runs: down or failed (``down*``, ``FAIL``,
        ``MIXED+FAIL``, ``DOWN+DRAIN``). A draining node still runs its jobs."""
        words = self.state.rstrip("*~#!%$@^-").upper().split("+")
        return any(w.startswith(("DOWN", "FAIL")) for w in words)


@dataclass(frozen=True)
class ClusterState:
    """Partitions and nodes as one ``sinfo`` call sees them (the preflight's one query)."""

    partitions: tuple[Partition, ...]
    nodes: tuple[Node, ...]


#: AuthInfo's cred_expire when slurm.conf does not set it (slurm.conf(5), 22.05 to 26.05).
CRED_EXPIRE_DEFAULT_S = 120


@dataclass(frozen=True)
class ClusterLimits:
    """Limits from ``scontrol show config`` that any user may read (Slurm's defaults here)."""

    max_array_size: int = 1001  # array indices run 0 .. MaxArraySize-1
    max_job_count: int = 10000  # jobs slurmctld holds at once
    # 25.11+: SlurmctldParameters=enable_expedited_requeue lets `sbatch --requeue=expedite`
    # restart a job requeued after a node failure at once, at top priority
    expedited_requeue: bool = False
    # 25.11+: SchedulerParameters=requeue_delay=N, seconds a requeued job waits (None: unset)
    requeue_delay_s: int | None = None
    # AuthInfo=cred_expire=N (None: unset, Slurm's 120 s): also how long a requeued job waits
    # before it may start again (slurm.conf(5)), where requeue_delay is not set
    cred_expire_s: int | None = None
    # SLURM_VERSION (``24.11.5``; "" when not printed): what the release does differently
    # (README's table), e.g. whether it requeues a preempted job itself (train.stop)
    slurm_version: str = ""
    # the longest a job whose dependency was just met waits for a scheduling pass: Slurm
    # triggers one at a job's end, and runs the backfill pass (bf_interval, default 30 s) and
    # the main one (sched_interval, default 60 s) at least that often
    successor_wait_s: int = 30

    @property
    def requeue_hold_s(self) -> int:
        """Seconds a requeued job is held before it may start again (slurm.conf(5)):
        ``requeue_delay`` (25.11+) where set, else ``cred_expire``, else Slurm's default 120;
        what an expedited requeue skips and a successor queued ahead (issue 46) avoids; 120-148 s
        seen on the local cluster (the hold plus a scheduling pass)."""
        if self.requeue_delay_s is not None:
            return self.requeue_delay_s
        return self.cred_expire_s if self.cred_expire_s is not None else CRED_EXPIRE_DEFAULT_S

    @property
    def max_array_tasks(self) -> int:
        """Tasks one array may hold (indices 0 .. MaxArraySize-1)."""
        return max(1, self.max_array_size)


@dataclass(frozen=True)
class JobInfo:
    """State of one job or array task (``job_id`` is ``"123"`` or ``"123_4"``)."""

    job_id: str
    state: str
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    nodelist: str = ""
    elapsed_s: int | None = None
    partition: str = ""
    name: str = ""
    source: str = "sacct"
    restarts: int | None = None  # Slurm's RestartCnt (squeue only; sacct has no such field)
    #: a pending job's expected start (squeue's StartTime; a BeginTime hold's end), epoch s
    start_at: float | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def array_job_id(self) -> str:
        return self.job_id.split("_", 1)[0]


@dataclass(frozen=True)
class JobAttempt:
    """One run of a job as Slurm's accounting saw it (``sacct -D``: a requeued job has one per
    start). Times are seconds since the epoch; None where Slurm has none yet (``Unknown``)."""

    job_id: str
    state: str
    submit: float | None
    eligible: float | None
    start: float | None
    end: float | None
    # this run's SLUID where the release prints one (24.11+; ``SLURM_JOB_SLUID`` in the job):
    # names the run whatever rows accounting has for the others; "" elsewhere
    sluid: str = ""
