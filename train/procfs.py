"""What ``/proc`` says about a process (torch-free, stdlib only, Linux; elsewhere nothing).

The one reader of ``/proc`` inside ``train/``: the command supervisor (:mod:`train.command`:
which signals its command catches, what it writes, its process tree) and the hang watcher
(:mod:`train.hang`: whether a rank is stopped, the processes of a hung command) ask here. Every
read survives a process that is gone or a ``/proc`` that says nothing: the answer is then empty.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["PROC", "describe_tree", "is_child", "proc_state", "process_tree", "status"]

PROC = Path("/proc")


def status(pid: int, proc: Path = PROC) -> dict[str, str]:
    """The fields of ``/proc/PID/status`` (``{}`` when the process is gone or /proc absent)."""
    try:
        text = (proc / str(pid) / "status").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def process_tree(root: int, proc: Path = PROC) -> dict[int, int]:
    """``{pid: parent}`` for ``root`` and all its descendants (``{root: 0}`` without /proc)."""
    parents: dict[int, int] = {}
    try:
        entries = [e for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return {root: 0}
    for entry in entries:
        parent = status(int(entry), proc).get("PPid", "")
        if parent.isdigit():
            parents[int(entry)] = int(parent)
    tree = {root: 0}
    grew = True
    while grew:  # descendants of descendants (a few passes: trees are shallow)
        grew = False
        for pid, ppid in parents.items():
            if ppid in tree and pid not in tree:
                tree[pid] = ppid
                grew = True
    return tree


def _stat_fields(pid: int) -> list[str]:
    """``/proc/PID/stat`` after the command name (state, parent, ...); [] when gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return []
    return stat.rsplit(")", 1)[-1].split()


def proc_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (``T``: stopped), None when it is gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def is_child(pid: int, parent: int) -> bool:
    """Whether ``pid`` is (still) a child of ``parent``: proof before a signal to its group."""
    fields = _stat_fields(pid)
    return len(fields) > 1 and fields[1] == str(parent)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


def describe_tree(root: int) -> list[str]:
    """State, wait channel, command line and kernel stack (where readable) of ``root`` and its
    descendants, one line each (the stack's frames indented below); [] when all are gone."""
    lines: list[str] = []
    for pid in sorted(process_tree(root)):
        proc = PROC / str(pid)
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        wchan = _read(proc / "wchan") or "-"
        lines.append(f"pid {pid} state {proc_state(pid)} wchan {wchan}: {cmdline.strip()}")
        stack = _read(proc / "stack")
        lines.extend(f"    {frame}" for frame in stack.splitlines() if frame.strip())
    return lines
