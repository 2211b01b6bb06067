"""Slurm hostlist expressions, expanded the way Slurm writes them.

``n[1-2]`` -> n1 n2; ``gpu-a[01-03,07],gpu-b7`` -> gpu-a01 gpu-a02 gpu-a03 gpu-a07 gpu-b7.
Zero padding is kept (the width of the lower bound), several bracket groups in one name are
expanded as a cartesian product, as ``scontrol show hostnames`` does. Standard library only.
"""

from __future__ import annotations

from cluster.errors import HostlistError


def _split_top_level(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' in hostlist {expr!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in hostlist {expr!r}")
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth != 0:
        raise HostlistError(f"unbalanced '[' in hostlist {expr!r}")
    parts.append(expr[start:])
    return parts


def _expand_range(spec: str, expr: str) -> list[str]:
    out: list[str] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            raise HostlistError(f"empty range in hostlist {expr!r}")
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise HostlistError(f"bad range {item!r} in hostlist {expr!r}")
        if not sep:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a:
            raise HostlistError(f"descending range {item!r} in hostlist {expr!r}")
        if b - a > 100_000:
            raise HostlistError(f"range {item!r} too large in hostlist {expr!r}")
        width = len(lo)
        out.extend(str(n).zfill(width) for n in range(a, b + 1))
    return out


def _expand_one(name: str, expr: str) -> list[str]:
    i = name.find("[")
    if i < 0:
        if "]" in name:
            raise HostlistError(f"unbalanced ']' in hostlist {expr!r}")
        return [name]
    j = name.find("]", i)
    if j < 0:
        raise HostlistError(f"unbalanced '[' in hostlist {expr!r}")
    prefix, rng, rest = name[:i], name[i + 1 : j], name[j + 1 :]
    tails = _expand_one(rest, expr)
    return [f"{prefix}{n}{t}" for n in _expand_range(rng, expr) for t in tails]


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist expression into host names, in order.

    Raises :class:`HostlistError` for malformed input. Empty input gives an empty list.
    """
    expr = expr.strip()
    if not expr:
        return []
    hosts: list[str] = []
    for part in _split_top_level(expr):
        part = part.strip()
        if not part:
            raise HostlistError(f"empty host name in hostlist {expr!r}")
        hosts.extend(_expand_one(part, expr))
    return hosts


def expand_ranges(spec: str) -> list[str]:
    """Expand a bracket body such as ``0-3,7`` (array task ids use the same grammar)."""
    return _expand_range(spec, spec)


def first_host(expr: str) -> str:
    """The first host of a hostlist (Slurm's choice of master for a step)."""
    hosts = expand_hostlist(expr)
    if not hosts:
        raise HostlistError("empty hostlist")
    return hosts[0]
