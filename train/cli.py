"""``python -m train --config SPEC.yaml [--set train.x=y ...] [--resume [PATH]] [--run-dir DIR]``.

``main(argv) -> int`` also runs in-process (``jobs.launch.TrainLaunch`` calls it inside the
allocation). Bad input (spec, ``--set``, inconsistent Slurm environment, missing data) prints
ONE line ``error: ...`` on stderr and returns 2; other failures print one line and return 1; the
traceback only with ``--debug``. A stop signal returns the requeue exit code (0 after
``scontrol requeue``, 75 for the batch script to requeue, 3 when the requeue budget is spent).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from cluster import BadInputError
from train.errors import ConfigError, TrainError
from train.runfiles import default_run_dir
from train.spec import load_run_config

if TYPE_CHECKING:
    from train.env import DistEnv

__all__ = ["build_parser", "main"]

log = logging.getLogger(__name__)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse prints usage + message and exits; we want one line and our exit code.
        raise ConfigError(f"{message} (see python -m train --help)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m train``."""
    p = _Parser(
        prog="python -m train",
        description="Train from a job spec's train/requeue/entrypoint sections (DDP on Slurm, "
        "torchrun or one process). Auto-resumes when SLURM_RESTART_COUNT > 0.",
    )
    p.add_argument("--config", required=True, metavar="SPEC.yaml", help="job spec YAML file")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec value, e.g. --set train.batch_size=128 (repeatable)",
    )
    p.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=None,
        metavar="PATH",
        help="resume from the newest valid checkpoint, or from PATH",
    )
    p.add_argument("--run-dir", metavar="DIR", help="run directory (overrides train.run_dir)")
    p.add_argument(
        "--allow-config-change",
        action="store_true",
        help="resume even though fields that alter training (optimizer, lr, schedule, batch "
        "size, seed, model, data, epochs, ...) differ from the checkpoint's config; the new "
        "values take effect and the run is no longer an exact resume",
    )
    p.add_argument("--debug", action="store_true", help="debug logging and tracebacks")
    return p


def _fail(exc: BaseException, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exception(exc)
    msg = str(exc).replace("\n", " ").strip() or type(exc).__name__
    if not isinstance(exc, (TrainError, BadInputError)):  # bad input's messages are the user's
        msg = f"{type(exc).__name__}: {msg}"
    print(f"error: {msg}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m train`` with ``argv``; returns the exit code (never raises for errors)."""
    from train.startup import mark

    mark("main")
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    run_dir: Path | None = None
    env: DistEnv | None = None
    previous: dict[signal.Signals, Any] = {}
    try:
        args = build_parser().parse_args(argv)
        config = load_run_config(args.config, args.set)
        mark("config")
        from train.stop import install_early

        # Before torch is imported (~1 s): a stop signal in that window is kept, not fatal.
        # The caller's handlers come back when main returns (it also runs in-process).
        names = (config.requeue.signal, "TERM")
        sigs = [getattr(signal, f"SIG{n}") for n in dict.fromkeys(names)]
        previous.update({s: signal.getsignal(s) for s in sigs})
        install_early(names)
        from train.env import DistEnv

        env = DistEnv.from_env(os.environ)
        env.export(os.environ)  # libraries that read RANK/WORLD_SIZE/... see the same answer
        run_dir = (
            Path(args.run_dir)
            if args.run_dir
            else default_run_dir(config.train.run_dir, env.job_id)
        )
        from train.logsetup import setup_logging

        setup_logging(env.rank, run_dir, debug=args.debug)
        if config.entrypoint is not None:
            from train.entry import run_entrypoint

            return run_entrypoint(
                config, env, run_dir, args.resume, allow_config_change=args.allow_config_change
            )
        from train.loop import describe_data, run_training
        from train.startup import ours_only

        mark("imports")
        ours_only()  # the built-in trainer: no user code in this process (train.startup)

        result = run_training(
            config.train,
            env,
            run_dir,
            resume=args.resume,
            requeue=config.requeue,
            allow_config_change=args.allow_config_change,
        )
        if env.is_main and result.exit_code == 0 and result.stopped is None:
            log.info(
                "done: %d steps, test accuracy %.2f%% on %s, %s img/s, run dir %s",
                result.steps,
                100 * (result.test_accuracy or 0.0),
                describe_data(config.train.data),
                f"{result.images_per_s:.0f}" if result.images_per_s else "n/a",
                run_dir,
            )
        return result.exit_code
    except TrainError as exc:
        _record_failure(exc, env, run_dir)
        # The one bad-input signal of every package (cluster.errors.BadInputError): exit 2.
        return _fail(exc, 2 if isinstance(exc, BadInputError) else 1, debug)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        _record_failure(exc, env, run_dir)
        # bad input outside train's tree too (train.runfiles.NotOursError: a folder not ours)
        return _fail(exc, 2 if isinstance(exc, BadInputError) else 1, debug)
    finally:
        for sig, handler in previous.items():
            if threading.current_thread() is threading.main_thread():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _record_failure(exc: BaseException, env: DistEnv | None, run_dir: Path | None) -> None:
    """Rank 0 appends a ``failure`` event (runtime failures only, not bad input)."""
    if run_dir is None or env is None or isinstance(exc, BadInputError):
        return
    if not env.is_main or not run_dir.is_dir():
        return
    try:
        from train.history import RunHistory

        RunHistory(run_dir).append(
            "failure",
            step=None,
            restart_count=env.restart_count,
            job_id=env.job_id,
            error=f"{type(exc).__name__}: {exc}"[:300],
        )
    except Exception as err:  # never mask the original error
        log.debug("could not record the failure event: %s", err)
