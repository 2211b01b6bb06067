"""How a run ends on the real local cluster (issue 44): what Slurm says is what happened.

- Item 2: rank 1's task is killed (as by the OOM killer in teardown) after rank 0 recorded the
  run complete: the job ends COMPLETED (the batch script asks train.stop.step, which knows what
  a completed run is), not FAILED.
- Item 10: Slurm refuses the ranks' ``scontrol requeue`` (the controller unreachable for a
  moment: a ``scontrol`` that fails its first two requeues): the batch script retries it, the
  job comes back and completes, and ``events.jsonl`` says what happened (``requeue_failed`` by
  the rank, then ``requeue`` by the batch script), never a requeue that did not happen.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.local.release import HOST_RELEASE

sys.path.insert(0, str(Path(__file__).parent))
from byo_helpers import ByoRun, open_run

pytestmark = pytest.mark.integration

#: The release under test (SLURM_TRAIN_TEST_SLURM): another release's commands reach it from
#: this machine through wrappers (tests/conftest.py), its jobs run inside its root
_RELEASE = os.environ.get("SLURM_TRAIN_TEST_SLURM") or HOST_RELEASE


@pytest.fixture
def run(slurm_env: dict[str, str], slurm_client: Any, tmp_path: Path) -> Iterator[ByoRun]:
    yield from open_run(slurm_env, slurm_client, tmp_path)


def _spec(name: str, argv: list[str], nodes: int = 1, **variables: str) -> dict[str, Any]:
    return {
        "name": name,
        "resources": {"partition": "debug", "nodes": nodes, "cpus_per_task": 1, "time": "00:10:00"},
        "environment": {"variables": {"OMP_NUM_THREADS": "1", **variables}},
        "entrypoint": {"command": argv},
    }


DIES_AFTER_COMPLETE = """\
import os, signal, sys, time
from pathlib import Path

if os.environ["RANK"] == "0":
    sys.exit(0)  # rank 0's supervisor records the run complete
events = Path(os.environ["RUN_DIR"]) / "events.jsonl"
deadline = time.time() + 60
while time.time() < deadline:
    if events.exists() and '"complete"' in events.read_text():
        os.kill(os.getppid(), signal.SIGKILL)  # rank 1's task killed in its teardown
        sys.exit(0)
    print("waiting for rank 0", flush=True)
    time.sleep(0.2)
sys.exit(1)
"""


@pytest.mark.long(40)
def test_a_rank_killed_after_rank_0_completed_the_run_ends_completed(run: ByoRun) -> None:
    script = run.tmp / "dies_after_complete.py"
    script.write_text(DIES_AFTER_COMPLETE)
    run.submit(_spec("complete-then-killed", ["python", str(script)], nodes=2))
    assert run.wait_final(timeout=90) == "COMPLETED", run.log()
    names = [e["event"] for e in run.events()]
    assert names == ["start", "complete"], names  # no failure, no requeue, no restart in place
    assert "after rank 0 completed the run: the run is complete" in run.log(), run.log()
    assert run.client.show_job(run.job_id).get("Restarts") == "0"


SAVES_ON_USR2 = """\
import os, signal, sys, time

if int(os.environ.get("TRAIN_RESTART_COUNT", "0")) > 0:
    print("resumed: done", flush=True)
    sys.exit(0)
stop = []
signal.signal(signal.SIGUSR2, lambda *_: stop.append(1))
while not stop:
    print("training", flush=True)
    time.sleep(0.2)
time.sleep(1.0)  # "saves", then exits: after its supervisor has seen the stop too
sys.exit(0)
"""

REFUSING_SCONTROL = """\
#!/bin/sh
# the controller unreachable for a moment: the first two requeues are refused
if [ "$1" = requeue ]; then
  n=$(cat {count} 2>/dev/null || echo 0)
  n=$((n + 1))
  echo "$n" > {count}
  if [ "$n" -le 2 ]; then
    echo "scontrol: error: Unable to contact slurm controller (connect failure)" >&2
    exit 1
  fi
