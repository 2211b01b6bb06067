"""``python -m jobs``: submit, status, logs, cancel, list, drill, plot; login (``--remote HOST``:
the same commands for a cluster reached over SSH, :mod:`jobs.remote`).

Exit codes: 0 ok, 2 bad input or usage, 1 anything else. Errors are one line on stderr (a spec
with several problems: one line each); ``--debug`` adds the traceback. Nothing here imports
torch; heavy modules are imported by the command that needs them.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

from cluster import BadInputError
from jobs.errors import InputError, JobsError, UsageError
from train.runfiles import EVENT_KINDS

if TYPE_CHECKING:
    from cluster import Slurm
    from jobs.load import LoadedSpec
    from jobs.records import RunRecord

# the kinds of `jobs drill`: the table's events a drill produces (jobs.drill.KINDS, unimported)
DRILLS = tuple(k.drill for k in EVENT_KINDS if k.drill)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # the examples of each --help (epilog) keep their lines
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see --help)")


#: sbatch_templates/*.sbatch (jobs.templates.TEMPLATE_NAMES; a test keeps the two the same:
#: the parser does not import the renderer)
TEMPLATES = ("ddp", "dataparallel", "requeue", "array")
DEFAULT_PYTHON = "python3"  # jobs.remote.DEFAULT_PYTHON (the parser does not import it)


def _examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def build_parser(prog: str = "python -m jobs") -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description="Submit and watch training jobs on Slurm.",
        epilog=_examples(
            "python -m jobs submit examples/cifar.yaml --follow",
            "python -m jobs status",
            "python -m jobs SUBCOMMAND --help      # each with its own examples",
        ),
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(
        dest="command",
        required=True,
        parser_class=_Parser,
    )

    s = sub.add_parser(
        "submit",
        help="validate a spec and submit it (prints the job id)",
        epilog=_examples(
            "python -m jobs submit examples/cifar.yaml --follow",
            "python -m jobs submit my.yaml --set train.max_steps=200 --dry-run",
            "python -m jobs submit my.yaml --executor local       # this machine, no Slurm",
            "python -m jobs submit my.yaml --dry-run --template ddp > ddp.sbatch",
        ),
    )
    s.add_argument("spec", help="job spec YAML file")
    s.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="K=V",
        help="override a field, e.g. --set train.max_steps=20 (repeatable)",
    )
    s.add_argument(
        "--dry-run",
        action="store_true",
        help="print the exact sbatch script; submit nothing (no cluster needed)",
    )
    s.add_argument(
        "--follow",
        action="store_true",
        help="stream progress until the job ends; exit 0 iff COMPLETED",
    )
    s.add_argument(
        "--executor",
        choices=("auto", "slurm", "local"),
        default="auto",
        help="slurm, local (this machine, no Slurm) or auto (slurm when found)",
    )
    s.add_argument(
        "--json",
        action="store_true",
        help="print the submission (and, with --follow, every update) as JSON, one object a line",
    )
    s.add_argument(
        "--no-preflight", action="store_true", help="skip the checks against the live cluster"
    )
    s.add_argument(
        "--template",
        metavar="NAME",
        help="render sbatch_templates/NAME.sbatch instead of the submitit script: "
        f"{', '.join(TEMPLATES)} (README: sbatch by hand)",
    )
    s.add_argument(
        "--runs-dir", help="parent of run directories (default: $SLURM_TRAIN_RUNS_DIR or ./runs)"
    )
    s.add_argument(
        "--continue-files",
        action="store_true",
        help="a command: let it continue from the checkpoint files an earlier run left in this "
        "folder (without it, jobs submit refuses to: see jobs/workdir.py)",
    )

    st = sub.add_parser(
        "status",
        help="state of a run (or of recent runs)",
        epilog=_examples("python -m jobs status", "python -m jobs status cifar --json"),
    )
    st.add_argument("run", nargs="?", help="run id, job id, name or run directory")
    st.add_argument("--json", action="store_true")
    st.add_argument(
        "--no-goodput",
        action="store_true",
        help="a named run: leave out its goodput (one sacct less; what a --follow poll from "
        "another machine asks)",
    )

    lg = sub.add_parser(
        "logs",
        help="print (or follow) the log of one rank",
        epilog=_examples("python -m jobs logs cifar -f", "python -m jobs logs 1234_3 --rank 1"),
    )
    lg.add_argument("run", help="run id, job id (12 or 12_3), name or run directory")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    lg.add_argument("--rank", type=int, default=0, help="global rank (default 0)")

    c = sub.add_parser(
        "cancel",
        help="cancel a run (scancel)",
        epilog=_examples("python -m jobs cancel cifar", "python -m jobs cancel 1234"),
    )
    c.add_argument("run", help="run id, job id, name or run directory")

    ls = sub.add_parser(
        "list",
        help="recorded runs, newest first, with their states (one Slurm query for all)",
        epilog=_examples("python -m jobs list", "python -m jobs list -n 5 --json"),
    )
    ls.add_argument("-n", type=int, default=20, help="how many (default 20)")
    ls.add_argument("--json", action="store_true")
    ls.add_argument("--no-state", action="store_true", help="ask Slurm nothing (index only)")
    dr = sub.add_parser(
        "drill",
        help="interrupt a running job as Slurm would, wait for it, report what it cost",
        epilog=_examples(
            "python -m jobs drill cifar --kind preempt", "python -m jobs drill 1234 --kind fail"
        ),
    )
    dr.add_argument("run", help="run id, job id, name or run directory")
    dr.add_argument(
        "--kind",
        required=True,
        choices=DRILLS,
        help="preempt: a job in a higher-priority partition; timeout: a lowered time limit, "
        "restored and read back (refused where it cannot be restored); "
        "cancel: scancel; fail: a crash (SIGABRT), then requeue",
    )
    dr.add_argument("--json", action="store_true", help="print the report as JSON")
    dr.add_argument("--timeout", type=float, default=900.0, help="give up after S seconds")
    dr.add_argument("--partition", help="preempt: the partition to submit to (default: found)")
    dr.add_argument(
        "--accept-short-limit",
        action="store_true",
        help="timeout, where only operators may raise a limit: drill anyway, knowing the job "
        "keeps the short limit (it times out at every restart until requeue.max_timeouts)",
    )
    pl = sub.add_parser(
        "plot",
        help="one picture of a run's life: curves, interruptions, resumes (PNG)",
        epilog=_examples("python -m jobs plot cifar", "python -m jobs plot 1234 -o life.png"),
    )
    pl.add_argument("run", help="run id, job id, name or run directory")
    pl.add_argument("-o", "--output", type=Path, help="PNG file (default: RUN_DIR/plot.png)")
    li = sub.add_parser(
        "login",
        help="connect to a login node once (password, 2FA); later --remote commands share it",
        epilog=_examples(
            "python -m jobs login mycluster      # an alias of ~/.ssh/config",
            "python -m jobs submit my.yaml --remote mycluster --follow",
        ),
    )
    li.add_argument("host", help="an alias of your OpenSSH configuration ($SLURM_TRAIN_SSH_CONFIG)")
    for sp in (s, st, lg, c, ls, dr, pl):
        sp.add_argument(
            "--remote",
            metavar="HOST",
            help="the cluster behind this ssh alias (README: From your laptop)",
        )
        sp.add_argument(
            "--remote-python",
            metavar="PATH",
            help=f"--remote: the Python that has slurm-train there (default {DEFAULT_PYTHON})",
        )
    s.add_argument(
        "--remote-dir",
        metavar="DIR",
        help="--remote: the folder there where the code already is (nothing is sent); "
        "default: the git-tracked files go to ~/slurm-train/code/NAME",
    )
    for sp in (s, st, lg, c, ls, dr, pl, li):
        sp.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
    return p


def _client() -> Slurm:
    from cluster import slurm_client

    return slurm_client()


# -- submit -------------------------------------------------------------------------------------
def cmd_submit(args: argparse.Namespace, out: IO[str]) -> int:
    if args.dry_run and args.follow:
        raise UsageError("submit: --dry-run and --follow do not go together")
    if args.template and not args.dry_run:
        raise UsageError(
            "submit: --template renders a plain sbatch script; use it with --dry-run "
            "and submit the script with sbatch"
        )
    if args.remote is not None:
        return _submit_remote(args, out)
    from jobs.load import load_spec
    from jobs.records import runs_root
    from jobs.submit import make_plan

    client = None
    if not args.dry_run and args.executor != "local":
        client = _client()
        if not args.no_preflight:
            client.prefetch_cluster_state()  # the preflight's sinfo runs during validation
    try:
        if _is_pipeline(args.spec):  # stages: (jobs.pipeline)
            return _submit_pipeline(args, client, out)
        loaded = load_spec(args.spec, args.overrides)
        plan = make_plan(loaded, runs_root(args.runs_dir))
        if not args.dry_run and not args.continue_files:
            _refuse_earlier_files(loaded, runs_root(args.runs_dir))
        if args.dry_run:  # the one dry-run route: what Slurm would get (jobs.render's mapping)
            from jobs.submit import dry_run, dry_run_note

            out.write(dry_run(loaded, plan, args.template))
            note = dry_run_note(loaded)
            if note:
                print(note, file=sys.stderr)
            if args.executor == "local":
                msg = "jobs: --executor local runs the same spec here, one process per rank"
                print(f"{msg} (no sbatch)", file=sys.stderr)
            return 0
        from jobs.submit import submit

        record = submit(loaded, plan, client, args.executor, preflight=not args.no_preflight)
    finally:
        if client is not None:
            client.discard_prefetch()  # a refused spec: the query nobody read
    _print_submitted(record, args.json, out)
    if args.follow:
        from jobs.follow import follow

        return follow(record, _client, out=out, as_json=args.json)
    return 0


def _is_pipeline(spec: str) -> bool:
    """A spec with a top-level ``stages:`` (jobs.pipeline; its models, pydantic, only then)."""
    import re

    from train.spec import read_spec_file

    try:
        return re.search(r"(?m)^stages\s*:", read_spec_file(Path(spec))) is not None
    except Exception:  # not readable: load_spec says why, in one line
        return False


def _submit_pipeline(args: argparse.Namespace, client: Slurm | None, out: IO[str]) -> int:
    """A spec with ``stages:``: every stage a run of its own, each after the one before."""
    from jobs.pipeline import dry_run_pipeline, submit_pipeline
    from jobs.records import runs_root

    if args.template or args.follow or args.executor == "local":
        raise UsageError(
            "submit: a pipeline (stages:) runs on Slurm only, without --template or --follow "
            "(follow a stage: python -m jobs follow RUN)"
        )
    path, root = Path(args.spec), runs_root(args.runs_dir)
    if args.dry_run:
        out.write(dry_run_pipeline(path, args.overrides, root))
        return 0
    assert client is not None  # not a dry run, not local
    stages = submit_pipeline(path, args.overrides, client, root, preflight=not args.no_preflight)
    if args.json:
        rows = [{"stage": r.stage, "run_id": r.run_id, "job_id": r.job_id, "run_dir": r.run_dir}
                for r in stages]  # fmt: skip
        out.write(json.dumps({"pipeline": stages[0].pipeline, "stages": rows}) + "\n")
    else:
        for r in stages:
            out.write(f"{r.stage} {r.job_id}\n")
        print(f"jobs: submitted pipeline {stages[0].pipeline} ({len(stages)} stages): "
              f"python -m jobs status {stages[0].pipeline}", file=sys.stderr)  # fmt: skip
    return 0


def _submit_remote(args: argparse.Namespace, out: IO[str]) -> int:
    if args.dry_run or args.template or args.executor == "local":
        raise UsageError(
            "submit: --remote submits to the cluster there (no --dry-run, "
            "--template or --executor local: run those here)"
        )
    from jobs import remote

    opts = remote.SubmitOptions(
        args.remote,
        args.spec,
        args.overrides,
        args.remote_dir,
        args.remote_python,
        args.no_preflight,
        args.continue_files,
        args.runs_dir,
    )
    code, run = remote.submit(opts, out)
    if code != 0 or run is None or not args.follow:
        return code
    return remote.follow(run, out, rank=0)  # the states and rank 0's log


def _remote(args: argparse.Namespace, out: IO[str]) -> int | None:
    """A remote run's command (``--remote``, or a run recorded as remote here); None: local."""
    if getattr(args, "remote", None) is None and getattr(args, "run", None) is None:
        return None
    from jobs.remote import dispatch

    return dispatch(args, out)


