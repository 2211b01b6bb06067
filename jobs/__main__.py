"""``python -m jobs``: see :mod:`jobs.cli`."""

from __future__ import annotations

from jobs.cli import main

raise SystemExit(main())
