"""``python -m train``: parse and delegate to :func:`train.cli.main`."""

from __future__ import annotations

import sys

from train.cli import main

if __name__ == "__main__":
    sys.exit(main())
