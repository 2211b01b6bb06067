"""Issue 46: our processes beside the user's command (its supervisor, the hang watcher) step
back for it (train.procfs.step_back): their nice, and the autogroup of a session that holds
only this task's processes (never a user's shell session)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from train.procfs import STEP_BACK_NICE

REPO = Path(__file__).resolve().parents[3]

_PROBE = r"""
import json, os
from train.procfs import session_is_ours, step_back, stepped_from
def autogroup():
    try:
        return int(open("/proc/self/autogroup").read().split()[-1])
    except (OSError, ValueError):
        return None
ours = session_is_ours(os.getpid())
before = (os.getpriority(os.PRIO_PROCESS, 0), autogroup())
step_back(session=ours)
after = (os.getpriority(os.PRIO_PROCESS, 0), autogroup())
print(json.dumps({"ours": ours, "before": before, "after": after, "from": stepped_from()}))
"""


def _probe(**popen: object) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-P", "-c", _PROBE], env=env, capture_output=True, text=True,
        timeout=60, check=True, **popen,  # type: ignore[call-overload]
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_a_process_leading_its_own_session_steps_back_with_its_autogroup() -> None:
    seen = _probe(start_new_session=True)
    assert seen["ours"] is True  # the session it leads holds nothing of anyone else's
    nice, group = seen["after"]
    before_nice, before_group = seen["before"]
    assert nice == max(before_nice, STEP_BACK_NICE)
    assert seen["from"] == (before_nice if before_nice < STEP_BACK_NICE else None)
    if before_group is not None:  # a kernel with autogroups
        assert group == max(before_group, STEP_BACK_NICE)


def test_a_session_shared_with_others_keeps_its_autogroup() -> None:
    # the test runner's session (a shell, pytest): not ours to slow down
    seen = _probe(start_new_session=False)
    assert seen["ours"] is False
    assert seen["after"][1] == seen["before"][1]
    assert seen["after"][0] == max(seen["before"][0], STEP_BACK_NICE)
