"""Hostlist expansion as Slurm writes it, on a table (``scontrol show hostnames`` semantics)."""

from __future__ import annotations

import pytest

from cluster.errors import HostlistError
from cluster.hostlist import expand_hostlist, expand_ranges, first_host


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("n1", ["n1"]),
        ("n[1-2]", ["n1", "n2"]),
        ("n1,n2", ["n1", "n2"]),
        ("gpu-a[01-03,07],gpu-b7", ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a07", "gpu-b7"]),
        ("node[001-003]", ["node001", "node002", "node003"]),
        ("node[8-11]", ["node8", "node9", "node10", "node11"]),
        ("node[098-101]", ["node098", "node099", "node100", "node101"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("a[1],b[2-3]c", ["a1", "b2c", "b3c"]),
        ("host-with.dots[1-2]", ["host-with.dots1", "host-with.dots2"]),
        ("", []),
        ("  n[1-2]  ", ["n1", "n2"]),
    ],
)
def test_expand(expr: str, hosts: list[str]) -> None:
    assert expand_hostlist(expr) == hosts


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("n[1-2", "unbalanced '\\['"),
        ("n1-2]", "unbalanced '\\]'"),
        ("n[2-1]", "descending range"),
        ("n[a-b]", "bad range"),
        ("n[1-2],,n3", "empty host name"),
        ("n[[1]]", "nested"),
        ("n[]", "empty range"),
    ],
)
def test_malformed(expr: str, message: str) -> None:
    with pytest.raises(HostlistError, match=message):
        expand_hostlist(expr)


def test_first_host_and_ranges() -> None:
    assert first_host("gpu-b[3-4],gpu-a1") == "gpu-b3"
    assert expand_ranges("0-3,7") == ["0", "1", "2", "3", "7"]
    with pytest.raises(HostlistError):
        first_host("")
