"""TensorBoard and ``jobs plot`` of a job preempted twice on the real local Slurm c.

The job (``srun python -m train``, ``--requeue``, USR2 before the limit) is preempted twice by a
job in ``urgent`` on its node, requeues itself each time and completes. Then the event files in
``RUN_DIR/tensorboard`` are read with TensorBoard's own reader: every tag's steps are strictly
increasing with no gap beyond the log interval, and each resume is there; ``python -m jobs
plot`` draws the run into a valid PNG. Every job submitted here is cancelled at the end.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tensorboard.backend.event_processing import event_accumulator

from cluster.hostlist import expand_hostlist
from jobs.cli import main as jobs_main
from train.history import RunHistory

sys.path.insert(0, str(Path(__file__).parent))
from slow_saves import slow_steps
from test_preemption import SPEC, Cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LOG_INTERVAL = 20


@pytest.fixture
def slurm(slurm_client: Any, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(slurm_client, tmp_path)
    yield c
    c.cancel_all()


def _count(run_dir: Path, name: str) -> int:
    return sum(e["event"] == name for e in RunHistory(run_dir).events())


def _preempt(c: Cluster, job_id: str, run_dir: Path, nth: int) -> None:
    """Preempt the job once it trains after its ``nth - 1``-th resume; wait for the requeue."""
    metrics = run_dir / "metrics.jsonl"
    seen = metrics.stat().st_size if metrics.exists() else 0
    c.wait(
        f"training before preemption {nth}",
        lambda: (
            _count(run_dir, "resume") >= nth - 1
            and metrics.exists()
            and metrics.stat().st_size > seen
        ),
        240,
    )
    c.submit_urgent(expand_hostlist(c.job(job_id).get("NodeList", "n1"))[0])
    c.wait(
        f"the requeue after preemption {nth}",
        lambda: _count(run_dir, "requeue") >= nth or _count(run_dir, "budget_exhausted") > 0,
        180,
    )


@pytest.mark.long(60)
def test_preempted_twice_tensorboard_steps_once_in_order_and_plot(
    slurm: Cluster, tmp_path: Path
) -> None:
    c = slurm
    spec: dict[str, Any] = yaml.safe_load(yaml.safe_dump(SPEC))
    spec["train"]["log_interval"] = LOG_INTERVAL
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    run_dir = tmp_path / "run"
    # steps paced until the second preemption is done: unpaced, the resumed attempt trained
    # its last 64 steps in 2 s and ended before the second preemption reached it
    pace = tmp_path / "pace"
    job_id = c.submit_training(spec_path, run_dir, ["--time=10"], env=slow_steps(0.1, pace))
    _preempt(c, job_id, run_dir, 1)
    _release_until_resumed(c, job_id, run_dir, 1)
    _preempt(c, job_id, run_dir, 2)
    pace.unlink()
    c.run_to_completion(job_id, run_dir, 400)

    assert _count(run_dir, "preempted") >= 2 and _count(run_dir, "resume") >= 2
    acc = event_accumulator.EventAccumulator(
        str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0}
    )
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for tag in ("train/loss", "train/accuracy", "train/lr", "test/accuracy"):
        assert tag in tags, tags
        steps = [e.step for e in acc.Scalars(tag)]
        assert steps and all(b > a for a, b in itertools.pairwise(steps)), (tag, steps)
        if tag.startswith("train/"):
            gaps = [b - a for a, b in itertools.pairwise(steps)]
            assert max(gaps) <= LOG_INTERVAL, (tag, steps)
    resumed = [e.step for e in acc.Scalars("run/resumed_from")]
    resumes = [e["step"] for e in RunHistory(run_dir).events() if e["event"] == "resume"]
    assert resumed == resumes and len(resumed) >= 2

    out = tmp_path / "life.png"
    assert jobs_main(["plot", str(run_dir), "-o", str(out)], out=io.StringIO()) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def _release_until_resumed(c: Cluster, job_id: str, run_dir: Path, n: int) -> None:
    """Release the requeued job (held in BeginTime) until it has resumed ``n`` times."""
    deadline = time.monotonic() + 240
    while _count(run_dir, "resume") < n:
        info = c.job(job_id)
        if info.get("JobState") == "PENDING" and info.get("Reason") == "BeginTime":
            time.sleep(8)  # let the node clean up the last run (see run_to_completion)
            with contextlib.suppress(Exception):  # it may just have changed state
                c.client.release(job_id)
        assert time.monotonic() < deadline, c.log()
        time.sleep(1)
