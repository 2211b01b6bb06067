"""After a job step ends: restart it in place, or end the batch script (torch-free).

The batch script (``jobs submit``'s, and the ``requeue`` template) runs the training step in a
loop and asks this module after each step::

    export SLURM_TRAIN_IN_PLACE=0          # the ranks know a batch script restarts them
    while :; do
      srun ... python -m train ...; rc=$?
      next=$(python -m train.stop.step --run-dir DIR --config SPEC --exit-code "$rc" \\
             --job-id "$SLURM_JOB_ID" --restart-count "${SLURM_RESTART_COUNT:-0}" \\
             --in-place "$SLURM_TRAIN_IN_PLACE")
      [ "$next" = restart ] || exit "${next#exit }"
      SLURM_TRAIN_IN_PLACE=$((SLURM_TRAIN_IN_PLACE + 1))
    done

What the step's processes decided (:mod:`train.stop`: the failing rank's or the hang watcher's
``failure``/``hang`` event carries its ``action``) is carried out here: ``restart_in_place``
records a ``restart_in_place`` event and answers ``restart`` (a new step on the same nodes,
from the last valid checkpoint; no requeue, no trip through the queue). A step whose ranks died
without a record (``kill -9``, the OOM killer, a segfault) is decided here, through the same
:func:`train.stop.decision.decide`, as a failure of the step.

A step whose rank 0 recorded the run ``complete`` ends the script with 0 whatever another rank
exited with afterwards (:func:`train.history.attempt_completed_at`: the one definition the
command supervisor and the local executor use too). Exit 75 is a requeue Slurm refused to the
ranks (``scontrol requeue`` failed): it is retried here with back-off, and the event says what
happened (``requeue`` via ``batch_script``, or ``requeue_failed``). Everything else (requeued,
cancelled, a budget spent, bad input) ends the script with the step's exit code. In a link of a
chain of jobs (``requeue.mode: chain``, jobs.chain) exit 75 ends the script with 75: the next
link resumes the run.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from train.env import exported_release, job_hosts
from train.history import RunHistory, attempt_completed_at
from train.runfiles import default_run_dir, events_where
from train.stop.act import stop_attempt
from train.stop.decision import BUDGET_EXHAUSTED_EXIT_CODE, REQUEUE_EXIT_CODE
from train.stop.stopenv import Decider

if TYPE_CHECKING:
    from cluster import Slurm
    from train.spec import RequeueConfig

__all__ = ["after_step", "main"]

log = logging.getLogger(__name__)

#: Ends of an attempt after which nothing is left to do here.
_SETTLED = events_where(settles=True)
#: Exit codes that say what to do by themselves: done, bad input, budget spent.
_FINAL_CODES = frozenset({0, 2, BUDGET_EXHAUSTED_EXIT_CODE})
#: Seconds between the batch script's tries of a requeue Slurm refused (the controller away
#: for a moment): five tries within about half a minute, well inside Slurm's signal lead.
REQUEUE_BACKOFF_S = (1.0, 2.0, 4.0, 8.0)


def _mine(history: RunHistory, env: Decider) -> list[dict[str, Any]]:
    return [
        e
        for e in history.events()
        if str(e.get("job_id")) == str(env.job_id)
        and e.get("restart_count") == env.restart_count
        and (e.get("in_place") or 0) == env.in_place
    ]


def _refused(mine: list[dict[str, Any]]) -> bool:
    """Whether the attempt's newest requeue record is a rank's refused one (none done since)."""
    last = next((e for e in reversed(mine) if e["event"] in ("requeue", "requeue_failed")), None)
    return last is not None and last["event"] == "requeue_failed" and last.get("by") == "rank"


def after_step(
    run_dir: Path,
    requeue: RequeueConfig | Callable[[], RequeueConfig],
    *,
    job_id: str | None,
    restart_count: int,
    in_place: int,
    exit_code: int,
    hosts: tuple[str, ...] | None = None,
    client: Slurm | None = None,
    restarts: bool = True,
    stop_signal: str | None = None,
) -> int | None:
    """None: restart the step in place; otherwise the batch script's exit code. ``hosts``: the
    allocation's nodes (default: the batch script's ``SLURM_JOB_NODELIST``); a step that died
    while one of them is down is a node failure, requeued off it, not restarted in place.
    ``restarts``: the batch script restarts a step (False: a template that runs one step).
    ``stop_signal``: the stop signal the batch script got (``USR2``, ``TERM``) before the step ended
    without answering it (killed: an exit code above 128): see :func:`_after_signal`.
    ``requeue``: the run's requeue section, or what reads it: read only where the ranks left
    something to decide (a step whose rank decided a restart in place needs none: the run's
    spec models are a fifth of a second of this interpreter, between the steps)."""
    if exit_code == 0 or not job_id:
        return exit_code
    history = RunHistory(run_dir)
    events = history.events()
    if attempt_completed_at(events, job_id=job_id, restart_count=restart_count,
                            in_place=in_place) is not None:  # fmt: skip
        log.warning("the step exited %d after rank 0 completed the run: the run is complete",
                    exit_code)  # fmt: skip
        return 0
    hosts = job_hosts(os.environ) if hosts is None else hosts
    # the batch script decides for a step whose ranks recorded nothing (it acts as rank 0); it
    # restarts steps in place unless it is a template that runs one step (``restarts``), and
    # the allocation's nodes are its hosts
    env = Decider(job_id, restart_count, in_place, in_place_supervised=restarts, hosts=hosts,
                  slurm_release=exported_release(os.environ))  # fmt: skip
    mine = _mine(history, env)
    if exit_code == REQUEUE_EXIT_CODE and _read(requeue).mode == "chain":
        return exit_code  # a link of a chain (jobs.chain): the next link resumes, no requeue
    if exit_code == REQUEUE_EXIT_CODE or _refused(mine):
        # a requeue the ranks decided and Slurm refused them: carried out here, whatever
        # code srun ended with (a rank killed meanwhile ends it with 137, not 75)
        return requeue_after_step(history, job_id, restart_count, in_place, client=client)
    if stop_signal:
        return _after_signal(run_dir, history, env, mine, _read(requeue), exit_code, stop_signal,
                             client)  # fmt: skip
    if exit_code in _FINAL_CODES:
        return exit_code
    if any(e["event"] in _SETTLED for e in mine):
        return exit_code
    decided = next((e for e in reversed(mine) if e["event"] in ("failure", "hang")), None)
    if decided is not None:
        action = decided.get("action")
        step = decided.get("step")
    else:
        # nobody recorded this step's end: a rank died from outside (or all did)
        how = f"killed by signal {exit_code - 128}" if exit_code > 128 else f"exited {exit_code}"
        code, decision = stop_attempt(
            env,
            run_dir,
            _read(requeue),
            "failure",
            error=f"step exited {exit_code} ({how}) without a record from its ranks",
            client=client,
        )
        if decision is None or decision.action != "restart_in_place":
            return code if code else exit_code
        action, step = decision.action, None
    if action != "restart_in_place":
        return exit_code
    history.append(
        "restart_in_place",
        step=step,
        restart_count=restart_count,
        job_id=job_id,
        **({"in_place": in_place} if in_place else {}),
        after=decided["event"] if decided is not None else "failure",
        next_in_place=in_place + 1,
    )
    log.warning("restarting in place (%d): a new step in this allocation", in_place + 1)
    return None


def _read(requeue: RequeueConfig | Callable[[], RequeueConfig]) -> RequeueConfig:
    return requeue() if callable(requeue) else requeue


def _after_signal(
    run_dir: Path,
    history: RunHistory,
    env: Decider,
    mine: list[dict[str, Any]],
    requeue: RequeueConfig,
    exit_code: int,
    signal_name: str,
    client: Slurm | None,
) -> int:
    """The batch script got a stop signal and the step ended without answering it (killed
    before it could save and requeue). What the ranks recorded and carried out stands (the
    requeue done: 0; the run ended: the step's code); a stop they recorded but did not carry
    out (no requeue since) is requeued here; with nothing recorded the stop is decided here as
    the ranks would have (Slurm says why: one ``scontrol show job``; a cancel stays cancelled),
    recorded (``by: batch_script``) and carried out, a refused requeue retried."""
    settled = [e["event"] for e in mine if e["event"] in _SETTLED]
    if settled:
        return 0 if "requeue" in settled else exit_code
    stopped = next((e for e in reversed(mine) if e["event"] in ("preempted", "timeout")), None)
    job_id = str(env.job_id)
    if stopped is not None:
        return requeue_after_step(history, job_id, env.restart_count, env.in_place,
                                  client=client)  # fmt: skip
    details = {"signal": f"SIG{signal_name.removeprefix('SIG')}", "by": "batch_script",
               "exit_code": exit_code}  # fmt: skip
    code, _ = stop_attempt(env, run_dir, requeue, "signal", client=client,
                           details=details)  # fmt: skip
    if code == REQUEUE_EXIT_CODE:  # Slurm refused the requeue: tried again with back-off
        return requeue_after_step(history, job_id, env.restart_count, env.in_place,
                                  client=client)  # fmt: skip
    return code


def requeue_after_step(
    history: RunHistory,
    job_id: str,
    restart_count: int,
    in_place: int,
    *,
    client: Slurm | None = None,
    backoff_s: tuple[float, ...] = REQUEUE_BACKOFF_S,
    sleep: Any = time.sleep,
) -> int:
    """The step exited 75: its ranks decided a requeue that Slurm refused them. Try again with
    back-off; 0 once Slurm took it (or requeued the job itself meanwhile), else 75 (the job
    ends, FAILED: it cannot come back). Each outcome is an event: ``requeue`` (via
    ``batch_script``, or ``slurm``) or ``requeue_failed`` (by ``batch_script``)."""
    mine = _mine(history, Decider(job_id, restart_count, in_place))
    step = next((e.get("step") for e in reversed(mine) if e.get("step") is not None), None)
    base: dict[str, Any] = {"step": step, "restart_count": restart_count, "job_id": job_id}
    if in_place:
        base["in_place"] = in_place
    if client is None:
        from cluster import slurm_client  # lazy: only cluster/ runs Slurm commands

        client = slurm_client(timeout=10, shielded=True)
    # the requeue ends this job's processes, this one too: what Slurm answered is recorded
    # before Slurm's TERM may end it (its KILL comes KillWait later)
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        error = ""
        for attempt, pause in enumerate((0.0, *backoff_s)):
            if pause:
                sleep(pause)
            try:
                client.requeue(job_id)
            except Exception as exc:
                error = str(exc)[:200] or type(exc).__name__
                if _requeued_by_slurm(client, job_id, restart_count):
                    history.append("requeue", **base, via="slurm")
                    return 0
                log.warning("scontrol requeue %s failed (try %d): %s", job_id, attempt + 1, error)
                continue
            history.append("requeue", **base, via="batch_script", tries=attempt + 1)
            log.warning("job %s requeued by the batch script (try %d)", job_id, attempt + 1)
            return 0
        history.append("requeue_failed", **base, by="batch_script", error=error,
                       tries=len(backoff_s) + 1)  # fmt: skip
        log.error("job %s: Slurm refused the requeue %d times (%s): the job ends here, not "
                  "requeued", job_id, len(backoff_s) + 1, error)  # fmt: skip
        return REQUEUE_EXIT_CODE
    finally:
        with contextlib.suppress(Exception):
            signal.signal(signal.SIGTERM, previous)


def _requeued_by_slurm(client: Slurm, job_id: str, restart_count: int) -> bool:
    """Whether Slurm already requeued the job (a requeue that went through though its answer
    was lost, a preemption): its restart count moved past this attempt's."""
    try:
        restarts = str(client.show_job(job_id).get("Restarts", ""))
    except Exception:
        return False
    return restarts.isdigit() and int(restarts) > restart_count


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m train.stop.step", description=__doc__)
    p.add_argument("--run-dir", type=Path, help="default: as python -m train chooses it")
    p.add_argument("--config", help="the spec (its requeue: section); default DIR/resolved.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--exit-code", type=int, required=True)
    p.add_argument("--job-id", default="")
    p.add_argument("--restart-count", type=int, default=0)
    p.add_argument("--in-place", type=int, default=0)
    p.add_argument("--no-restart", action="store_true",
                   help="the batch script runs one step (never answers restart)")  # fmt: skip
    p.add_argument("--signal", default=None,
                   help="the stop signal the batch script got before the step ended")  # fmt: skip
    ns = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[after step] %(message)s", stream=sys.stderr)
    try:
        from train.spec import load_run_config

        if ns.config is None and ns.run_dir is None:
            raise ValueError("give --config or --run-dir")
        spec = ns.config or ns.run_dir / "resolved.yaml"
        config = load_run_config(spec if Path(spec).is_file() else None, ns.set)
        run_dir = ns.run_dir or default_run_dir(config.train.run_dir, ns.job_id or None)
        code = after_step(
            run_dir,
            config.requeue,
            job_id=ns.job_id or None,
            restart_count=ns.restart_count,
            in_place=ns.in_place,
            exit_code=ns.exit_code,
            restarts=not ns.no_restart,
            stop_signal=ns.signal,
        )
    except Exception as exc:  # the script must go on: end with the step's own code
        log.error("cannot decide after the step (%s: %s)", type(exc).__name__, exc)
        code = ns.exit_code
    with contextlib.suppress(OSError):  # the batch script may be gone (requeued)
        print("restart" if code is None else f"exit {code}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
