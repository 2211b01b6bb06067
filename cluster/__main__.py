"""``python -m cluster up|down|status``: the local dev cluster."""

from __future__ import annotations

import sys

from cluster.cli import main

if __name__ == "__main__":
    sys.exit(main())
