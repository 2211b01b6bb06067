"""What the Slurm release under test does where releases differ (README's release table), for
the integration tests to expect exactly that: a test asks here, never accepts either answer
where the release decides one."""

from __future__ import annotations

import os
from typing import Any

from cluster.local.release import HOST_RELEASE
from train.stop.facts import requeues_preempted


def preemption_requeue_via(client: Any) -> str:
    """The ``via`` of a preempted run's requeue event on ``client``'s cluster (a
    ``cluster.client.SlurmClient``): ``slurm`` where the release requeues a preempted job
    itself (24.11+: train.stop.facts.SELF_REQUEUE_RELEASE), else ``scontrol`` (ours)."""
    return "slurm" if requeues_preempted(client.limits().slurm_version) else "scontrol"


#: The release the test workers' clusters run (tests/conftest.py: SLURM_TRAIN_TEST_SLURM).
RELEASE = os.environ.get("SLURM_TRAIN_TEST_SLURM") or HOST_RELEASE


def restarts_after_a_self_requeue() -> list[int]:
    """The runs of a job whose own code requeued it in its preemption's grace time (Lightning's
    ``auto_requeue``: ``via: command``): one requeue, then on 24.11 the preemption's own
    requeue ends that next run too and a third follows (README's release table: "a job that
    requeues itself in its preemption's grace time"); the steps are all done either way."""
    return [0, 1, 2] if RELEASE == "24.11" else [0, 1]
