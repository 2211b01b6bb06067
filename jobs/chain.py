"""Chains of jobs: one run as several Slurm jobs where Slurm's requeue does not work.

Where a site turns requeue off (``JobRequeue=0``), preempts with ``PreemptMode=CANCEL`` (a
preempted job is cancelled, ``--requeue`` is a no-op) or refuses ``--requeue`` at submission,
``jobs submit`` runs the job as a chain (``requeue.mode: chain``, or ``auto`` where
:func:`requeue_support` says requeue does not work here)::

    link 0 ──(afternotok)── link 1 ──(afternotok)── link 2      queued at submission (chain_depth)
      │ preempted / time limit / failure: exits 75 (train.stop.decision) or is cancelled by Slurm
      ▼
    link 1 starts: link-start (the done-check, no-progress check, one more link queued), then
    the same batch script resumes the run from RUN_DIR's last checkpoint, as a requeue would
      │ completed
      ▼
    link-end: the links still queued are cancelled (their afternotok can never be met)

Each link is the run's own ``sbatch.sh`` with ``--no-requeue`` and these two hooks
(:func:`jobs.render.chain_lines`): ``python -m jobs.chain link-start`` before the job step and
``link-end`` when the batch script exits. The run record keeps every link's job id
(``chain_job_ids``), so ``status``, ``logs``, ``cancel`` and the goodput ledger see one run.
The chain ends on completion, a spent budget (the link exits 3), ``jobs cancel`` (every link is
cancelled) or when ``requeue.chain_stall_links`` links in a row ended without a new checkpoint.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs import records
from jobs.confcache import read_entry, write_entry
from jobs.render import submitit_folder, submitted_pickle
from jobs.taskstart import first_note, read_first_note
from train import runfiles
from train.history import RunHistory
from train.stop import BUDGET_EXHAUSTED_EXIT_CODE, REQUEUE_EXIT_CODE

if TYPE_CHECKING:
    from cluster import ClusterLimits, JobInfo, Slurm
    from jobs.load import LoadedSpec

SUPPORT_FILE = "requeue-support.json"
#: The dependency of each link on the link before it: it starts only when that one ended in
#: anything but COMPLETED (failed, cancelled, preempted, timed out, node failure).
LINK_DEPENDENCY = "afternotok"


# -- where requeue works ---------------------------------------------------------------------
def requeue_problem(job_requeue: str, preempt_mode: str) -> str | None:
    """Why a job cannot be requeued here (None: it can), from ``JobRequeue`` and the partition's
    ``PreemptMode`` (pure)."""
    if job_requeue.strip() == "0":
        return "the cluster has JobRequeue=0 (jobs are not requeued)"
    modes = {m.strip().upper() for m in preempt_mode.split(",")}
    if "CANCEL" in modes:
        return "its PreemptMode is CANCEL (a preempted job is cancelled, --requeue is a no-op)"
    return None


def requeue_support(client: Slurm, partition: str, cache_dir: Path) -> str | None:
    """Why requeue does not work for a job in ``partition`` (None: it works).

    ``JobRequeue`` and ``PreemptMode`` are slurm.conf settings: kept in the state directory on
    the file's stamp (as :func:`jobs.preflight.cluster_limits` keeps the array limits), so a
    submission asks Slurm (``scontrol show config`` and ``show partition``) only after an edit.
    """
    stamp = client.conf_stamp()
    data = read_entry(cache_dir, SUPPORT_FILE, stamp)
    known = data.get("partitions") if data is not None else None
    parts: dict[str, Any] = dict(known) if isinstance(known, dict) else {}
    entry = parts.get(partition)
    if isinstance(entry, list) and len(entry) == 2:
        job_requeue, mode = str(entry[0]), str(entry[1])
    else:
        job_requeue, mode = client.requeue_settings(partition)
        parts[partition] = [job_requeue, mode]
        write_entry(cache_dir, SUPPORT_FILE, stamp, {"partitions": parts})
    why = requeue_problem(job_requeue, mode)
    return None if why is None else f"partition {partition}: {why}"


def hold_against_successor(limits: ClusterLimits) -> tuple[bool, str]:
    """Whether a successor queued ahead is back sooner than a requeued job here, and why
    (pure; ``requeue.mode: fastest``, issue 46).

    A requeued job waits ``requeue_hold_s`` in BeginTime (``requeue_delay`` where set, else the
    credential's ``cred_expire``), then for a scheduling pass; a link queued ahead
    (``afternotok``) is eligible the moment the link before it ends and waits at most for the
    next pass (``successor_wait_s``). The expedited requeue of 25.11+ lifts the hold only for a
    job requeued after a node failure, never after a preemption or a time limit: it does not
    change the choice for those."""
    hold, wait = limits.requeue_hold_s, limits.successor_wait_s
    lever = "requeue_delay" if limits.requeue_delay_s is not None else "cred_expire"
    if hold > wait:
        return True, (
            f"Slurm holds a requeued job {hold} s in BeginTime ({lever}); a successor queued "
            f"ahead waits at most {wait} s for a scheduling pass"
        )
    return False, (
        f"Slurm holds a requeued job {hold} s ({lever}), no longer than a successor queued "
        f"ahead may wait for a scheduling pass ({wait} s)"
    )


def with_mode(loaded: LoadedSpec, mode: str) -> LoadedSpec:
    """The same submission with ``requeue.mode`` set in its spec and every task's (auto
    resolved: ``chain`` or ``requeue``)."""

    def moded(spec: Any) -> Any:
        return spec.model_copy(update={"requeue": spec.requeue.model_copy(update={"mode": mode})})

    tasks = [replace(t, spec=moded(t.spec)) for t in loaded.tasks]
    return replace(loaded, spec=moded(loaded.spec), tasks=tasks)


def requeue_refused(message: str) -> bool:
    """Whether sbatch's refusal is about ``--requeue`` (a job submit plugin's, a site's)."""
    return "requeue" in message.lower()


