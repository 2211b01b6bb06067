"""The facts of a stop, gathered once: :class:`StopFacts` from :func:`gather` (torch-free).

Under Slurm one ``scontrol show job`` per stop answers everything the decision needs (why Slurm
stops the job, whether it failed nodes under it); the node states are asked only when Slurm
already requeued the job (a NODE_FAIL candidate). :func:`classify_from_job_info` is pure
(tested on recorded fields); :func:`classify_stop` asks Slurm through :mod:`cluster.client`
(imported lazily: ``train`` does not need ``cluster`` to import) and answers ``"signal"`` when
Slurm cannot be asked.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from cluster import JobQueries, Node, Partition

from train.report import last_reported_step
from train.runfiles import LOCAL_STOP

__all__ = [
    "LOCAL_SUPERVISOR_ENV",
    "AskedOnce",
    "StopFacts",
    "StopKind",
    "classify_from_job_info",
    "classify_stop",
    "end_time",
    "failure_cause",
    "gather",
    "newest_checkpoint_step",
    "node_failure",
    "preemption_grace_s",
    "progress_step",
    "requeues_preempted",
]

StopKind = Literal["preemption", "timeout", "cancel", "signal", "failure", "node_fail"]
Executor = Literal["slurm", "local", "none"]

#: Set by the local executor (jobs.localrun) for its ranks: the launcher's pid.
LOCAL_SUPERVISOR_ENV = "SLURM_TRAIN_LOCAL_SUPERVISOR"

log = logging.getLogger(__name__)

_UNSET = {"", "none", "unknown", "n/a", "(null)"}

#: The first release recorded to requeue a preempted job that exits in its grace time by itself
#: (README's table: 22.05 ends it COMPLETED; 24.11 and 26.05 requeue it, and 24.11.5 requeues a
#: job that also requeued itself twice).
SELF_REQUEUE_RELEASE = (24, 11)


def requeues_preempted(release: str | None) -> bool:
    """Whether Slurm ``release`` (``24.11.5``) requeues a preempted job itself. An unknown or
    unreadable release: no (the stop path asks for the requeue: at worst one extra run, never a
    preempted run left ended)."""
    parts = (release or "").strip().split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return False
    return (int(parts[0]), int(parts[1])) >= SELF_REQUEUE_RELEASE


def _release(client: JobQueries, exported: str | None, *, ask: bool) -> str | None:
    """The cluster's Slurm release for a preemption's stop: ``exported``, what the batch
    script exported (the stopper's :attr:`~train.stop.stopenv.StopEnv.slurm_release`, from the
    submission's preflight), else the release of the ``scontrol`` the job runs
    (``installed_release``: the program's own answer, no daemon asked), for a batch script
    written by hand, which exports none. Without either, a 24.11+ cluster ran such a job twice
    more: it requeued it itself and so did our ``scontrol requeue``. ``ask``: whether the answer
    matters (Slurm preempted the job): scontrol runs only then."""
    if exported or not ask:
        return exported or None
    return client.installed_release()


def _parse_slurm_timestamp(value: str | None) -> float | None:
    if value is None or value.strip().lower() in _UNSET:
        return None
    try:
        # Slurm prints local time without a zone, e.g. 2026-11-22T10:40:00
        return datetime.fromisoformat(value.strip()).timestamp()
    except ValueError:
        return None


def _time_limit_s(value: str | None) -> float | None:
    if value is None or value.strip().lower() in _UNSET:
        return None
    try:
        from cluster import parse_slurm_time  # stdlib only; lazy like cluster.client

        seconds = parse_slurm_time(value.strip())
    except Exception:  # UNLIMITED parses to None; anything odd: unknown
        return None
    return float(seconds) if seconds is not None else None


def classify_from_job_info(
    info: Mapping[str, str],
    signal_delay_s: float,
    now: float | None = None,
    restart_count: int | None = None,
) -> Literal["preemption", "timeout", "cancel"]:
    """Why Slurm is stopping the job, from ``scontrol show job`` fields (pure).

    - PreemptTime set, or Restarts already above this run's restart count (Slurm requeued it
      when the grace time ended) -> ``preemption``;
    - job still RUNNING: EndTime within ``signal_delay_s + 120`` s -> ``timeout`` (Slurm may
      send the signal up to 60 s early, and its timer runs about every 30 s: seen 61 s early on
      the local cluster), EndTime far away -> ``preemption`` (also a manual
      ``scancel --signal=USR2``: checkpoint and requeue);
    - job already ending (COMPLETING, CANCELLED, ...): its time limit reached -> ``timeout``,
      else ``cancel`` (a plain ``scancel`` sends SIGTERM: stop, never requeue).
    """
    now = time.time() if now is None else now
    margin = signal_delay_s + 120
    if _parse_slurm_timestamp(info.get("PreemptTime")) is not None:
        return "preemption"
    restarts = info.get("Restarts", "")
    if restart_count is not None and restarts.isdigit() and int(restarts) > restart_count:
        return "preemption"
    state = info.get("JobState", "RUNNING").strip().upper()
    if state == "TIMEOUT":
        return "timeout"
    if state in ("RUNNING", "SUSPENDED", "CONFIGURING", "PENDING", ""):
        end = _parse_slurm_timestamp(info.get("EndTime"))
        if end is not None and end - now <= margin:
            return "timeout"
        return "preemption"
    start = _parse_slurm_timestamp(info.get("StartTime"))
    limit = _time_limit_s(info.get("TimeLimit"))
    if start is not None and limit is not None and start + limit - now <= margin:
        return "timeout"
    return "cancel"


def classify_stop(
    job_id: str,
    signal_delay_s: float,
    *,
    client: JobQueries | None = None,
    now: float | None = None,
    restart_count: int | None = None,
) -> StopKind:
    """Ask Slurm why job ``job_id`` is being stopped; ``"signal"`` if Slurm cannot be asked."""
    try:
        if client is None:
            from cluster import slurm_client  # lazy: train does not need cluster to import

            client = slurm_client(timeout=10)
        info = client.show_job(job_id)
    except Exception as exc:  # no scontrol in a container, controller down, ...
        log.warning("cannot ask Slurm about job %s (%s); stop kind unknown", job_id, exc)
        return "signal"
    kind = classify_from_job_info(info, signal_delay_s, now, restart_count)
    log.warning("job %s: stop is a %s", job_id, kind)
    return kind


def end_time(job_id: str, client: JobQueries | None = None) -> float | None:
    """When Slurm ends job ``job_id`` (its EndTime: the time limit), from one ``scontrol show
    job``; None when Slurm cannot say or the job has no limit."""
    try:
        if client is None:
            from cluster import slurm_client  # lazy: only cluster/ runs Slurm commands

            client = slurm_client(timeout=10)
        return _parse_slurm_timestamp(client.show_job(job_id).get("EndTime"))
    except Exception as exc:  # controller busy or gone: no early stop
        log.debug("cannot read job %s's EndTime (%s)", job_id, exc)
        return None


def preemption_grace_s(job_id: str, client: JobQueries) -> int | None:
    """The GraceTime of job ``job_id``'s partition: how long Slurm waits between the preemption
    signal and the kill; None when Slurm cannot say (or the partition has none)."""
    try:
        name = str(client.show_job(job_id).get("Partition", "")).split(",")[0]
        part = client.partition(name) if name else None
    except Exception as exc:  # controller busy or gone: keep the configured grace
        log.debug("cannot read the partition's GraceTime (%s)", exc)
        return None
    return part.grace_time_s if part is not None else None


def node_failure(
    job_id: str, restart_count: int, hosts: Sequence[str], client: JobQueries, *, now: bool = False
) -> dict[str, str] | None:
    """The nodes of this attempt that Slurm failed under job ``job_id`` (node -> state), when
    this stop is a NODE_FAIL (see :func:`train.stop.quarantine.failed_nodes`; ``now``: a
    failure, whose nodes may be down before Slurm requeues the job); None otherwise."""
    if not hosts:
        return None
    try:
        info = client.show_job(job_id)
    except Exception as exc:
        log.debug("cannot ask Slurm about job %s (%s)", job_id, exc)
        return None
    from train.stop.quarantine import failed_nodes

    return failed_nodes(info, restart_count, hosts, client, now=now)


class AskedOnce:
    """``client`` whose ``show_job`` answers once per job (the rest passes through): one stop
    is classified, checked for a node failure and fitted to GraceTime from ONE scontrol call."""

    def __init__(self, client: JobQueries) -> None:
        self._client = client
        self._jobs: dict[str, dict[str, str]] = {}

    def show_job(self, job_id: str) -> dict[str, str]:
        if job_id not in self._jobs:
            self._jobs[job_id] = self._client.show_job(job_id)
        return self._jobs[job_id]

    def cached(self, job_id: str) -> dict[str, str] | None:
        """The answer already given for ``job_id`` (no query), or None."""
        return self._jobs.get(job_id)

    def partition(self, name: str) -> Partition | None:
        return self._client.partition(name)

    def nodes(self) -> list[Node]:
        return self._client.nodes()

    def installed_release(self) -> str | None:
        return self._client.installed_release()


@dataclass(frozen=True)
class StopFacts:
    """What is known about one stop (the input of :func:`train.stop.decision.decide`)."""

    executor: Executor  # slurm (a job id), local (jobs --executor local), none (plain process)
    restart_count: int = 0
    slurm_kind: Literal["preemption", "timeout", "cancel", "requeued", "unknown"] = "unknown"
    nodes_lost: Mapping[str, str] = field(default_factory=dict)  # NODE_FAIL: node -> state
    hang_claimed: bool = False  # the hang watcher took charge of this attempt
    local_cancel: bool = False  # the local launcher cancels (or is gone)
    requeued_by: str | None = None  # "command"/"slurm": the job was requeued already
    suspects: tuple[str, ...] = ()  # a hang's stuck nodes (the watcher's evidence)
    device_fault: bool = False  # a failure's text names a device fault
    node: str | None = None  # this process's node
    job_info: Mapping[str, str] | None = None  # the one scontrol show job of this stop
    failure_class: str = "unknown"  # a failure's cause: user, infra, unknown (train.stop.causes)
    failure_why: str = ""  # the rule that sorted it
    failure_claimed: bool = False  # a rank already recorded this attempt's failure
    in_place: bool = False  # a batch script restarts a failed step in place (SLURM_TRAIN_IN_PLACE)
    signal: str | None = None  # the stop signal this process got ("SIGTERM"), if known
    preempt_evidence: bool = False  # Slurm says preempted (PreemptTime) or requeued (Restarts)
    # every rank met at a barrier after the stop signal (the session decides after its save):
    # no rank died, so a TERM is not srun ending the step of a dead rank
    peers_met: bool = False
    # a command's supervisor: no rank's command reported a failed exit this attempt (nor claimed
    # the failure), so a TERM is not srun ending the step of a dead rank (train.command.rootcause:
    # a failing rank reports before its task ends, so before srun's TERM to the others)
    no_rank_failed: bool = False
    # the newest committed checkpoint's step (RUN_DIR/checkpoints/step-N with its manifest),
    # else a command's last train.report step: where a restart would resume (progress_step);
    # None when none is seen
    checkpoint_step: int | None = None
    # the cluster's release requeues a preempted job itself (:func:`requeues_preempted` of
    # the release the submission exported: the stopper's StopEnv.slurm_release)
    slurm_requeues_preempted: bool = False


def _local_cancel(run_dir: Path | str) -> bool:
    """The local launcher stops the ranks for good: ``RUN_DIR/.local-stop`` says "cancel", or the
    launcher is gone (killed: its ranks got their parent-death SIGTERM; nobody restarts them)."""
    launcher = os.environ.get(LOCAL_SUPERVISOR_ENV, "")
    if launcher.isdigit() and os.getppid() != int(launcher):
        return True
    try:
        text = (Path(run_dir) / LOCAL_STOP).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return text.strip() == "cancel"


_STEP_DIR = re.compile(r"^step-(\d+)(?:\.b[1-9]\d{0,8})?$")


def newest_checkpoint_step(run_dir: Path | str) -> int | None:
    """The step of the newest committed checkpoint under ``RUN_DIR/checkpoints`` (a
    ``step-N`` directory whose manifest, written last, is there; links are not followed):
    where a restart resumes at the latest. One directory listing; None when there is none."""
    root = Path(run_dir) / "checkpoints"
    try:
        names = os.listdir(root)
    except OSError:
        return None
    steps = []
    for name in names:
        m = _STEP_DIR.match(name)
        if m is None:
            continue
        d = root / name
        if not d.is_symlink() and (d / "manifest.json").is_file():
            steps.append(int(m.group(1)))
    return max(steps, default=None)


def progress_step(run_dir: Path | str) -> int | None:
    """Where a restart would resume: the newest committed checkpoint of ours, else (a command
    that keeps its own checkpoints) the last step it reported with ``train.report``."""
    step = newest_checkpoint_step(run_dir)
    return step if step is not None else last_reported_step(run_dir)


def failure_cause(
    error_texts: Sequence[object], rules: Sequence[Any] | None, run_dir: Path | str | None
) -> tuple[str, str, bool]:
    """(class, why, whether the evidence names this node) of a failure
    (:func:`train.stop.causes.decide_cause`). A failure of no known cause that ended the
    previous attempt the same way (:func:`train.stop.causes.signature`: exception, message,
    location), both started from the same checkpoint, is deterministic: a retry repeats it
    (class ``user``, not retried)."""
    from train.history import RunHistory
    from train.stop.causes import BUILTIN_RULES, decide_cause, repeated_failure, signature

    cause = decide_cause(error_texts, BUILTIN_RULES if rules is None else rules)
    if cause.cls != "unknown" or run_dir is None:
        return cause.cls, cause.why, cause.node
    sig = signature(error_texts)
    try:
        same = repeated_failure(RunHistory(run_dir).events(), sig)
    except OSError:
        same = 0
    if same:
        return (
            "user",
            f"the same failure at {same + 1} starts in a row with no checkpoint progress ({sig})",
            False,
        )
    return cause.cls, cause.why, cause.node


def gather(
    trigger: str,
    *,
    job_id: str | None,
    restart_count: int,
    run_dir: Path | str,
    signal_delay_s: float,
    hosts: Sequence[str] = (),
    node: str | None = None,
    client: JobQueries | None = None,
    hang_claimed: bool = False,
    error_texts: Sequence[object] = (),
    suspects: Sequence[str] = (),
    rules: Sequence[Any] | None = None,
    failure_claimed: bool = False,
    in_place: bool = False,
    signal: str | None = None,
    peers_met: bool = False,
    no_rank_failed: bool = False,
    slurm_release: str | None = None,
) -> StopFacts:
    """The facts of one stop, by the one process that decides it (rank 0, the first failing
    rank, the watcher, the supervisor's rank 0): at most one ``scontrol show job``.

    Slurm is asked for an unclassified signal or a cancel (why), and for a failure (whether it
    was a node failure under the job). A caller that already knows the kind (``preemption``,
    ``timeout``) and a hang ask nothing.
    """
    from train.stop.quarantine import device_fault  # stdlib only

    cls, why, names_node = ("unknown", "", False)
    restarting = trigger in ("failure", "hang")
    if trigger == "failure":
        cls, why, names_node = failure_cause(error_texts, rules, run_dir)

    def facts(executor: Executor, **more: Any) -> StopFacts:
        return StopFacts(
            executor,
            restart_count=restart_count,
            hang_claimed=hang_claimed,
            node=node,
            device_fault=trigger == "failure" and (names_node or device_fault(*error_texts)),
            suspects=tuple(sorted(set(suspects))),
            failure_class=cls,
            failure_why=why,
            failure_claimed=failure_claimed,
            in_place=in_place,
            signal=signal,
            peers_met=peers_met,
            no_rank_failed=no_rank_failed,
            checkpoint_step=progress_step(run_dir) if restarting else None,
            **more,
        )

    if not job_id:
        local = bool(os.environ.get(LOCAL_SUPERVISOR_ENV))
        # .local-stop is the local launcher's word, read wherever there is no Slurm job
        cancel = trigger in ("signal", "cancel") and _local_cancel(run_dir)
        return facts("local" if local else "none", local_cancel=cancel)
    # nothing Slurm says changes these decisions: a known kind, a hang's, an echo of a claimed
    # failure (train.stop.decision.decide: none)
    echo = failure_claimed and trigger != "failure"
    if hang_claimed or echo or trigger not in ("signal", "cancel", "failure"):
        return facts("slurm")
    if client is None:
        from cluster import slurm_client  # lazy: only cluster/ runs Slurm commands

        client = slurm_client(timeout=30, shielded=True)
    asked = AskedOnce(client)
    # a failure may be a node's death that Slurm has not acted on yet (a step killed with
    # its node, a rank that lost its peer there): the node's state says so
    lost = node_failure(job_id, restart_count, hosts, asked, now=trigger == "failure")
    kind = "unknown"
    if lost is None and trigger in ("signal", "cancel"):
        found = classify_stop(job_id, signal_delay_s, client=asked, restart_count=restart_count)
        kind = found if found in ("preemption", "timeout", "cancel") else "unknown"
    info = asked.cached(job_id) or {}
    restarts = str(info.get("Restarts", ""))
    preempted = _parse_slurm_timestamp(info.get("PreemptTime")) is not None
    slurm_requeued = restarts.isdigit() and int(restarts) > restart_count
    requeued = lost is None and slurm_requeued
    if requeued and not preempted and trigger in ("signal", "cancel"):
        kind = "requeued"  # scontrol requeue from outside (an administrator): not a preemption
    release = _release(client, slurm_release, ask=preempted)
    return facts(
        "slurm",
        slurm_requeues_preempted=requeues_preempted(release),
        slurm_kind=kind,
        nodes_lost=lost or {},
        job_info=info or None,
        preempt_evidence=preempted or requeued,
        # Slurm already requeued the job (a preemption's grace ended, an administrator):
        # requeueing it again fails ("Job is pending execution")
        requeued_by="slurm" if slurm_requeued else None,
    )
