"""Checkpoint history with branches (train.checkpoint.branches, train.resume.plan_resume).

A resume from an older checkpoint starts a new branch; automatic resumes and pruning follow the
current branch's line; nothing of another branch is deleted; a crash between recording the
branch and its first save loses nothing; manifests written before branches existed load as
branch 0. Histories are built from real (tiny) checkpoints, so ``latest_valid`` verifies them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from train.checkpoint import CheckpointManager, branches, capture_rng_state, latest_valid
from train.checkpoint.branches import Line
from train.checkpoint.manifest import check_manifest, read_manifest, verify_checkpoint
from train.errors import CheckpointError
from train.resume import plan_resume
from train.spec.config import TrainConfig

B1 = Line(1, ((0, 40),))  # forked from step 40 of branch 0
B2 = Line(2, ((1, 50), (0, 40)))  # forked from step 50 of branch 1
B3 = Line(3, ((0, 20),))  # a second fork of branch 0, older


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(2, 2)


def _save(root: Path, line: Line, step: int, *, run_id: str = "run", keep_last: int = 99) -> None:
    cm = CheckpointManager(
        root, rank=0, world_size=1, keep_last=keep_last, run_id=run_id, line=line
    )
    model = _model()
    with torch.no_grad():
        model.weight.fill_(step + 0.01 * line.branch)  # every checkpoint its own digest
    cm.save(step, {"n": step}, {"rng": capture_rng_state()}, epoch=0, epoch_step=step, model=model)
    cm.close()


def _history(root: Path, saves: list[tuple[Line, int]]) -> None:
    for line, step in saves:
        _save(root, line, step)


def _names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir())


ABANDONED = [(Line(), 40), (Line(), 50), (Line(), 60)]

# (history, line, the newest valid checkpoint on the line)
LATEST = [
    ("linear", [(Line(), 10), (Line(), 20)], Line(), "step-20"),
    ("fork without a save yet", ABANDONED, B1, "step-40"),
    ("fork with saves", [*ABANDONED, (B1, 50), (B1, 60)], B1, "step-60.b1"),
    ("the old branch is still whole", [*ABANDONED, (B1, 50), (B1, 70)], Line(), "step-60"),
    ("a save at the fork step", [*ABANDONED, (B1, 40)], B1, "step-40.b1"),
    ("nested fork", [*ABANDONED, (B1, 50), (B1, 60), (B2, 55)], B2, "step-55.b2"),
    ("nested fork, nothing of its own", [*ABANDONED, (B1, 50), (B1, 60)], B2, "step-50.b1"),
    ("older fork", [*ABANDONED, (B1, 50), (Line(), 20)], B3, "step-20"),
]


@pytest.mark.parametrize(("what", "saves", "line", "want"), LATEST, ids=[c[0] for c in LATEST])
def test_latest_follows_the_line(
    tmp_path: Path, what: str, saves: list[tuple[Line, int]], line: Line, want: str
) -> None:
    _history(tmp_path, saves)
    assert latest_valid(tmp_path, line) == tmp_path / want


def test_latest_skips_a_damaged_checkpoint_of_the_line_never_jumping_branches(
    tmp_path: Path,
) -> None:
    _history(tmp_path, [*ABANDONED, (B1, 50)])
    (tmp_path / "step-50.b1" / "shared.pt").write_bytes(b"torn")
    assert latest_valid(tmp_path, B1) == tmp_path / "step-40"  # not the abandoned step-60


# (history, line saved on, keep_last, what is left after one more save at step 90)
PRUNE = [
    ("linear", [(Line(), 10), (Line(), 20), (Line(), 30)], Line(), 2, ["step-30", "step-90"]),
    (
        "the new branch prunes only its own",
        [*ABANDONED, (B1, 50), (B1, 60), (B1, 70)],
        B1,
        2,
        ["step-40", "step-50", "step-60", "step-70.b1", "step-90.b1"],
    ),
    (
        "back on the old branch: the fork point stays for branch 1",
        [(Line(), 30), *ABANDONED, (B1, 50)],
        Line(),
        1,
        ["step-30", "step-40", "step-50.b1", "step-90"],
    ),
    (
        "nested: branch 1 up to its fork point stays",
        [*ABANDONED, (B1, 50), (B1, 60), (B2, 55), (B2, 65)],
        B2,
        1,
        ["step-40", "step-50", "step-50.b1", "step-60", "step-60.b1", "step-90.b2"],
    ),
]


@pytest.mark.parametrize(
    ("what", "saves", "line", "keep_last", "left"), PRUNE, ids=[c[0] for c in PRUNE]
)
def test_prune_follows_the_line_and_keeps_every_other_branch(
    tmp_path: Path,
    what: str,
    saves: list[tuple[Line, int]],
    line: Line,
    keep_last: int,
    left: list[str],
) -> None:
    _history(tmp_path, saves)
    _save(tmp_path, line, 90, keep_last=keep_last)
    assert _names(tmp_path) == left


def test_prune_never_touches_another_runs_checkpoints_on_the_line(tmp_path: Path) -> None:
    _save(tmp_path, Line(), 10, run_id="other")
    _history(tmp_path, [(Line(), 20), (Line(), 30)])
    _save(tmp_path, Line(), 40, keep_last=1)
    assert _names(tmp_path) == ["step-10", "step-40"]


def _config() -> TrainConfig:
    return TrainConfig.model_validate({"model": "tinycnn"})


def _plan(run: Path, want: Any, *, restarted: bool = False) -> Any:
    root = run / "checkpoints"
    plan = plan_resume(
        want, run, _config(), lambda line: latest_valid(root, line), restarted=restarted
    )
    assert plan.error is None, plan.error
    return plan


def test_resume_from_an_older_checkpoint_starts_a_branch_and_a_restart_continues_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "checkpoints"
    _history(root, ABANDONED)
    plan = _plan(tmp_path, root / "step-40")
    assert (plan.path, plan.line, plan.record) == (str(root / "step-40"), B1, True)
    assert plan.resumed_from == "step-40"
    # crash between recording the branch and its first save: nothing lost, nothing confused
    branches.write_current(root, plan.line, plan.resumed_from)
    for want, restarted in ((True, True), (root / "step-40", True)):  # the same argv again
        again = _plan(tmp_path, want, restarted=restarted)
        assert (again.path, again.line, again.record) == (str(root / "step-40"), B1, False)
    _save(root, B1, 50)
    _save(root, B1, 55)
    assert _plan(tmp_path, True, restarted=True).path == str(root / "step-55.b1")
    assert _plan(tmp_path, root / "step-40", restarted=True).path == str(root / "step-55.b1")
    # asked again by hand (not a restart): another branch from the same step
    assert _plan(tmp_path, root / "step-40").line == Line(2, ((0, 40),))
    assert [verify_checkpoint(root / n)["step"] for n in ("step-50", "step-60")] == [50, 60]


def test_a_restart_whose_first_attempt_died_before_recording_the_branch_forks(
    tmp_path: Path,
) -> None:
    root = tmp_path / "checkpoints"
    _history(root, ABANDONED)
    plan = _plan(tmp_path, root / "step-40", restarted=True)  # branch.json never written
    assert (plan.path, plan.line, plan.record) == (str(root / "step-40"), B1, True)


def test_resume_from_the_newest_of_a_branch_continues_it(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    _history(root, [*ABANDONED, (B1, 50)])
    branches.write_current(root, B1)
    plan = _plan(tmp_path, root / "step-60")  # back to the head of branch 0: no new branch
    assert (plan.line, plan.record) == (Line(), True)
    plan = _plan(tmp_path, root / "step-50.b1")
    assert (plan.line, plan.resumed_from) == (B1, "step-50.b1")


def test_a_restart_of_a_run_that_continued_a_head_continues_it(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    _history(root, ABANDONED)
    plan = _plan(tmp_path, root / "step-60")  # the head: no new branch, but recorded
    assert (plan.line, plan.record, plan.resumed_from) == (Line(), True, "step-60")
    branches.write_current(root, plan.line, plan.resumed_from)
    _save(root, Line(), 70)
    again = _plan(tmp_path, root / "step-60", restarted=True)  # the same argv after a requeue
    assert (again.path, again.line, again.record) == (str(root / "step-70"), Line(), False)


@pytest.mark.parametrize(
    "content", ['{"branch": "1"}', '{"branch": 1, "parents": [[0]]}', "[", '{"branch": -1}']
)
def test_damaged_branch_file_follows_the_newest_written_checkpoint(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "checkpoints"
    _history(root, [*ABANDONED, (B1, 50)])
    (root / branches.BRANCH_FILE).write_text(content)
    with caplog.at_level(logging.WARNING):
        plan = _plan(tmp_path, True, restarted=True)
    assert (plan.path, plan.line, plan.record) == (str(root / "step-50.b1"), B1, True)
    assert branches.BRANCH_FILE in caplog.text


def test_branch_file_is_never_written_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / "branch.json.partial").symlink_to(victim)
    with pytest.raises(CheckpointError, match="symbolic link"):
        branches.write_current(root, B1)
    assert victim.read_text() == "keep"


def test_manifest_without_branch_is_branch_0(tmp_path: Path) -> None:
    _history(tmp_path, [(Line(), 10), (Line(), 20)])
    for name in ("step-10", "step-20"):
        m = json.loads((tmp_path / name / "manifest.json").read_text())
        del m["branch"], m["parents"]
        (tmp_path / name / "manifest.json").write_text(json.dumps(m))
    assert [e.line for e in branches.entries(tmp_path)] == [Line(), Line()]
    assert latest_valid(tmp_path) == tmp_path / "step-20"
    _save(tmp_path, Line(), 30, keep_last=1)
    assert _names(tmp_path) == ["step-30"]


BAD_LINES: list[tuple[str, dict[str, Any]]] = [
    ("branch is text", {"branch": "1", "parents": [[0, 4]]}),
    ("branch is a bool", {"branch": True, "parents": [[0, 4]]}),
    ("negative branch", {"branch": -1}),
    ("parents is a dict", {"branch": 1, "parents": {"0": 4}}),
    ("a parent of one number", {"branch": 1, "parents": [[0]]}),
    ("a parent step of text", {"branch": 1, "parents": [[0, "4"]]}),
    ("a branch twice", {"branch": 1, "parents": [[1, 4]]}),
    ("branch 1 without parents", {"branch": 1, "parents": []}),
    ("branch 0 with parents", {"branch": 0, "parents": [[1, 4]]}),
]


@pytest.mark.parametrize(("what", "fields"), BAD_LINES, ids=[b[0] for b in BAD_LINES])
def test_damaged_branch_fields_make_a_checkpoint_invalid(
    tmp_path: Path, what: str, fields: dict[str, Any]
) -> None:
    _history(tmp_path, [(Line(), 10)])
    m = read_manifest(tmp_path / "step-10")
    with pytest.raises(CheckpointError, match="branch record"):
        check_manifest({**m, **fields})


def test_a_renamed_checkpoint_is_not_taken_for_another_branch(tmp_path: Path) -> None:
    _history(tmp_path, [(Line(), 10), (B1, 50)])
    (tmp_path / "step-50.b1").rename(tmp_path / "step-50")
    with pytest.raises(CheckpointError, match="branch 1"):
        verify_checkpoint(tmp_path / "step-50")
    assert latest_valid(tmp_path, Line()) == tmp_path / "step-10"


def test_the_trainer_resumed_from_an_older_step_trains_a_branch_and_keeps_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """python -m train in-process: 12 steps (keeps step-8, step-12), --resume step-8 saving
    every step (keep_last 2 prunes only the new branch), the same parameters at step 12 (an
    exact resume), then a plain --resume follows the new branch."""
    import yaml

    from train.cli import main

    for key in ("SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    train = {
        "model": "tinycnn",
        "width": 4,
        "data": {"train_size": 256, "test_size": 64},
        "batch_size": 32,
        "max_steps": 12,
        "num_threads": 1,
        "checkpoint": {"interval_steps": 4, "keep_last": 2, "keep_best": False},
    }
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "t", "resources": {"nodes": 1}, "train": train}))
    run = tmp_path / "run"
    root = run / "checkpoints"
    argv = ["--config", str(spec), "--run-dir", str(run)]
    assert main(argv) == 0
    assert _names(root) == ["step-12", "step-8"]
    digest = verify_checkpoint(root / "step-12")["digest"]
    every_step = ["--set", "train.checkpoint.interval_steps=1"]  # a free field
    assert main([*argv, *every_step, "--resume", str(root / "step-8")]) == 0
    assert _names(root) == ["step-11.b1", "step-12", "step-12.b1", "step-8"]
    assert verify_checkpoint(root / "step-12.b1")["digest"] == digest
    assert verify_checkpoint(root / "step-12")["digest"] == digest  # the old branch, untouched
    assert branches.read_record(root) == branches.Record(Line(1, ((0, 8),)), "step-8")
    assert main([*argv, "--resume"]) == 0
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e.get("path", "").rsplit("/", 1)[-1]) for e in events] == [
        ("start", ""),
        ("complete", ""),
        ("resume", "step-8"),
        ("complete", ""),
        ("resume", "step-12.b1"),
        ("complete", ""),
    ]


@pytest.mark.parametrize("command", [True, False])
def test_a_restart_without_checkpoints_of_ours_says_what_it_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, command: bool
) -> None:
    """An entrypoint.command keeps its own checkpoints (Lightning's hpc_ckpt in RUN_DIR): its
    restart must not claim to start fresh; the built-in trainer's does start fresh."""
    with caplog.at_level(logging.INFO, logger="train.resume"):
        plan = plan_resume(True, tmp_path, _config(), lambda line: None, command=command)
    assert plan.path is None and plan.error is None
    assert ("starting fresh" in caplog.text) is not command
    assert ("may resume from its own files" in caplog.text) is command