# -- the links -------------------------------------------------------------------------------
def _slurm_env() -> dict[str, str]:
    """This environment without the running job's SLURM_*/SBATCH_* (a link queued from inside
    a job must not inherit that job's settings), SLURM_CONF kept."""
    return {
        k: v
        for k, v in os.environ.items()
        if k == "SLURM_CONF" or not k.startswith(("SLURM_", "SBATCH_", "SALLOC_"))
    }


def _client() -> Slurm:
    from cluster import slurm_client

    return slurm_client(timeout=60, environ=_slurm_env(), shielded=True)


def queue_link(record: records.RunRecord, client: Slurm, after: str) -> str:
    """Submit one more link of the chain, after link ``after`` (afternotok), with the run's own
    script and a copy of its task's pickle; returns its job id."""
    run_dir = Path(record.run_dir)
    folder = submitit_folder(run_dir)
    job_id = client.submit(run_dir / "sbatch.sh", [f"--dependency={LINK_DEPENDENCY}:{after}"])
    # it cannot start before `after` has ended (afternotok): the pickle is there in time
    source = submitted_pickle(folder, record.job_id)
    runfiles.atomic_write(submitted_pickle(folder, job_id), source.read_bytes(), durable=False)
    note = first_note(folder, record.job_id)  # its command starts first too (jobs.taskstart)
    if read_first_note(note) is not None:
        runfiles.atomic_write(first_note(folder, job_id), note.read_bytes(), durable=False)
    return job_id


_STEP_DIR = re.compile(r"step-(\d+)(?:\.b\d+)?")


def last_checkpoint_step(
    events: Sequence[Mapping[str, Any]], run_dir: Path | None = None
) -> int | None:
    """The step of the run's newest checkpoint (None: none yet): the newest of the saves its
    events name (a stop's save, a resume's checkpoint) and of the committed ``step-N``
    directories (interval saves record no event; a directory is named so only once committed)."""
    steps = [
        int(e["step"])
        for e in events
        if e.get("event") in ("checkpoint", "resume") and isinstance(e.get("step"), int)
    ]
    if run_dir is not None:
        try:
            names = os.listdir(run_dir / "checkpoints")
        except OSError:
            names = []
        steps += [int(m.group(1)) for n in names if (m := _STEP_DIR.fullmatch(n))]
    return max(steps) if steps else None


def stalled(events: Sequence[Mapping[str, Any]], step: int | None, links: int) -> bool:
    """Whether the last ``links`` links all started from checkpoint ``step`` as this one does:
    ``links`` links in a row ended without a new checkpoint (pure)."""
    starts = [e for e in events if e.get("event") == "link_started"]
    if len(starts) < links:
        return False
    return all(e.get("checkpoint_step") == step for e in starts[-links:])