def cmd_login(args: argparse.Namespace, out: IO[str]) -> int:
    from jobs.remote import login

    return login(args.host, out)


def _refuse_earlier_files(loaded: LoadedSpec, runs: Path) -> None:
    """A command runs in this folder: refuse when an earlier run's checkpoint is here."""
    if loaded.spec.entrypoint is None or loaded.spec.entrypoint.command is None:
        return
    from jobs.records import read_index
    from jobs.workdir import earlier_checkpoints, refusal

    here = Path.cwd()
    found = earlier_checkpoints(here, read_index(report=False), runs)
    if found:
        raise UsageError(f"submit: {refusal(found, here)}")


def _print_submitted(record: RunRecord, as_json: bool, out: IO[str]) -> None:
    if as_json:
        data = {
            "run_id": record.run_id,
            "job_id": record.job_id,
            "job_ids": record.job_ids(),
            "run_dir": record.run_dir,
            "executor": record.executor,
            "array_size": record.array_size,
        }
        out.write(json.dumps(data) + "\n")
    else:
        out.write(f"{record.job_id}\n")
        size = f", array of {record.array_size}" if record.array_size else ""
        print(f"jobs: submitted {record.run_id}{size}; run dir {record.run_dir}", file=sys.stderr)
    out.flush()


# -- status / list ------------------------------------------------------------------------------
def cmd_status(args: argparse.Namespace, out: IO[str]) -> int:
    stages = _pipeline(args)
    if not stages and (code := _remote(args, out)) is not None:
        return code
    from jobs.goodputview import run_ledger, write_goodput
    from jobs.monitor import states_many
    from jobs.records import find_run, iter_records
    from jobs.statusview import status_json, write_status

    if stages:  # a pipeline: a line per stage
        runs = stages
    elif args.run:
        runs = [find_run(args.run)]
    else:
        runs = [r for _, r in zip(range(20), iter_records(), strict=False)]
        if not runs:
            out.write("no runs recorded yet\n")
            return 0
    states = states_many(runs, _client)  # one sacct call for all of them
    # a named run: its goodput too (one more sacct, -D: Slurm's times of every attempt; not
    # for a run that never started: its time so far is all queued)
    want = args.run and not args.no_goodput and not stages
    ledger = run_ledger(runs[0], _client, states=states) if want else None
    # how the cluster restarts a requeued job, as the last preflight read it (no query)
    levers = None
    if args.run and not stages and runs[0].executor == "slurm":
        from jobs.preflight import cached_limits
        from jobs.records import state_dir

        levers = cached_limits(state_dir())
    if args.json:
        data = status_json(runs, states)
        if ledger is not None:
            data[0]["goodput"] = write_goodput(ledger)
        if levers is not None:
            data[0]["requeue_delay_s"] = levers.requeue_delay_s
            data[0]["expedited_requeue"] = levers.expedited_requeue
        if args.run and not stages and runs[0].restart_mode:
            data[0]["restart_mode"] = runs[0].restart_mode
            data[0]["restart_reason"] = runs[0].restart_reason
        out.write(json.dumps(data if not args.run or stages else data[0], indent=1) + "\n")
    else:
        write_status(runs, states, out)
        from jobs.preflight import restart_levers_line
        from jobs.statusview import restart_mode_line

        line = restart_levers_line(levers)
        if line:
            out.write(line + "\n")
        if args.run and not stages and runs[0].restart_mode:
            out.write(restart_mode_line(runs[0].restart_mode, runs[0].restart_reason) + "\n")
        if ledger is not None:
            write_goodput(ledger, out)
    return 0


