"""Log lines with the rank in them, to stderr and ``RUN_DIR/logs/rank-R.log`` (torch-free:
``python -m train`` sets logging up before it knows whether torch is needed at all; a command's
supervisor never imports it)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TextIO

from train.runfiles import LOGS, make_dirs, open_text

__all__ = ["setup_logging"]


class _RunLog(logging.StreamHandler):
    """``logging.FileHandler`` that never opens through a link planted in the run directory
    (:func:`train.runfiles.open_text`, appending) and closes its file with itself."""

    def __init__(self, path: Path) -> None:
        super().__init__(open_text(path, "a"))

    def close(self) -> None:
        self.acquire()
        try:
            if not self.stream.closed:  # closed already (logging.shutdown, a second close)
                self.flush()
                self.stream.close()
        finally:
            self.release()
            super().close()


def setup_logging(
    rank: int, run_dir: Path | None = None, *, debug: bool = False, stream: TextIO | None = None
) -> None:
    """Log lines ``TIME [rank R] LEVEL name: message`` to stderr and ``RUN_DIR/logs/rank-R.log``.

    Replaces handlers this function installed before (safe to call again in one process).
    """
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_train_handler", False):
            root.removeHandler(h)
            h.close()
    fmt = logging.Formatter(
        f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s", "%H:%M:%S"
    )
    handlers: list[logging.Handler] = [logging.StreamHandler(stream or sys.stderr)]
    if run_dir is not None:
        logs = make_dirs(run_dir, LOGS)  # never through a planted link
        handlers.append(_RunLog(logs / f"rank-{rank}.log"))
    for h in handlers:
        h.setFormatter(fmt)
        h._train_handler = True  # type: ignore[attr-defined]
        root.addHandler(h)
    root.setLevel(logging.DEBUG if debug else logging.INFO)
