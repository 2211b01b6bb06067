"""CheckpointManager against damaged, foreign and linked content (issue 14: items 2, 6, 7).

- a manifest that is valid JSON but has wrong types, a missing field or names a foreign file is
  treated like a half-written checkpoint: skipped, the previous valid one is used, never a crash;
- ``step-N`` / ``.step-N.tmp`` that are symbolic links are never loaded, followed or left behind;
- a manager never prunes or replaces a checkpoint another run wrote.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from train.checkpoint import (
    CheckpointManager,
    capture_rng_state,
    checkpoint_run_id,
    latest_valid,
    model_digest,
    verify_checkpoint,
)
from train.errors import CheckpointError


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _save(cm: CheckpointManager, model: nn.Module, step: int, metric: float | None = None) -> None:
    cm.save(
        step,
        {"metrics": {"step": step}},
        {"rng": capture_rng_state()},
        epoch=0,
        epoch_step=step,
        model=model,
        metric=metric,
    )
    cm.wait()


def _bump(model: nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)


def _edit(p: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    m = json.loads((p / "manifest.json").read_text())
    out = change(m)  # edits m in place, or returns a list to write instead
    (p / "manifest.json").write_text(json.dumps(out if isinstance(out, list) else m))


DAMAGED: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
    ("step is text", lambda m: m.update(step="two")),
    ("step is a float", lambda m: m.update(step=2.5)),
    ("step is a bool", lambda m: m.update(step=True)),
    ("no epoch", lambda m: m.pop("epoch")),
    ("epoch is a list", lambda m: m.update(epoch=[0])),
    ("no epoch_step", lambda m: m.pop("epoch_step")),
    ("world_size is text", lambda m: m.update(world_size="1")),
    ("world_size is 0", lambda m: m.update(world_size=0)),
    ("digest is a number", lambda m: m.update(digest=7)),
    ("files is a list", lambda m: m.update(files=["shared.pt"])),
    ("file entry is text", lambda m: m["files"].update({"rank-0.pt": "x"})),
    ("size is text", lambda m: m["files"]["shared.pt"].update(size="12")),
    ("digest is missing", lambda m: m["files"]["shared.pt"].pop("xxh3_128")),
    ("digest too short", lambda m: m["files"]["shared.pt"].update(xxh3_128="0" * 31)),
    ("digest not hex", lambda m: m["files"]["shared.pt"].update(xxh3_128="g" * 32)),
    ("a sha256 in format 2", lambda m: m.update(digest="0" * 64)),
    ("format 3", lambda m: m.update(format=3)),
    ("format is a bool", lambda m: m.update(format=True)),
    (
        "foreign file",
        lambda m: m["files"].update({"../../outside.pt": {"size": 1, "xxh3_128": "0"}}),
    ),
    ("absolute file", lambda m: m["files"].update({"/etc/passwd": {"size": 1, "xxh3_128": "0"}})),
    ("metric is text", lambda m: m.update(metric="best")),
    ("run_id is a number", lambda m: m.update(run_id=5)),
    ("a list", lambda m: [m]),
    ("empty object", lambda m: m.clear()),
]


@pytest.mark.parametrize(("what", "change"), DAMAGED, ids=[d[0] for d in DAMAGED])
def test_damaged_manifest_falls_back_to_previous(
    tmp_path: Path, what: str, change: Callable[[dict[str, Any]], Any]
) -> None:
    root = tmp_path / "ck"
    model = _model()
    cm = CheckpointManager(root, rank=0, world_size=1, keep_last=5)
    _save(cm, model, 1, metric=0.5)
    good = model_digest(model)
    _bump(model)
    _save(cm, model, 2, metric=0.6)
    _edit(root / "step-2", change)
    fresh = CheckpointManager(root, rank=0, world_size=1, keep_last=5)
    assert fresh.latest_valid() == root / "step-1"
    with pytest.raises(CheckpointError):
        fresh.load(root / "step-2")
    with pytest.raises(CheckpointError):
        verify_checkpoint(root / "step-2")
    loaded = fresh.load(root / "step-1")
    assert loaded.manifest["digest"] == good
    assert isinstance(loaded.manifest["epoch"], int) and loaded.step == 1
    # pruning and keep_best read every manifest: the damaged one is left alone, no crash
    for step in (3, 4, 5, 6, 7):
        _save(fresh, model, step, metric=0.1)
    assert (root / "step-2").is_dir()
    assert checkpoint_run_id(root / "step-2") is None


def test_damaged_rank_marker_is_a_checkpoint_error_not_a_crash(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    cm = CheckpointManager(root, rank=0, world_size=2, marker_timeout_s=0.3)
    tmp = root / ".step-1.tmp"
    tmp.mkdir(parents=True)
    (tmp / "rank-1.done").write_text(json.dumps({"step": 1, "size": "big"}))
    with pytest.raises(CheckpointError, match=r"ranks \[1\] did not finish"):
        _save(cm, _model(), 1)
    assert cm.latest_valid() is None


# -- symbolic links -------------------------------------------------------------------------


def _valid_elsewhere(tmp_path: Path, step: int) -> Path:
    """A valid checkpoint directory outside the root (what a link would point to)."""
    other = tmp_path / "other"
    cm = CheckpointManager(other, rank=0, world_size=1)
    model = _model()
    _bump(model)
    _save(cm, model, step)
    return other / f"step-{step}"


def test_symlinked_step_dir_is_never_loaded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = _valid_elsewhere(tmp_path, 5)
    root = tmp_path / "ck"
    cm = CheckpointManager(root, rank=0, world_size=1)
    _save(cm, _model(), 1)
    (root / "step-5").symlink_to(target, target_is_directory=True)
    with caplog.at_level(logging.WARNING, logger="train.checkpoint.manager"):
        assert cm.latest_valid() == root / "step-1"
    assert "symbolic link" in caplog.text
    with pytest.raises(CheckpointError, match="symbolic link"):
        cm.load(root / "step-5")
    with pytest.raises(CheckpointError, match="symbolic link"):
        verify_checkpoint(root / "step-5")


def test_symlinked_file_in_checkpoint_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    cm = CheckpointManager(root, rank=0, world_size=1)
    _save(cm, _model(), 1)
    real = tmp_path / "rank-0.real"
    shutil.move(root / "step-1" / "rank-0.pt", real)
    (root / "step-1" / "rank-0.pt").symlink_to(real)
    with pytest.raises(CheckpointError, match="symbolic link"):
        verify_checkpoint(root / "step-1")


def test_links_are_never_followed_or_left_behind(tmp_path: Path) -> None:
    target = _valid_elsewhere(tmp_path, 2)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    root = tmp_path / "ck"
    root.mkdir()
    (root / "step-2").symlink_to(target, target_is_directory=True)
    (root / ".step-3.tmp").symlink_to(victim, target_is_directory=True)
    (root / ".step-9.del-1").symlink_to(victim, target_is_directory=True)
    cm = CheckpointManager(root, rank=0, world_size=1, keep_last=1, keep_best=False)
    # leftovers that are links are removed as links; their targets are untouched
    assert not (root / ".step-3.tmp").is_symlink() and not (root / ".step-9.del-1").is_symlink()
    assert (victim / "precious.txt").read_text() == "keep me"
    (root / ".step-4.tmp").symlink_to(victim, target_is_directory=True)  # planted mid-run
    model = _model()
    for step in (1, 3, 4, 5):
        _save(cm, model, step)
    assert sorted(p.name for p in victim.iterdir()) == ["precious.txt"]
    verify_checkpoint(target)  # pruning never followed the step-2 link
    names = sorted(p.name for p in root.iterdir())
    assert names == ["step-2", "step-5"], names
    assert (root / "step-2").is_symlink()
    with pytest.raises(CheckpointError, match="symbolic link"):
        _save(cm, model, 2)  # never replaces a link either
    assert (root / "step-2").is_symlink() and not list(root.glob(".step-2*"))


# -- checkpoints of another run -------------------------------------------------------------


def test_second_run_never_prunes_or_replaces_the_first_runs_checkpoints(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    first = _model()
    run_a = CheckpointManager(root, rank=0, world_size=1, keep_last=2, run_id="run-a")
    for step in (32, 43):
        _bump(first)
        _save(run_a, first, step)
    digests = {s: verify_checkpoint(root / f"step-{s}")["digest"] for s in (32, 43)}
    assert checkpoint_run_id(root / "step-43") == "run-a"

    second = _model()  # a new run in the same directory, started from step 0
    run_b = CheckpointManager(root, rank=0, world_size=1, keep_last=1, keep_best=False)
    assert run_b.run_id != "run-a"
    assert run_b.foreign_checkpoints() == [root / "step-43", root / "step-32"]
    for step in (10, 20):
        _save(run_b, second, step)
    assert sorted(p.name for p in root.iterdir()) == ["step-20", "step-32", "step-43"]
    with pytest.raises(CheckpointError, match="another run"):
        _save(run_b, second, 32)
    assert {s: verify_checkpoint(root / f"step-{s}")["digest"] for s in (32, 43)} == digests
    assert not list(root.glob(".step-*"))


def test_legacy_checkpoint_without_run_id_is_never_pruned(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    cm = CheckpointManager(root, rank=0, world_size=1, keep_last=1)
    _save(cm, _model(), 1)
    _edit(root / "step-1", lambda m: m.pop("run_id"))
    verify_checkpoint(root / "step-1")  # still a valid checkpoint, just of unknown origin
    cm2 = CheckpointManager(root, rank=0, world_size=1, keep_last=1, keep_best=False)
    for step in (2, 3):
        _save(cm2, _model(), step)
    assert sorted(p.name for p in root.iterdir()) == ["step-1", "step-3"]


def test_resuming_in_place_continues_the_run_and_prunes_its_older_checkpoints(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ck"
    model = _model()
    first = CheckpointManager(root, rank=0, world_size=1, keep_last=2, keep_best=False)
    for step in (1, 2):
        _save(first, model, step)
    # a requeued attempt: fresh process, no run id passed, resumes from the newest
    again = CheckpointManager(root, rank=0, world_size=1, keep_last=2, keep_best=False)
    again.load(again.latest_valid() or root)
    assert again.run_id == first.run_id
    for step in (3, 4):
        _save(again, model, step)
    assert sorted(p.name for p in root.iterdir()) == ["step-3", "step-4"]
    assert checkpoint_run_id(root / "step-4") == first.run_id


def test_module_level_latest_valid_is_read_only(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    assert latest_valid(root) is None and not root.exists()  # creates nothing
    cm = CheckpointManager(root, rank=0, world_size=1)
    _save(cm, _model(), 1)
    (root / ".step-2.tmp").mkdir()
    assert latest_valid(root) == root / "step-1"
    assert (root / ".step-2.tmp").is_dir()  # removes nothing


# -- a peer dead mid-save (issue 46: a restart in place at the floor) -----------------------------


def test_a_save_stops_waiting_for_a_part_that_no_longer_moves_once_the_step_ends(
    tmp_path: Path,
) -> None:
    """srun ends the step at a rank's bad exit; a peer that died mid-save never drops its marker.
    Rank 0 waited for it until Slurm's KillWait killed it too (30 s of every restart in place
    that a kill during a save started); now, once the step is ending, a part that stays as it is
    for the idle window ends the save as a checkpoint error naming the rank."""
    import train.checkpoint.dirs as dirs

    root = tmp_path / "ck"
    cm = CheckpointManager(root, rank=0, world_size=2, marker_timeout_s=60)
    tmp = root / ".step-1.tmp"
    tmp.mkdir(parents=True)
    (tmp / "rank-1.pt").write_bytes(b"half a part")  # what the dead rank left
    ending_at = time.monotonic() + 0.3
    cm.step_ending = lambda: time.monotonic() > ending_at
    start = time.monotonic()
    with pytest.raises(CheckpointError, match=r"ranks \[1\] did not finish writing and stopped"):
        _save(cm, _model(), 1)
    waited = time.monotonic() - start
    assert 0.3 + dirs.ENDING_IDLE_S <= waited < 0.3 + dirs.ENDING_IDLE_S + 5
    assert cm.latest_valid() is None


def test_a_part_still_being_written_is_waited_for_as_the_step_ends(tmp_path: Path) -> None:
    """The same end of the step, a peer alive and still writing (its part grows): the save waits
    for its marker past the idle window and completes."""
    import json
    import threading

    import train.checkpoint.dirs as dirs

    root = tmp_path / "ck"
    tmp = root / ".step-1.tmp"
    tmp.mkdir(parents=True)
    part = tmp / "rank-1.pt"
    done = threading.Event()

    def peer() -> None:  # grows its part for 1.5 idle windows, then its marker
        end = time.monotonic() + 1.5 * dirs.ENDING_IDLE_S
        with part.open("wb") as f:
            while time.monotonic() < end:
                f.write(b"x" * 64)
                f.flush()
                time.sleep(0.1)
        from train.checkpoint.digest import ALGORITHMS, FORMAT_VERSION, hash_file

        algo = ALGORITHMS[FORMAT_VERSION]
        size = part.stat().st_size
        marker = {"rank": 1, "step": 1, "size": size, algo: hash_file(part, algo)}
        (tmp / "rank-1.done").write_text(json.dumps(marker))
        done.set()

    threading.Thread(target=peer, daemon=True).start()
    files = dirs.collect_markers(tmp, 1, [1], 60, ending=lambda: True)
    assert done.is_set() and "rank-1.pt" in files


def test_without_an_ending_step_a_still_part_is_waited_for_to_the_timeout(tmp_path: Path) -> None:
    import train.checkpoint.dirs as dirs

    tmp = tmp_path / ".step-1.tmp"
    tmp.mkdir()
    (tmp / "rank-1.pt").write_bytes(b"still")
    start = time.monotonic()
    with pytest.raises(CheckpointError, match=r"within 1s"):
        dirs.collect_markers(tmp, 1, [1], 1.0, ending=lambda: False, idle_s=0.1)
    assert time.monotonic() - start >= 1.0
