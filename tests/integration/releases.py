"""What the Slurm release under test does where releases differ (README's release table), for
the integration tests to expect exactly that: a test asks here, never accepts either answer
where the release decides one."""

from __future__ import annotations

from typing import Any

from train.stop.facts import requeues_preempted


def preemption_requeue_via(client: Any) -> str:
    """The ``via`` of a preempted run's requeue event on ``client``'s cluster (a
    ``cluster.client.SlurmClient``): ``slurm`` where the release requeues a preempted job
    itself (24.11+: train.stop.facts.SELF_REQUEUE_RELEASE), else ``scontrol`` (ours)."""
    return "slurm" if requeues_preempted(client.limits().slurm_version) else "scontrol"