def _pipeline(args: argparse.Namespace) -> list[RunRecord]:
    """The stages of the pipeline a local command names (jobs.pipeline); [] for a run."""
    if not args.run or getattr(args, "remote", None) is not None:
        return []
    from jobs.pipeline import find_pipeline

    return find_pipeline(args.run)


def cmd_list(args: argparse.Namespace, out: IO[str]) -> int:
    from jobs.errors import RunNotFoundError
    from jobs.records import load_record, read_index

    if args.remote is not None:  # that machine's own list
        from jobs.remote import host_remote, passthrough

        argv = ["list", "-n", str(args.n), *(["--json"] if args.json else [])]
        return passthrough(host_remote(args.remote, args.remote_python), argv, out)
    entries = list(reversed(read_index()))
    entries = _with_remote(entries, args.no_state)[: max(0, args.n)]
    states: dict[str, str] = {e["run_dir"]: e["state"] for e in entries if "state" in e}
    if not args.no_state and entries:
        records = []
        for e in entries:
            try:
                records.append(load_record(e["run_dir"]))
            except RunNotFoundError as exc:  # listed without a state
                if Path(e["run_dir"]).exists():  # damaged, not deleted: say so (one line)
                    print(f"jobs: warning: {exc}", file=sys.stderr)
                continue
        states.update(_run_states(records))
    if args.json:
        for e in entries:
            if e["run_dir"] in states:
                e["state"] = states[e["run_dir"]]
        out.write(json.dumps(entries, indent=1) + "\n")
        return 0
    width = max((len(str(e.get("run_id", "?"))) for e in entries), default=0)
    width = max(width, len("RUN"))
    if entries:
        state_title = "" if args.no_state else "STATE"
        out.write(
            f"{'RUN':<{width}}  {'JOB':<14} {'WHERE':<6} {state_title:<12} "
            f"{'SUBMITTED':<16}  RUN DIR\n"
        )
    else:
        print("jobs: no runs recorded yet (python -m jobs submit SPEC.yaml)", file=sys.stderr)
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(_number(e.get("submitted_at"))))
        state = "" if args.no_state else states.get(e["run_dir"], "?")
        out.write(
            f"{e.get('run_id', '?')!s:<{width}}  {e.get('job_id', '')!s:<14} "
            f"{e.get('executor', '')!s:<6} {state:<12} {when}  {e['run_dir']}\n"
        )
    return 0


