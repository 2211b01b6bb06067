"""``python -m train.hang``: the node's hang watcher process (:func:`train.hang.watcher.main`),
as :class:`train.hang.Watchdog` starts it.

Ours beside the user's processes (issue 46): before it imports anything more (its imports are
most of the CPU it takes at the ranks' start), it steps back (:func:`train.procfs.step_back`:
its nice, and the autogroup of the session it leads, started with ``start_new_session``). A
watcher waits seconds between its looks and minutes for a hang: what it does at a hang, with
the ranks silent, still gets the CPU at once.
"""

from __future__ import annotations

if __name__ == "__main__":
    import os
    import sys

    from train.procfs import session_is_ours, step_back

    step_back(session=session_is_ours(os.getpid()))
    from train.hang.watcher import main

    sys.exit(main())
