"""CheckpointManager: atomic layout, manifests, verification, pruning, async saves, helpers."""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xxhash
from torch import nn

import train.checkpoint.manifest
from train.checkpoint import (
    CheckpointManager,
    capture_rng_state,
    load_model_state,
    model_digest,
    restore_rng_state,
    strip_module_prefix,
    verify_checkpoint,
)
from train.errors import CheckpointError


def _slow_saves(monkeypatch: Any, seconds: float) -> None:
    """Every phase of a save sleeps ``seconds`` (the manager's phase hook; the delay is ours)."""
    monkeypatch.setattr(
        "train.checkpoint.manager.SAVE_PHASE_HOOKS", [lambda phase: time.sleep(seconds)]
    )


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int = 1) -> None:
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(16, 4)).pow(2).mean().backward()
        opt.step()


def _save(
    cm: CheckpointManager, model: nn.Module, opt: torch.optim.Optimizer, step: int, **kw: Any
) -> Path | None:
    return cm.save(
        step,
        {"optimizer": opt.state_dict(), "metrics": {"loss": [0.5, 0.25]}},
        {"rng": capture_rng_state(), "sampler": {"epoch": 0, "position": step * 16}},
        epoch=0,
        epoch_step=step,
        model=model,
        **kw,
    )


@pytest.fixture
def setup(tmp_path: Path) -> tuple[nn.Module, torch.optim.Optimizer, Path]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, opt, tmp_path / "checkpoints"


@pytest.mark.parametrize("async_save", [False, True])
def test_save_load_roundtrip(setup: Any, async_save: bool) -> None:
    model, opt, root = setup
    cm = CheckpointManager(root, rank=0, world_size=1, async_save=async_save, spec_hash="abc")
    _train(model, opt, 2)
    path = _save(cm, model, opt, 2)
    cm.wait()
    assert path == root / "step-2" and path.is_dir()
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "rank-0.pt", "shared.pt"]
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 2 and manifest["epoch"] == 0 and manifest["epoch_step"] == 2
    assert manifest["world_size"] == 1 and manifest["spec_hash"] == "abc"
    assert manifest["digest"] == model_digest(model)
    assert set(manifest["files"]) == {"shared.pt", "rank-0.pt"}
    assert manifest["format"] == 2
    assert all(len(f["xxh3_128"]) == 32 and f["size"] > 0 for f in manifest["files"].values())
    for name, f in manifest["files"].items():
        assert f["size"] == (path / name).stat().st_size
        assert f["xxh3_128"] == xxhash.xxh3_128((path / name).read_bytes()).hexdigest()
    # every file loads with weights_only=True (no pickled Python objects)
    for f in ("shared.pt", "rank-0.pt"):
        torch.load(path / f, weights_only=True)

    fresh = _model()
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    loaded = cm.load(cm.latest_valid() or Path("missing"))
    load_model_state(fresh, loaded.shared["model"])
    fresh_opt.load_state_dict(loaded.shared["optimizer"])
    assert model_digest(fresh) == manifest["digest"] == loaded.manifest["digest"]
    assert loaded.step == 2
    assert loaded.rank_state is not None and loaded.rank_state["sampler"]["position"] == 32
    assert loaded.shared["metrics"] == {"loss": [0.5, 0.25]}
    # identical continuation after restoring optimizer state
    torch.manual_seed(5)
    _train(model, opt)
    torch.manual_seed(5)
    _train(fresh, fresh_opt)
    assert model_digest(fresh) == model_digest(model)


def test_async_snapshot_is_taken_on_the_training_path(setup: Any, monkeypatch: Any) -> None:
    model, opt, root = setup
    _slow_saves(monkeypatch, 0.2)
    cm = CheckpointManager(root, rank=0, world_size=1, async_save=True)
    digest = model_digest(model)
    _save(cm, model, opt, 1)
    assert cm.in_flight
    # training continues while the save is written: its forward pass and optimizer step
    # wait for the copy (copy-on-write), so the checkpoint holds the state of step 1
    _train(model, opt, 2)
    assert model_digest(model) != digest
    cm.wait()
    assert not cm.in_flight
    assert json.loads((root / "step-1" / "manifest.json").read_text())["digest"] == digest
    # an in-place change outside forward/step: wait_copied() first, and the save is intact
    _save(cm, model, opt, 2)
    digest = model_digest(model)
    cm.wait_copied()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    cm.wait()
    assert json.loads((root / "step-2" / "manifest.json").read_text())["digest"] == digest


