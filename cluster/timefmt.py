"""Slurm time strings (``--time``, ``MaxTime``, ``Elapsed``) to seconds and back.

Accepted as Slurm documents them: "minutes", "minutes:seconds", "hours:minutes:seconds",
"days-hours", "days-hours:minutes", "days-hours:minutes:seconds"; plus ``UNLIMITED``/``INFINITE``
(returned as ``None``). Standard library only. Digits are ASCII digits (``re.ASCII``, ``[0-9]``):
``"١٢"`` is not 12, and a number has at most 9 digits.
"""

from __future__ import annotations

import re

from cluster.errors import SlurmTimeError

_UNLIMITED = {"UNLIMITED", "INFINITE", "NONE"}
_NUM = r"([0-9]{1,9})"
_PATTERNS: list[tuple[re.Pattern[str], tuple[str, ...]]] = [
    (re.compile(rf"^{_NUM}$", re.ASCII), ("m",)),
    (re.compile(rf"^{_NUM}:{_NUM}$", re.ASCII), ("m", "s")),
    (re.compile(rf"^{_NUM}:{_NUM}:{_NUM}$", re.ASCII), ("h", "m", "s")),
    (re.compile(rf"^{_NUM}-{_NUM}$", re.ASCII), ("d", "h")),
    (re.compile(rf"^{_NUM}-{_NUM}:{_NUM}$", re.ASCII), ("d", "h", "m")),
    (re.compile(rf"^{_NUM}-{_NUM}:{_NUM}:{_NUM}$", re.ASCII), ("d", "h", "m", "s")),
]
_UNIT = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_FRACTION = re.compile(r"^[0-9-]*[0-9]+:[0-9:]+\.[0-9]+$", re.ASCII)

HINT = "use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, e.g. 30, 2:00:00 or 1-12:00:00"


def parse_slurm_time(value: str | int) -> int | None:
    """Seconds in a Slurm time string; ``None`` for UNLIMITED. Ints are minutes, as in Slurm."""
    if isinstance(value, bool):
        raise SlurmTimeError(f"not a Slurm time: {value!r} ({HINT})")
    if isinstance(value, int):
        if value < 0:
            raise SlurmTimeError(f"negative Slurm time: {value} ({HINT})")
        return value * 60
    text = value.strip()
    if not text.isascii():  # "ınfınıte".upper() is "INFINITE": compare ASCII only
        raise SlurmTimeError(f"not a Slurm time: {value!r} ({HINT})")
    if text.upper() in _UNLIMITED:
        return None
    # Slurm's Elapsed/Timelimit fields may carry fractional seconds in some versions.
    text = text.split(".", 1)[0] if _FRACTION.match(text) else text
    for pattern, units in _PATTERNS:
        m = pattern.match(text)
        if m:
            return sum(int(g) * _UNIT[u] for g, u in zip(m.groups(), units, strict=True))
    raise SlurmTimeError(f"not a Slurm time: {value!r} ({HINT})")


def format_slurm_time(seconds: int | None) -> str:
    """Canonical ``D-HH:MM:SS`` (or ``HH:MM:SS`` under a day); ``UNLIMITED`` for None."""
    if seconds is None:
        return "UNLIMITED"
    d, rem = divmod(int(seconds), 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"