def _with_remote(entries: list[dict[str, Any]], no_state: bool) -> list[dict[str, Any]]:
    """The runs recorded here beside the ones submitted to other machines (``--remote``), newest
    first; a remote run's state: one remote ``jobs list`` per host (ONE Slurm query there)."""
    from jobs.remote import read_remote_index, remote_states

    remote = read_remote_index()
    if not remote:
        return entries
    states = {} if no_state else remote_states(remote)
    for r in remote:
        entry: dict[str, Any] = {
            "run_id": r.run_id,
            "name": r.name,
            "job_id": r.job_id,
            "executor": r.remote.host,
            "submitted_at": r.submitted_at,
            "run_dir": f"{r.remote.host}:{r.run_dir}",
            "host": r.remote.host,
        }
        if r.run_dir in states:
            entry["state"] = states[r.run_dir]
        entries.append(entry)
    entries.sort(key=lambda e: -_number(e.get("submitted_at")))
    return entries


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _run_states(records: list[RunRecord]) -> dict[str, str]:
    """Per run dir: its state (an array: ``RUNNING 2/6``), from ONE Slurm query for all."""
    from cluster import ClusterError
    from jobs.monitor import states_many

    try:
        states = states_many(records, _client)
    except ClusterError as exc:
        print(f"jobs: no states (Slurm: {str(exc).splitlines()[0]})", file=sys.stderr)
        return {}
    from jobs.monitor import OTHER_CLUSTER

    out = {}
    for r in records:
        infos = [states[j] for j in r.job_ids() if j in states]
        if infos and all(i.reason.startswith(OTHER_CLUSTER) for i in infos):
            out[r.run_dir] = f"on {r.cluster}"  # another cluster's run: not asked, not UNKNOWN
            continue
        found = [i.state for i in infos]
        if not found:
            continue
        if len(found) == 1:
            out[r.run_dir] = found[0]
        else:
            top = max(set(found), key=lambda s: (s != "COMPLETED", found.count(s)))
            out[r.run_dir] = f"{top} {found.count(top)}/{len(found)}"
    return out