def test_async_in_place_change_before_the_copy_fails_the_save_never_mixes(
    setup: Any, monkeypatch: Any
) -> None:
    model, opt, root = setup
    _slow_saves(monkeypatch, 0.2)
    cm = CheckpointManager(root, rank=0, world_size=1, async_save=True)
    _save(cm, model, opt, 1)
    with torch.no_grad():  # not through forward/optimizer.step: nothing waits for the copy
        next(iter(model.parameters())).add_(1.0)
    with pytest.raises(CheckpointError, match="changed in place before the asynchronous save"):
        cm.wait()
    assert cm.latest_valid() is None and not list(root.iterdir())


def test_at_most_one_async_save_in_flight(setup: Any, monkeypatch: Any) -> None:
    model, opt, root = setup
    _slow_saves(monkeypatch, 0.15)
    cm = CheckpointManager(root, rank=0, world_size=1, async_save=True)
    _save(cm, model, opt, 1)
    _save(cm, model, opt, 2)  # waits for step 1 first
    assert (root / "step-1" / "manifest.json").is_file()
    cm.wait()
    assert (root / "step-2" / "manifest.json").is_file()


def test_async_error_surfaces_on_wait(setup: Any, monkeypatch: Any) -> None:
    model, opt, root = setup
    cm = CheckpointManager(root, rank=0, world_size=1, async_save=True)

    def boom(*a: Any, **k: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("train.checkpoint.write.write_torch", boom)
    _save(cm, model, opt, 1)
    with pytest.raises(CheckpointError, match="disk full"):
        cm.wait()
    cm.wait()  # reported once


def test_module_prefix_is_stripped_and_accepted(setup: Any) -> None:
    model, opt, root = setup
    wrapped = nn.DataParallel(model)
    assert all(k.startswith("module.") for k in wrapped.state_dict())
    cm = CheckpointManager(root, rank=0, world_size=1)
    _save(cm, wrapped, opt, 1)
    shared = cm.load(root / "step-1").shared
    assert not any(k.startswith("module.") for k in shared["model"])
    assert model_digest(wrapped) == model_digest(model)
    # bare <- prefixed, wrapped <- bare
    bare = _model()
    load_model_state(bare, wrapped.state_dict())
    other = nn.DataParallel(_model())
    load_model_state(other, shared["model"])
    assert model_digest(bare) == model_digest(other) == model_digest(model)
    assert list(strip_module_prefix({"module.module.a": 1})) == ["a"]
    assert list(strip_module_prefix({"module.a": 1, "b": 2})) == ["module.a", "b"]


def test_load_model_state_mismatch_is_a_checkpoint_error() -> None:
    with pytest.raises(CheckpointError, match="does not fit this model"):
        load_model_state(_model(), {"nope.weight": torch.zeros(1)})


def test_keep_last_plus_best(setup: Any) -> None:
    model, opt, root = setup
    cm = CheckpointManager(root, rank=0, world_size=1, keep_last=2, keep_best=True)
    metrics = {1: 0.5, 2: 0.9, 3: 0.1, 4: 0.2, 5: 0.3}
    for step, metric in metrics.items():
        _save(cm, model, opt, step, metric=metric)
    cm.wait()  # pruned checkpoints are renamed away at once and deleted in the background
    assert sorted(p.name for p in root.iterdir()) == ["step-2", "step-4", "step-5"]
    cm_min = CheckpointManager(root / "min", rank=0, world_size=1, keep_last=1, best_mode="min")
    for step, metric in metrics.items():
        _save(cm_min, model, opt, step, metric=metric)
    cm_min.wait()
    assert sorted(p.name for p in (root / "min").iterdir()) == ["step-3", "step-5"]
    cm_nobest = CheckpointManager(root / "nb", rank=0, world_size=1, keep_last=1, keep_best=False)
    for step, metric in metrics.items():
        _save(cm_nobest, model, opt, step, metric=metric)
    cm_nobest.wait()
    assert [p.name for p in (root / "nb").iterdir()] == ["step-5"]


@pytest.mark.parametrize("can_swap", [True, False])
def test_existing_valid_checkpoint_is_swapped_never_destroyed(
    setup: Any, monkeypatch: pytest.MonkeyPatch, can_swap: bool
) -> None:
    model, opt, root = setup
    cm = CheckpointManager(root, rank=0, world_size=1)
    _save(cm, model, opt, 3)
    old = verify_checkpoint(root / "step-3")["digest"]
    assert _save(cm, model, opt, 3) is None  # same manager: already saved
    _train(model, opt)  # e.g. a run resumed from an older step reaches step 3 differently
    if not can_swap:  # no renameat2(RENAME_EXCHANGE): the existing checkpoint is kept
        monkeypatch.setattr(train.checkpoint.manifest, "exchange", lambda a, b: False)
    cm2 = CheckpointManager(root, rank=0, world_size=1, run_id=cm.run_id)  # the same run
    _save(cm2, model, opt, 3)
    assert old != model_digest(model)
    want = model_digest(model) if can_swap else old
    assert verify_checkpoint(root / "step-3")["digest"] == want
    assert [p.name for p in root.iterdir()] == ["step-3"]


def test_invalid_existing_step_dir_is_replaced(setup: Any) -> None:
    model, opt, root = setup
    (root / "step-3").mkdir(parents=True)
    (root / "step-3" / "shared.pt").write_bytes(b"garbage")
    cm = CheckpointManager(root, rank=0, world_size=1)
    _save(cm, model, opt, 3)
    assert verify_checkpoint(root / "step-3")["digest"] == model_digest(model)


def _corrupt_bad_digest(p: Path) -> None:
    m = json.loads((p / "manifest.json").read_text())
    m["digest"] = "0" * 32
    (p / "manifest.json").write_text(json.dumps(m))


def _corrupt_truncate(p: Path) -> None:
    data = (p / "shared.pt").read_bytes()
    (p / "shared.pt").write_bytes(data[: len(data) // 2])


def _corrupt_flip_byte(p: Path) -> None:
    data = bytearray((p / "rank-0.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (p / "rank-0.pt").write_bytes(bytes(data))


def _corrupt_no_manifest(p: Path) -> None:
    (p / "manifest.json").unlink()


def _corrupt_bad_json(p: Path) -> None:
    (p / "manifest.json").write_text("{not json")


def _corrupt_missing_file(p: Path) -> None:
    (p / "rank-0.pt").unlink()


def _corrupt_tampered_weights(p: Path) -> None:
    # a consistent file list but different parameters: only the model digest catches it
    shared = torch.load(p / "shared.pt", weights_only=True)
    first = next(iter(shared["model"]))
    shared["model"][first] = shared["model"][first] + 1
    torch.save(shared, p / "shared.pt")
    m = json.loads((p / "manifest.json").read_text())
    m["files"]["shared.pt"] = {
        "size": (p / "shared.pt").stat().st_size,
        "xxh3_128": xxhash.xxh3_128((p / "shared.pt").read_bytes()).hexdigest(),
    }
    (p / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize(
    ("corrupt", "why"),
    [
        (_corrupt_bad_digest, "digest does not match"),
        (_corrupt_truncate, "truncated"),
        (_corrupt_flip_byte, "xxh3_128"),
        (_corrupt_no_manifest, "no manifest.json"),
        (_corrupt_bad_json, "unreadable manifest.json"),
        (_corrupt_missing_file, "rank-0.pt is missing"),
        (_corrupt_tampered_weights, "digest does not match"),
    ],
)
def test_corrupted_newest_is_skipped(
    setup: Any, corrupt: Any, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    model, opt, root = setup
    cm = CheckpointManager(root, rank=0, world_size=1, keep_last=5)
    _save(cm, model, opt, 1)
    good = model_digest(model)
    _train(model, opt)
    _save(cm, model, opt, 2)
    corrupt(root / "step-2")
    with caplog.at_level(logging.WARNING, logger="train.checkpoint.manager"):
        assert cm.latest_valid() == root / "step-1"
    assert why in caplog.text
    with pytest.raises(CheckpointError, match=why):
        cm.load(root / "step-2")
    assert cm.load(root / "step-1").manifest["digest"] == good


def test_leftover_tmp_is_skipped_and_cleaned(setup: Any, caplog: pytest.LogCaptureFixture) -> None:
    model, opt, root = setup
    cm = CheckpointManager(root, rank=0, world_size=1)
    _save(cm, model, opt, 1)
    tmp = root / ".step-2.tmp"
    tmp.mkdir()
    (tmp / "rank-0.pt").write_bytes(b"partial")
    with caplog.at_level(logging.WARNING, logger="train.checkpoint.manager"):
        assert cm.latest_valid() == root / "step-1"
        assert ".step-2.tmp" in caplog.text
        CheckpointManager(root, rank=1, world_size=2)  # other ranks never delete
        assert tmp.exists()
        CheckpointManager(root, rank=0, world_size=1)
    assert not tmp.exists()


def test_no_checkpoint(tmp_path: Path) -> None:
    assert CheckpointManager(tmp_path / "c", rank=0, world_size=1).latest_valid() is None


def test_ranks_complete_through_marker_files(tmp_path: Path) -> None:
    """Two ranks save into one directory without any collective; rank 0 commits."""
    model = _model()
    root = tmp_path / "ck"
    managers = [CheckpointManager(root, rank=r, world_size=2, async_save=bool(r)) for r in (0, 1)]
    errors: list[BaseException] = []

    def rank_main(r: int) -> None:
        try:
            managers[r].save(
                7, {"extra": r}, {"who": r}, epoch=1, epoch_step=3, model=model, metric=None
            )
            managers[r].wait()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in (1, 0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    path = managers[0].latest_valid()
    assert path == root / "step-7"
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.json",
        "rank-0.pt",
        "rank-1.pt",
        "shared.pt",
    ]
    for r in (0, 1):
        loaded = managers[r].load(path)
        assert loaded.rank_state == {"who": r}
        assert loaded.shared["extra"] == 0  # rank 0's shared state
    # a third rank of a bigger run gets no rank state, with a warning
    assert managers[0].load(path, rank=2).rank_state is None


def test_missing_rank_times_out(tmp_path: Path) -> None:
    cm = CheckpointManager(tmp_path, rank=0, world_size=2, marker_timeout_s=0.2)
    with pytest.raises(CheckpointError, match=r"ranks \[1\] did not finish"):
        cm.save(1, {}, {}, epoch=0, epoch_step=1, model=_model())
    assert cm.latest_valid() is None


def test_unsafe_state_is_refused_at_save_time(setup: Any) -> None:
    model, _, root = setup
    cm = CheckpointManager(root, rank=0, world_size=1)
    with pytest.raises(CheckpointError, match=r"shared_state\['bad'\]: a object cannot"):
        cm.save(1, {"bad": object()}, {}, epoch=0, epoch_step=1, model=model)
    # numpy values are converted instead
    cm.save(
        2,
        {"np": np.arange(3), "f": np.float32(1.5)},
        {},
        epoch=0,
        epoch_step=2,
        model=model,
    )
    shared = cm.load(root / "step-2").shared
    assert shared["f"] == 1.5 and shared["np"].tolist() == [0, 1, 2]


def test_rng_state_roundtrip_through_weights_only(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # python's gauss cache is part of the state
    state = capture_rng_state()
    torch.save(state, tmp_path / "rng.pt")
    loaded = torch.load(tmp_path / "rng.pt", weights_only=True)
    expected = (random.random(), random.gauss(0, 1), np.random.rand(), torch.rand(1).item())
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    restore_rng_state(loaded)
    got = (random.random(), random.gauss(0, 1), np.random.rand(), torch.rand(1).item())
    assert got == expected


def test_bench_checkpoint_save(setup: Any) -> None:
    from bench.ckpt_helpers import bench_checkpoint_save

    model, opt, root = setup
    result = bench_checkpoint_save(model, opt, root, repeats=1)
    assert set(result) == {
        "torch_save_s",
        "sync_s",
        "async_blocking_s",
        "async_total_s",
        "bytes",
        "repeats",
    }
    assert result["bytes"] > 0 and result["async_total_s"] >= result["async_blocking_s"] > 0
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("async_save", [False, True])
def test_failed_save_can_be_retried_at_the_same_step(
    setup: Any, monkeypatch: pytest.MonkeyPatch, async_save: bool
) -> None:
    model, opt, root = setup
    cm = CheckpointManager(root, rank=0, world_size=1, async_save=async_save)
    real = train.checkpoint.manifest.write_json_atomic

    def full(*a: Any, **k: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(train.checkpoint.manifest, "write_json_atomic", full)
    with pytest.raises(CheckpointError, match="No space left"):
        _save(cm, model, opt, 4)
        cm.wait()
    assert cm.latest_valid() is None
    monkeypatch.setattr(train.checkpoint.manifest, "write_json_atomic", real)
    assert _save(cm, model, opt, 4) == root / "step-4"
    cm.wait()
    assert cm.latest_valid() == root / "step-4"


def test_async_copy_on_write_covers_wrappers_that_skip_the_models_forward(
    setup: Any, monkeypatch: Any
) -> None:
    """A pipeline-like wrapper calls the model's stages, never the model itself: BatchNorm
    buffers change in those calls, which must also wait for the background copy."""
    model, opt, root = setup
    _slow_saves(monkeypatch, 0.2)
    cm = CheckpointManager(root, rank=0, world_size=1, async_save=True)
    model.train()
    digest = model_digest(model)
    _save(cm, model, opt, 1)
    x = torch.randn(16, 4)
    for stage in model:  # not model(x): the model's own forward hooks never run
        x = stage(x)
    cm.wait()
    assert model_digest(model) != digest  # the BatchNorm running stats moved
    assert json.loads((root / "step-1" / "manifest.json").read_text())["digest"] == digest
    cm.close()


@pytest.mark.parametrize(
    ("make", "why"), [(None, "no such checkpoint"), ("file", "not a checkpoint")]
)
def test_a_resume_path_that_is_no_checkpoint_says_what_it_is(
    tmp_path: Path, make: str | None, why: str
) -> None:
    # `python -m train --resume PATH`: a path naming nothing, or a file, is not "an incomplete
    # save" (that is a checkpoint directory without its manifest, as above)
    from train.checkpoint import read_manifest

    path = tmp_path / "step-9"
    if make == "file":
        path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=f"^{path}: {why}"):
        read_manifest(path)