def ended(events: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the chain is over already (None: it goes on): completed, or a budget spent / the
    chain ended since the last link started (pure)."""
    if any(e.get("event") in ("complete", "chain_ended") for e in events):
        done = next(e for e in reversed(events) if e.get("event") in ("complete", "chain_ended"))
        return str(done.get("reason") or "completed")
    last = max((i for i, e in enumerate(events) if e.get("event") == "link_started"), default=-1)
    spent = next((e for e in events[last + 1 :] if e.get("event") == "budget_exhausted"), None)
    return None if spent is None else str(spent.get("reason") or "a budget is spent")


def _later_links(record: records.RunRecord, job_id: str) -> list[str]:
    ids = record.chain_job_ids
    return ids[ids.index(job_id) + 1 :] if job_id in ids else []


def _end_chain(record: records.RunRecord, job_id: str, reason: str, client: Slurm | None) -> None:
    """Record the chain's end, cancel the links still queued behind ``job_id``, and let the
    stages of a pipeline waiting on it start or cancel them (jobs.dependents)."""
    history = RunHistory(record.run_dir)
    later = _later_links(record, job_id)
    history.append("chain_ended", job_id=job_id, reason=reason, cancelled=later)
    if record.dependents:
        from jobs.dependents import release_dependents

        client = client or _client()
        release_dependents(record, job_id, reason == "completed", reason, client)
    if later:
        from cluster import ClusterError

        try:
            (client or _client()).cancel(list(reversed(later)), no_requeue=True)
        except ClusterError as exc:
            print(f"jobs.chain: cannot cancel the queued links {', '.join(later)}: {exc}",
                  file=sys.stderr)  # fmt: skip


def link_start(run_dir: Path, job_id: str, client: Slurm | None = None) -> str:
    """At the start of a link: ``run`` (the first link), ``resume N`` (the N-th link to start:
    it resumes the run from its last checkpoint), or ``exit N`` when the chain is over (the
    run completed, a budget is spent, no checkpoint progress in the last links). A link that
    runs records ``link_started`` and tops the chain up to ``chain_depth`` queued links."""
    record = records.load_record(run_dir)
    from train.spec import load_run_config

    config = load_run_config(record.tasks[0].run_dir + "/resolved.yaml").requeue
    history = RunHistory(run_dir)
    events = history.events()
    why = ended(events)
    if why is not None:
        if not any(e.get("event") == "chain_ended" for e in events):
            _end_chain(record, job_id, why, client)
        return "exit 0"
    step = last_checkpoint_step(events, Path(record.run_dir))
    if stalled(events, step, config.chain_stall_links):
        at = "no checkpoint yet" if step is None else f"the checkpoint of step {step}"
        _end_chain(
            record, job_id,
            f"no progress: {config.chain_stall_links} links in a row ended at {at} "
            f"(requeue.chain_stall_links={config.chain_stall_links})",
            client,
        )  # fmt: skip
        return f"exit {BUDGET_EXHAUSTED_EXIT_CODE}"
    ids = record.chain_job_ids
    link = ids.index(job_id) if job_id in ids else len(ids)
    earlier = sum(e.get("event") == "link_started" for e in events)
    fields: dict[str, Any] = {"job_id": job_id, "link": link, "checkpoint_step": step}
    history.append("link_started", **fields)
    queued = _later_links(record, job_id) if job_id in ids else []
    missing = config.chain_depth - len(queued)
    if missing > 0:
        from cluster import ClusterError

        client = client or _client()
        try:
            for _ in range(missing):
                after = record.chain_job_ids[-1] if record.chain_job_ids else job_id
                record.chain_job_ids.append(queue_link(record, client, after))
        except (ClusterError, OSError) as exc:
            print(f"jobs.chain: cannot queue the next link: {exc}", file=sys.stderr)
        records.save_record(record)  # the one writer now: the links before it have ended
    # a later link continues the run of the links before it (train: a resume)
    return f"resume {earlier}" if earlier else "run"


def link_end(run_dir: Path, job_id: str, exit_code: int, client: Slurm | None = None) -> None:
    """When a link's batch script exits: the chain ends when the run completed, a budget is
    spent or it was cancelled (the queued links cancelled); a link that stopped to be resumed
    (exit 75, a failure) leaves it to the next link."""
    if exit_code == REQUEUE_EXIT_CODE:
        return
    record = records.load_record(run_dir)
    events = RunHistory(run_dir).events()
    if any(e.get("event") == "chain_ended" for e in events):
        return
    why = ended(events)
    if why is None and exit_code == 0:
        mine = [e for e in events if str(e.get("job_id")) == job_id]
        if any(e.get("event") == "cancelled" for e in mine):
            why = "cancelled"
    if why is not None:
        _end_chain(record, job_id, why, client)


def chain_state(record: records.RunRecord, found: Mapping[str, JobInfo]) -> JobInfo | None:
    """The run's state from its links' (pure): a running link, else COMPLETED, else the first
    link still waiting, else the last link that ended other than cancelled (a failure, a spent
    budget), else the last link."""
    infos = [found[j] for j in record.chain_job_ids if j in found]
    if not infos:
        return None
    for pick in (
        lambda i: i.state == "RUNNING",
        lambda i: i.state == "COMPLETED",
        lambda i: not i.terminal,
    ):
        hit = next((i for i in infos if pick(i)), None)
        if hit is not None:
            return replace(hit, job_id=record.job_id)
    ran = [i for i in infos if i.state != "CANCELLED"]
    return replace((ran or infos)[-1], job_id=record.job_id)


def main(argv: list[str] | None = None) -> int:
    """``python -m jobs.chain link-start|link-end RUN_DIR --job-id ID [--exit-code N]``: the
    hooks of a link's batch script (:func:`jobs.render.chain_lines`); link-start prints ``run``,
    ``resume N`` or ``exit N``."""
    p = argparse.ArgumentParser(prog="python -m jobs.chain")
    p.add_argument("what", choices=("link-start", "link-end"))
    p.add_argument("run_dir", type=Path)
    p.add_argument("--job-id", required=True)
    p.add_argument("--exit-code", type=int, default=0)
    ns = p.parse_args(argv)
    try:
        if ns.what == "link-start":
            print(link_start(ns.run_dir, ns.job_id))
        else:
            link_end(ns.run_dir, ns.job_id, ns.exit_code)
    except Exception as exc:  # the batch script goes on: a link resumes the run either way
        print(f"jobs.chain: {ns.what}: {type(exc).__name__}: {exc}", file=sys.stderr)
        if ns.what == "link-start":
            print("resume")  # train resumes from the last checkpoint, or starts fresh
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