fi
exec {real} "$@"
"""


@pytest.mark.long(60)
def test_a_requeue_slurm_refuses_is_retried_by_the_batch_script(run: ByoRun) -> None:
    # the scontrol the job itself runs: the host's, or inside another release's root (where its
    # nodes and their jobs run) that root's own; the wrapper on this machine's PATH is not there
    real = shutil.which("scontrol", path=run.env.get("PATH"))
    if _RELEASE != HOST_RELEASE:
        real = "/usr/bin/scontrol"
    assert real is not None
    fake = run.tmp / "bin"
    fake.mkdir()
    count = run.tmp / "requeues"
    (fake / "scontrol").write_text(REFUSING_SCONTROL.format(count=count, real=real))
    (fake / "scontrol").chmod(0o755)
    path = f"{fake}{os.pathsep}{run.env.get('PATH', os.environ.get('PATH', ''))}"
    script = run.tmp / "saves_on_usr2.py"
    script.write_text(SAVES_ON_USR2)
    run.submit(_spec("requeue-refused", ["python", str(script)], PATH=path))
    run.wait("the command to run", lambda: "training" in run.log(), 60)
    run.client.cancel([run.job_id], signal="USR2")  # a stop while the job runs on: requeue
    run.release_when_requeued(timeout=60)
    assert run.wait_final(timeout=90) == "COMPLETED", run.log()
    events = run.events()
    got = [(e["event"], e.get("via") or e.get("by")) for e in events]
    assert got[1:4] == [("preempted", None), ("requeue_failed", "rank"),
                        ("requeue", "batch_script")], got  # fmt: skip
    assert got[-1] == ("complete", None), got
    assert count.read_text().strip() == "3"  # the rank's try, the script's refused one, taken
    assert run.client.show_job(run.job_id).get("Restarts") == "1"


# Round 2 item 1: a command that saves on the signal and exits 0 AT ONCE (no pause for its
# supervisor): seen recorded `complete` after USR2, the job then ended with its work left.
SAVES_AND_EXITS_AT_ONCE = """\
import os, signal, sys, time

if int(os.environ.get("TRAIN_RESTART_COUNT", "0")) > 0:
    print("resumed: done", flush=True)
    sys.exit(0)
def save(signum, frame):
    print("saved on", signal.Signals(signum).name, flush=True)
    sys.exit(0)
signal.signal(signal.SIGUSR2, save)
signal.signal(signal.SIGTERM, save)
while True:
    print("training", flush=True)
    time.sleep(0.2)
"""


@pytest.mark.long(60)
@pytest.mark.parametrize("sig", ["USR2", "TERM"])
def test_a_command_that_saves_on_the_stop_signal_is_requeued_not_completed(
    run: ByoRun, sig: str
) -> None:
    """USR2 (item 1: exit 0 the moment the signal arrives is a stop, not the run's end) and an
    operator's ``scancel --signal=TERM`` (item 2: under the in-place batch script, with no rank's
    command failed, a stop saved and requeued, not the step ending): both requeued, resumed,
    COMPLETED."""
    script = run.tmp / "saves_at_once.py"
    script.write_text(SAVES_AND_EXITS_AT_ONCE)
    run.submit(_spec(f"saves-on-{sig.lower()}", ["python", str(script)]))
    run.wait("the command to run", lambda: "training" in run.log(), 60)
    run.client.cancel([run.job_id], signal=sig)
    run.release_when_requeued(timeout=60)
    assert run.wait_final(timeout=90) == "COMPLETED", run.log()
    names = [e["event"] for e in run.events()]
    assert names[:3] == ["start", "preempted", "requeue"], names
    assert "complete" not in names[:3] and names[-1] == "complete", names
    assert run.client.show_job(run.job_id).get("Restarts") == "1"
