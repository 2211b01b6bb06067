"""The checkpoint file writer and digests (issue 17): xxh3-128 written, format-1 sha256 read.

- ``write_torch`` produces exactly what ``torch.save`` would, hashed inline: the entry's size
  and xxh3-128 are those of the bytes on disk, small records are gathered, big ones written
  as they come, and the disk writeback is started over contiguous ranges that cover the file;
- a file system that refuses ``sync_file_range`` only stops being asked;
- checkpoints written before (manifest format 1, sha256 everywhere) still verify and load, and
  damage in them is still caught.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash
from torch import nn

import train.checkpoint.manifest as ckpt_io
import train.checkpoint.write as ckpt_write
from train.checkpoint import (
    CheckpointManager,
    capture_rng_state,
    latest_valid,
    model_digest,
    verify_checkpoint,
)
from train.checkpoint.digest import hash_file, state_digest
from train.errors import CheckpointError


def _state() -> dict[str, Any]:
    torch.manual_seed(0)
    return {
        "big": torch.randn(600_000),  # 2.4 MB: written as it comes
        "small": [torch.arange(5), 3, "x"],  # records below 64 KiB: gathered
        "half": torch.randn(10, 10).to(torch.bfloat16),
    }


def test_write_torch_is_torch_save_hashed_inline(tmp_path: Path) -> None:
    state = _state()
    entry = ckpt_write.write_torch(state, tmp_path / "a.pt")
    data = (tmp_path / "a.pt").read_bytes()
    assert set(entry) == {"size", "xxh3_128"}
    assert entry["size"] == len(data)
    assert entry["xxh3_128"] == xxhash.xxh3_128(data).hexdigest()
    back = torch.load(tmp_path / "a.pt", weights_only=True)
    assert torch.equal(back["big"], state["big"]) and torch.equal(back["half"], state["half"])
    assert back["small"][1:] == [3, "x"]
    # the same bytes torch.save writes (with its zip CRC off, as ours is)
    ref = io.BytesIO()
    with ckpt_write._NO_ZIP_CRC:
        torch.save(state, ref)
    assert data == ref.getvalue()


def test_writeback_is_started_over_the_whole_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ckpt_write._sync_file_range
    if real is None:
        pytest.skip("sync_file_range: Linux only")
    calls: list[tuple[int, int]] = []

    def record(fd: int, offset: int, nbytes: int, flags: int) -> int:
        calls.append((offset, nbytes))
        return real(fd, offset, nbytes, flags)

    monkeypatch.setattr(ckpt_write, "_sync_file_range", record)
    fd = os.open(tmp_path / "b.pt", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        w = ckpt_write._DiskWriter(fd, "xxh3_128", writeback_every=1 << 20)
        torch.save({"t": torch.randn(1_000_000)}, w)  # type: ignore[arg-type]
        w.flush()
    finally:
        os.close(fd)
    assert len(calls) >= 3
    # contiguous ranges from 0, each at least the threshold, never past what was written
    assert calls[0][0] == 0
    for (o1, n1), (o2, _) in itertools.pairwise(calls):
        assert o2 == o1 + n1 and n1 >= 1 << 20
    assert calls[-1][0] + calls[-1][1] <= w.size == (tmp_path / "b.pt").stat().st_size


def test_refused_writeback_stops_being_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def refuse(fd: int, offset: int, nbytes: int, flags: int) -> int:
        calls.append(offset)
        return -1  # e.g. ESPIPE / EINVAL on a file system without it

    monkeypatch.setattr(ckpt_write, "_sync_file_range", refuse)
    big = {"t": torch.randn(6_000_000)}  # 24 MB: three 8 MiB ranges
    entry = ckpt_write.write_torch(big, tmp_path / "c.pt")
    assert calls == [0]
    assert entry["size"] == (tmp_path / "c.pt").stat().st_size
    assert torch.equal(torch.load(tmp_path / "c.pt", weights_only=True)["t"], big["t"])


def test_write_refuses_a_link(tmp_path: Path) -> None:
    (tmp_path / "target").write_text("keep")
    (tmp_path / "link.pt").symlink_to(tmp_path / "target")
    with pytest.raises(OSError):
        ckpt_write.write_torch({"t": torch.zeros(3)}, tmp_path / "link.pt")
    assert (tmp_path / "target").read_text() == "keep"


# -- format 1: what the previous release wrote -------------------------------------------------
def _old_state_digest(state_dict: dict[str, Any]) -> str:
    """The format-1 model digest, spelled out as it was written (sha256, same framing)."""
    h = hashlib.sha256()
    for key in sorted(state_dict):
        t = state_dict[key].detach().contiguous()
        h.update(key.encode())
        h.update(f"|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def _as_format_1(path: Path) -> None:
    m = json.loads((path / "manifest.json").read_text())
    m["format"] = 1
    shared = torch.load(path / "shared.pt", weights_only=True)
    m["digest"] = _old_state_digest(shared["model"])
    m["files"] = {
        name: {
            "size": info["size"],
            "sha256": hashlib.sha256((path / name).read_bytes()).hexdigest(),
        }
        for name, info in m["files"].items()
    }
    (path / "manifest.json").write_text(json.dumps(m))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _save(cm: CheckpointManager, model: nn.Module, step: int) -> Path:
    cm.save(step, {"x": step}, {"rng": capture_rng_state()}, epoch=0, epoch_step=step, model=model)
    cm.wait()
    return cm.root / f"step-{step}"


def test_format_1_checkpoints_still_verify_and_load(tmp_path: Path) -> None:
    model = _model()
    cm = CheckpointManager(tmp_path, rank=0, world_size=1)
    path = _save(cm, model, 1)
    _as_format_1(path)
    manifest = verify_checkpoint(path)
    assert manifest["format"] == 1 and len(manifest["digest"]) == 64
    assert state_digest(model.state_dict(), "sha256") == manifest["digest"]
    assert hash_file(path / "shared.pt", "sha256") == manifest["files"]["shared.pt"]["sha256"]
    assert latest_valid(tmp_path) == path
    fresh = CheckpointManager(tmp_path, rank=0, world_size=1)
    loaded = fresh.load(path)
    assert loaded.shared["x"] == 1
    # the next save of the resumed run is format 2, beside the old one
    new = _save(fresh, model, 2)
    assert json.loads((new / "manifest.json").read_text())["format"] == 2
    assert verify_checkpoint(new)["digest"] == model_digest(model)


def test_damage_in_a_format_1_checkpoint_is_caught(tmp_path: Path) -> None:
    model = _model()
    cm = CheckpointManager(tmp_path, rank=0, world_size=1, keep_last=5)
    _as_format_1(_save(cm, model, 1))
    _as_format_1(_save(cm, model, 2))
    data = bytearray((tmp_path / "step-2" / "rank-0.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (tmp_path / "step-2" / "rank-0.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        verify_checkpoint(tmp_path / "step-2")
    assert latest_valid(tmp_path) == tmp_path / "step-1"
    # an xxh3 digest in a format-1 manifest is damage too
    m = json.loads((tmp_path / "step-1" / "manifest.json").read_text())
    m["digest"] = "0" * 32
    (tmp_path / "step-1" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="not a sha256 hex string"):
        verify_checkpoint(tmp_path / "step-1")


def test_a_digest_with_a_trailing_newline_is_damage(tmp_path: Path) -> None:
    path = _save(CheckpointManager(tmp_path, rank=0, world_size=1), _model(), 1)
    m = json.loads((path / "manifest.json").read_text())
    ckpt_io.check_manifest(m)
    m["digest"] = m["digest"][:31] + "\n"
    with pytest.raises(CheckpointError, match="not a xxh3_128 hex string"):
        ckpt_io.check_manifest(m)
