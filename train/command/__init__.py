"""The supervisor of the user's own program (``entrypoint.command``), torch-free: it starts the
command with the run's environment, watches its progress for the hang watchdog, hands it the
signal it saves on at a stop and goes through the one stop decision (:mod:`train.stop`).

Modules: :mod:`train.command.prestart` (the command started first, before the spec is read),
:mod:`train.command.supervisor` (the run: start, supervise, failures),
:mod:`train.command.stop` (what the supervisor does at a stop), :mod:`train.command.processes`
(the command's process tree, which signals it catches, its environment),
:mod:`train.command.selfrequeue` (its own ``scontrol requeue`` in a stop) and
:mod:`train.command.fastexit` (its interpreters' exit at a stop, ``boot/sitecustomize.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from train._lazy import lazy_exports

if TYPE_CHECKING:
    from train.command.prestart import (
        abandon_started_first,
        start_first,
        started_first,
        wait_behind,
    )
    from train.command.processes import StopPlan, child_environ, plan_stop, resolve_argv
    from train.command.supervisor import CommandRun, run_command

_EXPORTS = {
    "StopPlan": "processes",
    "child_environ": "processes",
    "plan_stop": "processes",
    "resolve_argv": "processes",
    "abandon_started_first": "prestart",
    "start_first": "prestart",
    "started_first": "prestart",
    "wait_behind": "prestart",
    "CommandRun": "supervisor",
    "run_command": "supervisor",
}
__all__ = [
    "CommandRun",
    "StopPlan",
    "abandon_started_first",
    "child_environ",
    "plan_stop",
    "resolve_argv",
    "run_command",
    "start_first",
    "started_first",
    "wait_behind",
]
__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
