"""train.procfs's process tree: walked down from the command through each thread's
``/proc/PID/task/TID/children`` (its cost grows with the command's processes, not the node's),
the same answer as reading every process's parent, which it falls back to where the kernel has
no ``children`` files."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from train.procfs import process_tree, scan_tree, walk_tree

# a parent whose child is started from a second thread (a thread's children are its own file)
_TREE = r"""
import subprocess, sys, threading, time
kids = []
t = threading.Thread(target=lambda: kids.append(subprocess.Popen(["sleep", "60"])))
t.start(); t.join()
kids.append(subprocess.Popen(["sh", "-c", "sleep 60 & wait"]))
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(walk_tree(os.getpid()) is None, reason="no /proc children files here")
def test_the_tree_walked_down_is_the_tree_read_from_every_parent() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        walked = walk_tree(proc.pid)
        while walked is not None and len(walked) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)  # sh starts its sleep after it was started itself
            walked = walk_tree(proc.pid)
        assert walked is not None and len(walked) == 4, walked  # it, sleep, sh, its sleep
        assert walked == scan_tree(proc.pid) == process_tree(proc.pid)
    finally:
        for pid in sorted(process_tree(proc.pid), reverse=True):
            if pid != proc.pid:
                os.kill(pid, 9)
        proc.kill()
        proc.wait()


def test_a_root_that_is_gone_is_itself_alone() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert process_tree(gone.pid) == {gone.pid: 0}


def test_without_children_files_every_parent_is_read(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid, parent in ((10, 1), (11, 10), (12, 11), (99, 1)):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "status").write_text(f"Name:\tx\nPPid:\t{parent}\n")
    assert walk_tree(10, proc) is None
    assert process_tree(10, proc) == {10: 0, 11: 10, 12: 11}