# -- logs / cancel ------------------------------------------------------------------------------
def _task_query(query: str, record: RunRecord) -> str | None:
    """``12_3`` (or ``local-9_3``) names one task of an array run."""
    return query if query in record.job_ids() and record.array_size is not None else None


def cmd_logs(args: argparse.Namespace, out: IO[str]) -> int:
    if (code := _remote(args, out)) is not None:
        return code
    from jobs.follow import follow
    from jobs.monitor import print_logs
    from jobs.records import find_run

    record = find_run(args.run)
    if args.rank < 0 or args.rank >= record.world_size:
        raise UsageError(f"logs: --rank {args.rank}: the job has ranks 0..{record.world_size - 1}")
    only = _task_query(args.run, record)
    if args.follow:
        return follow(record, _client, rank=args.rank, out=out, only=only, show_states=False)
    if not print_logs(record, args.rank, only, out):
        print(
            f"jobs: no log yet for rank {args.rank} of {record.job_id} (is it still pending?)",
            file=sys.stderr,
        )
    return 0


def cmd_cancel(args: argparse.Namespace, out: IO[str]) -> int:
    stages = _pipeline(args)
    if not stages and (code := _remote(args, out)) is not None:
        return code
    from jobs.monitor import cancel
    from jobs.records import find_run

    if stages:  # a pipeline: every stage, the last first (each waits on the one before)
        for record in reversed(stages):
            done = cancel(record, _client)
            what = f"cancelled {', '.join(done)}" if done else "nothing running to cancel"
            out.write(f"{record.stage}: {what} ({record.run_id})\n")
        return 0
    record = find_run(args.run)
    done = cancel(record, _client, _task_query(args.run, record))
    if done:
        out.write(f"cancelled {', '.join(done)} ({record.run_id})\n")
    else:
        out.write(f"{record.run_id}: nothing running to cancel\n")
    return 0


