"""File-level pieces of checkpoints: fsynced writes, sha256, manifests and verification.

A checkpoint directory is valid only when its ``manifest.json`` is well-formed, every file it
lists has the recorded size and sha256, and the digest of the model state in ``shared.pt``
matches (:func:`verify_checkpoint`). Everything is read with ``torch.load(weights_only=True)``.
Used by :mod:`train.checkpoint`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import torch

from train.ckpt_state import state_digest
from train.errors import CheckpointError

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "SHARED_FILE",
    "TEST_DELAY_ENV",
    "fsync_dir",
    "read_manifest",
    "sha256_file",
    "torch_load",
    "verify",
    "verify_checkpoint",
    "write_json_atomic",
    "write_torch",
]

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SHARED_FILE = "shared.pt"
# Test hook: seconds to sleep between the files of a save, so a test can SIGKILL a process in
# the middle of writing a checkpoint. Never set in production.
TEST_DELAY_ENV = "TRAIN_CKPT_TEST_DELAY_S"
STEP_RE = re.compile(r"^step-(\d+)$")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_torch(obj: Any, path: Path) -> dict[str, Any]:
    """torch.save + fsync; returns the file's size and sha256 for the manifest."""
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


def write_json_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def test_delay() -> None:
    delay = os.environ.get(TEST_DELAY_ENV)
    if delay:
        time.sleep(float(delay))


def torch_load(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of checkpoint directory ``path`` (CheckpointError if missing/malformed)."""
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path}: no {MANIFEST} (incomplete save)") from exc
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable {MANIFEST}: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: {MANIFEST} is not a format-{FORMAT_VERSION} manifest")
    for key in ("step", "world_size", "digest", "files"):
        if key not in manifest:
            raise CheckpointError(f"{path}: {MANIFEST} lacks {key!r}")
    return manifest


def verify(path: Path, only: set[str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Verify checkpoint ``path`` (all files, or those in ``only`` plus shared.pt); return the
    manifest and the loaded shared state (loaded once, used for the digest check)."""
    manifest = read_manifest(path)
    m = STEP_RE.match(path.name)
    if m and int(m.group(1)) != int(manifest["step"]):
        raise CheckpointError(f"{path}: manifest says step {manifest['step']}")
    if SHARED_FILE not in manifest["files"]:
        raise CheckpointError(f"{path}: {MANIFEST} does not list {SHARED_FILE}")
    for name, info in manifest["files"].items():
        if only is not None and name not in only and name != SHARED_FILE:
            continue
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{path}: {name} is missing")
        if f.stat().st_size != info["size"]:
            raise CheckpointError(
                f"{path}: {name} has {f.stat().st_size} bytes, manifest says {info['size']} "
                "(truncated?)"
            )
        if sha256_file(f) != info["sha256"]:
            raise CheckpointError(f"{path}: {name} does not match its sha256 (corrupted)")
    try:
        shared = torch_load(path / SHARED_FILE)
    except Exception as exc:
        raise CheckpointError(f"{path}: {SHARED_FILE} cannot be loaded: {exc}") from exc
    if not isinstance(shared, dict) or state_digest(shared.get("model", {})) != manifest["digest"]:
        raise CheckpointError(f"{path}: model digest does not match the manifest")
    return manifest, shared


def verify_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Check a checkpoint completely; return its manifest or raise CheckpointError saying why.

    Checks: manifest present and well-formed, step matches the directory name, every listed
    file present with the recorded size and sha256, and the model digest of ``shared.pt``.
    """
    return verify(Path(path))[0]


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two directories (Linux ``renameat2(RENAME_EXCHANGE)``).

    Returns False where the kernel, C library or file system cannot (the caller then keeps
    the existing directory): at no moment is neither of the two in place.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return int(rc) == 0
