"""Pipelines of stages (jobs.pipeline, issue 48): loading, references between stages, the
stages queued with dependencies, one name for status and cancel, and what a stage's end does
to the stages waiting on it (jobs.dependents)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from cluster.client import SlurmClient
from cluster.models import JobInfo
from jobs import records
from jobs.cli import main
from jobs.dependents import release_dependents, unfinished
from jobs.pipeline import find_pipeline, load_pipeline, submit_pipeline
from jobs.records import RunRecord
from train.history import RunHistory

REPO = Path(__file__).resolve().parents[3]
STAGE = "resources: {partition: debug, nodes: 1, ntasks_per_node: 1}\ntrain: {max_steps: 5}\n"
PIPELINE = """\
name: pipe
stages:
  - name: train
    spec: train.yaml
    set: [train.max_steps=7]
  - name: eval
    after: ok
    spec:
      entrypoint: {command: [python, eval.py, --ckpt, "${stages.train.checkpoint}",
                             --dir, "${stages.train.run_dir}"]}
"""


def _write(tmp_path: Path, text: str = PIPELINE) -> Path:
    (tmp_path / "train.yaml").write_text(f"name: t\n{STAGE}")
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return path


def test_stages_load_with_references_to_earlier_stages(tmp_path: Path) -> None:
    _, stages = load_pipeline(_write(tmp_path))
    assert [s.stage.name for s in stages] == ["train", "eval"]
    assert stages[0].loaded.spec.name == "pipe-train" and stages[1].loaded.spec.name == "pipe-eval"
    assert stages[0].loaded.spec.train is not None
    assert stages[0].loaded.spec.train.max_steps == 7
    command = stages[1].loaded.spec.entrypoint.command  # type: ignore[union-attr]
    assert command == ["python", "eval.py", "--ckpt", "${STAGE_TRAIN_CHECKPOINT}",
                       "--dir", "${STAGE_TRAIN_RUN_DIR}"]  # fmt: skip
    assert stages[1].refs == ("train",)


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        ("${stages.eval.checkpoint}", "of an earlier stage (train)"),
        ("${stages.nope.run_dir}", "of an earlier stage (train)"),
        ("${stages.train.weights}", "FIELD one of checkpoint, run_dir"),
    ],
)
def test_a_reference_to_no_earlier_stage_is_one_line(
    tmp_path: Path, ref: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = PIPELINE.replace("${stages.train.checkpoint}", ref)
    assert main(["submit", str(_write(tmp_path, text)), "--dry-run"], io.StringIO()) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pipeline.yaml:9:7: stages.1.spec: " in err[0] and says in err[0]


def test_a_bad_reference_names_the_stage_and_the_field(tmp_path: Path) -> None:
    from jobs.errors import SpecError

    text = PIPELINE.replace("${stages.train.checkpoint}", "${stages.eval.checkpoint}")
    with pytest.raises(SpecError, match=r"pipeline.yaml:9:7: stages.1.spec: \$\{stages.eval"):
        load_pipeline(_write(tmp_path, text))


def test_the_example_pipeline_dry_runs_every_stage(tmp_path: Path) -> None:
    out = io.StringIO()
    code = main(["submit", str(REPO / "examples" / "pipeline.yaml"), "--dry-run",
                 "--runs-dir", str(tmp_path)], out)  # fmt: skip
    assert code == 0
    text = out.getvalue()
    assert "# ==== stage train\n" in text
    assert "# ==== stage eval (after the stage before: ok)" in text
    assert "trap stage_end EXIT" in text.split("# ==== stage eval")[0]
    assert "-m train.checkpoint.dirs" in text.split("# ==== stage eval")[1]


def test_stages_are_queued_one_after_the_other(tmp_path: Path, stub_slurm: Path) -> None:
    stages = submit_pipeline(_write(tmp_path), [], SlurmClient(), tmp_path / "runs",
                             preflight=False)  # fmt: skip
    assert [(r.stage, r.job_id) for r in stages] == [("train", "4242"), ("eval", "4243")]
    assert stages[0].pipeline == stages[1].pipeline and stages[0].pipeline.startswith("pipe-")
    args = (stub_slurm / "sbatch-args-1.txt").read_text().split()
    assert "--dependency=afterok:4242" in args
    first = records.load_record(stages[0].run_dir)
    assert first.dependents == ["4243"] and first.dependents_after == "ok"
    script = (stub_slurm / "submitted-1.sh").read_text()
    assert f"export STAGE_TRAIN_RUN_DIR={stages[0].run_dir}" in script
    assert "-m train.checkpoint.dirs" in script
    assert [r.stage for r in find_pipeline("pipe")] == ["train", "eval"]
    assert [r.stage for r in find_pipeline(stages[0].pipeline)] == ["train", "eval"]
    assert find_pipeline("pipe-train") == [] and find_pipeline("nothing") == []


class StateClient:
    def __init__(self, states: dict[str, str]) -> None:
        self.states = states
        self.cancelled: list[str] = []
        self.dependencies: list[tuple[str, str]] = []

    def poll_states(self, ids: list[str]) -> dict[str, JobInfo]:
        return {j: JobInfo(j, s) for j, s in self.states.items() if j in ids}

    def cancel(self, ids: list[str], *, no_requeue: bool = False) -> None:
        self.cancelled.extend(ids)

    def set_dependency(self, job_id: str, dependency: str) -> None:
        self.dependencies.append((job_id, dependency))

    def cluster_name(self) -> str:
        return ""


def test_status_and_cancel_take_the_pipelines_name(
    tmp_path: Path, stub_slurm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    submit_pipeline(_write(tmp_path), [], SlurmClient(), tmp_path / "runs", preflight=False)
    client = StateClient({"4242": "RUNNING", "4243": "PENDING"})
    monkeypatch.setattr("jobs.cli._client", lambda: client)
    out = io.StringIO()
    assert main(["status", "pipe", "--json"], out) == 0
    rows = json.loads(out.getvalue())
    assert [r["tasks"][0]["state"] for r in rows] == ["RUNNING", "PENDING"]
    out = io.StringIO()
    assert main(["cancel", "pipe"], out) == 0
    assert client.cancelled == ["4243", "4242"]
    assert out.getvalue().splitlines()[0].startswith("eval: cancelled 4243")


def _events(*kinds: str, **fields: Any) -> list[dict[str, Any]]:
    return [{"event": k, **fields} for k in kinds]


@pytest.mark.parametrize(
    ("events", "why"),
    [
        (_events("start", "checkpoint", "complete"), None),
        (_events("start", "preempted", "requeue", "resume"), None),
        (_events("start", "preempted", "requeue"), None),
        (_events("start", "failure", "budget_exhausted", reason="failure 4x"), "failure 4x"),
        (_events("start", "cancelled"), "cancelled"),
        (_events("start", "preempted", "chain_ended", reason="no progress"), "no progress"),
    ],
)
def test_when_a_stage_is_over_without_completing(
    events: list[dict[str, Any]], why: str | None
) -> None:
    assert unfinished(events) == why


def _stage(tmp_path: Path, **more: Any) -> RunRecord:
    nxt = tmp_path / "next"
    nxt.mkdir()
    records.save_record(RunRecord("p-eval-1", "p-eval", str(nxt), "slurm", job_id="9"))
    records.append_index(records.load_record(nxt))
    return RunRecord("p-train-1", "p-train", str(tmp_path), "slurm", job_id="8", stage="train",
                     dependents=["9"], dependents_after="ok", **more)  # fmt: skip


def test_a_stage_over_without_completing_cancels_the_next_with_its_reason(tmp_path: Path) -> None:
    client = StateClient({})
    release_dependents(_stage(tmp_path), "8", False, "failure 4x", client)  # type: ignore[arg-type]
    assert client.cancelled == ["9"]
    cancelled = RunHistory(tmp_path / "next").events()[-1]
    assert cancelled["event"] == "cancelled"
    assert cancelled["reason"] == "stage train ended without completing: failure 4x"


def test_a_completed_chain_stage_points_the_next_at_the_link_that_completed(
    tmp_path: Path,
) -> None:
    client = StateClient({})
    chained = _stage(tmp_path, chain_job_ids=["8", "10", "11"])
    release_dependents(chained, "10", True, None, client)  # type: ignore[arg-type]
    assert client.dependencies == [("9", "afterok:10")] and client.cancelled == []
    plain = RunRecord("p", "p", str(tmp_path), "slurm", job_id="8", dependents=["9"],
                      dependents_after="ok")  # fmt: skip
    release_dependents(plain, "8", True, None, client)  # type: ignore[arg-type]
    assert client.dependencies == [("9", "afterok:10")]  # Slurm's afterok releases it


def test_a_sweep_can_be_a_stage(tmp_path: Path, stub_slurm: Path) -> None:
    path = _write(tmp_path)
    (tmp_path / "train.yaml").write_text(
        f"name: t\n{STAGE}sweep:\n  grid:\n    train.seed: [1, 2]\n"
    )
    stages = submit_pipeline(path, [], SlurmClient(), tmp_path / "runs", preflight=False)
    assert stages[0].array_size == 2
    assert "--dependency=afterok:4242" in (stub_slurm / "sbatch-args-1.txt").read_text().split()
    assert "trap stage_end EXIT" not in (stub_slurm / "submitted-0.sh").read_text()


def test_every_stage_of_the_example_pipeline_is_a_spec_train_accepts(tmp_path: Path) -> None:
    """test_examples' train check, for a pipeline: each stage's resolved spec."""
    from train.spec import dump_spec, load_run_config

    _, stages = load_pipeline(REPO / "examples" / "pipeline.yaml")
    for s in stages:
        path = tmp_path / f"{s.stage.name}.yaml"
        path.write_text(dump_spec(s.loaded.spec.model_dump(mode="json", exclude_none=True)))
        load_run_config(path)