def cmd_drill(args: argparse.Namespace, out: IO[str]) -> int:
    from jobs.drill import run_drill
    from jobs.remote import remote_run

    # a remote run's drill: its loop here, each action and read one short ssh command
    remote = remote_run(args)
    if remote is not None:
        from jobs.remotedrill import drill_remote

        report = drill_remote(
            remote,
            args.kind,
            timeout_s=args.timeout,
            partition=args.partition,
            progress=sys.stderr,
            accept_short_limit=args.accept_short_limit,
        )
    else:
        from jobs.records import find_run

        report = run_drill(
            find_run(args.run),
            _client(),
            args.kind,
            timeout_s=args.timeout,
            partition=args.partition,
            progress=sys.stderr,
            accept_short_limit=args.accept_short_limit,
        )
    if args.json:
        out.write(json.dumps(report.to_dict(), indent=1) + "\n")
    else:
        out.write("\n".join(report.lines()) + "\n")
    return 0


def cmd_plot(args: argparse.Namespace, out: IO[str]) -> int:
    if (code := _remote(args, out)) is not None:
        return code
    from jobs.plot import plot_run

    run_dir = Path(args.run)
    if not run_dir.is_dir():
        from jobs.records import find_run

        run_dir = Path(find_run(args.run).run_dir)
    from jobs.goodputview import dir_ledger

    ledger = dir_ledger(run_dir, _client)
    target = plot_run(run_dir, args.output or run_dir / "plot.png", ledger)
    out.write(f"{target}\n")
    return 0


COMMANDS = {
    "drill": cmd_drill,
    "plot": cmd_plot,
    "submit": cmd_submit,
    "status": cmd_status,
    "logs": cmd_logs,
    "cancel": cmd_cancel,
    "list": cmd_list,
    "login": cmd_login,
}


def console() -> int:
    """``slurm-train``: the console command (pyproject ``[project.scripts]``), the same commands.

    A console script puts its own folder, not the working directory, first on ``sys.path``: the
    user's ``train.py`` or ``jobs/`` there cannot stand in for ours (:mod:`train.safepath`).
    The collector is handled as in ``jobs/__main__.py`` (which says why).
    """
    gc.disable()
    code = main(prog="slurm-train")
    gc.freeze()
    return code


def main(
    argv: Sequence[str] | None = None,
    out: IO[str] | None = None,
    prog: str = "python -m jobs",
) -> int:
    """Run one command; return the exit code (never raises for expected failures)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    stream = out or sys.stdout
    try:
        args = build_parser(prog).parse_args(argv)
        if args.command == "drill" or getattr(args, "follow", False):
            gc.enable()  # runs for minutes or days: python -m jobs turned it off for start-up
        return COMMANDS[args.command](args, stream)
    except BadInputError as exc:  # the one bad-input signal, whichever package raised it
        if debug:
            raise
        print(str(exc) or type(exc).__name__, file=sys.stderr)
        return 2
    except JobsError as exc:
        if debug:
            raise
        print(str(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "interrupted (a submitted job keeps running: python -m jobs cancel RUN)",
            file=sys.stderr,
        )
        return 130
    except BrokenPipeError:
        return 1
    except Exception as exc:
        if debug:
            raise
        from cluster import ClusterError, SshError

        if isinstance(exc, SshError):  # ssh itself, not Slurm: what to do (jobs login HOST)
            print(f"jobs: {exc}", file=sys.stderr)
            return 1
        if isinstance(exc, ClusterError):
            print(f"slurm: {exc}", file=sys.stderr)
            return 1
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(
            f"internal error: {type(exc).__name__}: {first} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1


__all__ = ["InputError", "build_parser", "console", "main"]
