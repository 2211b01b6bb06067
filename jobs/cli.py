"""``python -m jobs``: submit, status, logs, cancel, list.

Exit codes: 0 ok, 2 bad input or usage, 1 anything else. Errors are one line on stderr (a spec
with several problems: one line each); ``--debug`` adds the traceback. Nothing here imports
torch; heavy modules are imported by the command that needs them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any, NoReturn

from jobs.errors import InputError, JobsError, UsageError

if TYPE_CHECKING:
    from cluster.client import SlurmClient
    from jobs.records import RunRecord


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m jobs", description="Submit and watch training jobs on Slurm.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    s = sub.add_parser("submit", help="validate a spec and submit it (prints the job id)")
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
    s.add_argument("--json", action="store_true", help="print the submission as JSON")
    s.add_argument(
        "--no-preflight", action="store_true", help="skip the checks against the live cluster"
    )
    s.add_argument(
        "--template",
        metavar="NAME",
        help="render sbatch_templates/NAME.sbatch instead of the submitit script",
    )
    s.add_argument(
        "--runs-dir", help="parent of run directories (default: $SLURM_TRAIN_RUNS_DIR or ./runs)"
    )

    st = sub.add_parser("status", help="state of a run (or of recent runs)")
    st.add_argument("run", nargs="?", help="run id, job id, name or run directory")
    st.add_argument("--json", action="store_true")

    lg = sub.add_parser("logs", help="print (or follow) the log of one rank")
    lg.add_argument("run", help="run id, job id (12 or 12_3), name or run directory")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    lg.add_argument("--rank", type=int, default=0, help="global rank (default 0)")

    c = sub.add_parser("cancel", help="cancel a run (scancel)")
    c.add_argument("run", help="run id, job id, name or run directory")

    ls = sub.add_parser("list", help="recorded runs, newest first (no cluster query)")
    ls.add_argument("-n", type=int, default=20, help="how many (default 20)")
    ls.add_argument("--json", action="store_true")
    for sp in (s, st, lg, c, ls):
        sp.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
    return p


def _client() -> SlurmClient:
    from cluster.client import SlurmClient

    return SlurmClient()


# -- submit -------------------------------------------------------------------------------------
def cmd_submit(args: argparse.Namespace, out: IO[str]) -> int:
    from jobs.records import runs_root

    if args.dry_run and args.follow:
        raise UsageError("submit: --dry-run and --follow do not go together")
    if args.dry_run and args.executor != "local" and not args.template:
        # The common edit-and-look loop: served from the validated-spec cache when unchanged.
        from jobs.drycache import dry_run

        out.write(dry_run(args.spec, args.overrides, runs_root(args.runs_dir)))
        return 0
    from jobs.load import load_spec
    from jobs.submit import make_plan

    loaded = load_spec(args.spec, args.overrides)
    plan = make_plan(loaded, runs_root(args.runs_dir))
    if args.template:
        return _submit_template(args, loaded, plan, out)
    executor = args.executor
    if args.dry_run:  # --executor local (the Slurm dry-run returned above)
        out.write(_local_plan(loaded, plan))
        return 0
    client = _client() if executor != "local" else None
    if executor == "auto":
        assert client is not None
        executor = "slurm" if client.installed() and client.ping() else "local"
        if executor == "local":
            print(
                "jobs: no Slurm cluster answers; running locally (--executor local)",
                file=sys.stderr,
            )
    if executor == "slurm":
        assert client is not None
        if not args.no_preflight:
            from jobs.preflight import preflight

            preflight(loaded.spec, client, loaded.where)
        from jobs.submit import submit_slurm

        record = submit_slurm(loaded, plan, client)
    else:
        from jobs.submit import submit_local

        record = submit_local(loaded, plan)
    _print_submitted(record, args.json, out)
    if args.follow:
        from jobs.monitor import follow

        return follow(record, _client, out=out)
    return 0


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


def _local_plan(loaded: Any, plan: Any) -> str:
    import shlex

    lines = [
        f"# local run: {plan.run_dir} (no Slurm); per task, rank r of {loaded.spec.world_size}:"
    ]
    for task in loaded.tasks:
        d = plan.task_dir(task.index if loaded.is_array else None)
        cmd = ["python", "-m", "train", "--config", str(d / "resolved.yaml"), "--run-dir", str(d)]
        lines.append(
            f"RANK=r WORLD_SIZE={loaded.spec.world_size} MASTER_ADDR=127.0.0.1 MASTER_PORT=<free> "
            + " ".join(shlex.quote(c) for c in cmd)
        )
    return "\n".join(lines) + "\n"


def _submit_template(args: argparse.Namespace, loaded: Any, plan: Any, out: IO[str]) -> int:
    from jobs.templates import render_template

    if not args.dry_run:
        raise UsageError(
            "submit: --template renders a plain sbatch script; use it with --dry-run "
            "and submit the script with sbatch"
        )
    out.write(render_template(args.template, loaded.spec, loaded.path))
    return 0


# -- status / list ------------------------------------------------------------------------------
def cmd_status(args: argparse.Namespace, out: IO[str]) -> int:
    from jobs.monitor import states_many
    from jobs.records import find_run, iter_records
    from jobs.statusview import status_json, write_status

    if args.run:
        runs = [find_run(args.run)]
    else:
        runs = [r for _, r in zip(range(20), iter_records(), strict=False)]
        if not runs:
            out.write("no runs recorded yet\n")
            return 0
    states = states_many(runs, _client)  # one sacct call for all of them
    if args.json:
        data = status_json(runs, states)
        out.write(json.dumps(data if not args.run else data[0], indent=1) + "\n")
    else:
        write_status(runs, states, out)
    return 0


def cmd_list(args: argparse.Namespace, out: IO[str]) -> int:
    from jobs.records import read_index

    entries = list(reversed(read_index()))[: max(0, args.n)]
    if args.json:
        out.write(json.dumps(entries, indent=1) + "\n")
        return 0
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.get("submitted_at") or 0))
        out.write(
            f"{e.get('run_id', '?'):<40} {e.get('job_id', ''):<14} {e.get('executor', ''):<6} "
            f"{when}  {e['run_dir']}\n"
        )
    return 0


# -- logs / cancel ------------------------------------------------------------------------------
def _task_query(query: str, record: RunRecord) -> str | None:
    """``12_3`` (or ``local-9_3``) names one task of an array run."""
    return query if query in record.job_ids() and record.array_size is not None else None


def cmd_logs(args: argparse.Namespace, out: IO[str]) -> int:
    from jobs.monitor import follow, print_logs
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
    from jobs.monitor import cancel
    from jobs.records import find_run

    record = find_run(args.run)
    done = cancel(record, _client, _task_query(args.run, record))
    if done:
        out.write(f"cancelled {', '.join(done)} ({record.run_id})\n")
    else:
        out.write(f"{record.run_id}: nothing running to cancel\n")
    return 0


COMMANDS = {
    "submit": cmd_submit,
    "status": cmd_status,
    "logs": cmd_logs,
    "cancel": cmd_cancel,
    "list": cmd_list,
}


def main(argv: Sequence[str] | None = None, out: IO[str] | None = None) -> int:
    """Run one command; return the exit code (never raises for expected failures)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    stream = out or sys.stdout
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args, stream)
    except JobsError as exc:
        if debug:
            raise
        print(str(exc), file=sys.stderr)
        return exc.exit_code
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
        from cluster.errors import ClusterError

        if isinstance(exc, ClusterError):
            print(f"slurm: {exc}", file=sys.stderr)
            return 2 if isinstance(exc, ValueError) else 1
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(
            f"internal error: {type(exc).__name__}: {first} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1


__all__ = ["InputError", "build_parser", "main"]
