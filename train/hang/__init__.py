"""The hang watchdog, torch-free: heartbeats of the ranks (:mod:`train.hang.heartbeat`) and the
watcher process that tells a hang from a slow step and hands it to the one stop decision
(:mod:`train.hang.watcher`). The protocol is drawn in :mod:`train.hang.heartbeat`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from train._lazy import lazy_exports

if TYPE_CHECKING:
    from train.hang.heartbeat import Heartbeat, Watchdog, auto_timeout, start_watchdog

_EXPORTS = {
    "Heartbeat": "heartbeat",
    "Watchdog": "heartbeat",
    "auto_timeout": "heartbeat",
    "start_watchdog": "heartbeat",
}
__all__ = [
    "Heartbeat",
    "Watchdog",
    "auto_timeout",
    "start_watchdog",
]
__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
