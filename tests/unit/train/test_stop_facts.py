"""train/stop/facts.py's one-question cache: a stop asks ``scontrol show job`` once, and the
cache is a :class:`cluster.JobQueries` by what it defines, not by forwarding every name."""

from __future__ import annotations

from cluster.models import Node, Partition
from train.stop.facts import AskedOnce, node_failure, preemption_grace_s


class CountingSlurm:
    """The three questions a stop asks, counted."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def show_job(self, job_id: str) -> dict[str, str]:
        self.calls.append(f"show_job {job_id}")
        return {"JobState": "RUNNING", "Partition": "debug", "Restarts": "0"}

    def partition(self, name: str) -> Partition | None:
        self.calls.append(f"partition {name}")
        return Partition(
            name=name,
            default=True,
            max_time_s=None,
            nodes=("n1",),
            state="UP",
            preempt_mode="REQUEUE",
            priority_tier=1,
            total_cpus=2,
            grace_time_s=20,
        )

    def nodes(self) -> list[Node]:
        self.calls.append("nodes")
        return []

    def requeue(self, job_id: str) -> None:  # not a question: the cache must not pass it on
        self.calls.append(f"requeue {job_id}")


def test_one_show_job_per_stop_for_every_question() -> None:
    slurm = CountingSlurm()
    asked = AskedOnce(slurm)
    assert node_failure("7", 0, ["n1"], asked) is None
    assert preemption_grace_s("7", asked) == 20
    assert asked.cached("7") == slurm.show_job("7")
    assert slurm.calls.count("show_job 7") == 2  # once through the cache, once by the test
    assert "partition debug" in slurm.calls


def test_the_cache_answers_only_what_it_defines() -> None:
    asked = AskedOnce(CountingSlurm())
    assert not hasattr(asked, "requeue")  # no __getattr__ passing every name through
    assert asked.cached("8") is None
