"""File-level pieces of checkpoints: names, manifests, checks, small atomic JSON writes.

A checkpoint directory is valid only when it is a real directory (not a symbolic link), its
``manifest.json`` is well-formed (:func:`check_manifest`: every field of the right type, file
names plain names inside the directory), every file it lists is a regular file with the
recorded size and digest, and the digest of the model state in ``shared.pt`` matches
(:func:`verify_checkpoint`). Everything is read with ``torch.load(weights_only=True)``. A
manifest that fails any check makes the checkpoint invalid exactly like a half-written one:
callers skip it and use the previous valid checkpoint; nothing here raises anything but
:class:`~train.errors.CheckpointError` for bad content.

Files are written by :mod:`train.checkpoint.write` (at the disk's speed, hashed inline); this module
reads and checks them. Used by :mod:`train.checkpoint.manager`.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train.checkpoint.digest import (
    ALGORITHMS,
    HEX_LENGTH,
    hash_file,
    state_digest,
)
from train.errors import CheckpointError
from train.runfiles import atomic_write

# The split of the global batch a checkpoint of the built-in trainer was trained with
# (train.loop.order.BatchSplit.to_json): a resume keeps its micro-batch.
SPLIT_KEYS = ("world_size", "grad_accum", "micro_batch")

__all__ = [
    "MANIFEST",
    "SHARED_FILE",
    "LoadedCheckpoint",
    "check_line",
    "check_manifest",
    "fsync_dir",
    "marker_file",
    "rank_file",
    "read_manifest",
    "torch_load",
    "verify",
    "verify_checkpoint",
    "write_json_atomic",
    "written_split",
]

MANIFEST = "manifest.json"
SHARED_FILE = "shared.pt"
# ``step-N`` (branch 0) or ``step-N.bB`` (branch B: train.checkpoint.branches)
STEP_RE = re.compile(r"^step-(\d+)(?:\.b([1-9]\d{0,8}))?$")
#: at most this many fork points on one line (a damaged manifest cannot make a huge one)
MAX_DEPTH = 10_000
# what a file listed in a manifest may be called: a plain name inside the checkpoint directory
_FILE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_HEX_RE = re.compile(r"[0-9a-f]+")


def rank_file(rank: int) -> str:
    """The file every rank writes into a checkpoint (its RNG states, sampler position)."""
    return f"rank-{rank}.pt"


def marker_file(rank: int) -> str:
    """The marker rank ``rank`` drops in ``.step-N.tmp/`` once its file is written (JSON)."""
    return f"rank-{rank}.done"


@dataclass(frozen=True)
class LoadedCheckpoint:
    """What :meth:`train.checkpoint.manager.CheckpointManager.load` returns; ``rank_state`` is None
    when
    the checkpoint was written with fewer ranks than this rank's number."""

    path: Path
    shared: dict[str, Any]
    rank_state: dict[str, Any] | None
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def step(self) -> int:
        return int(self.manifest["step"])


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(obj: Any, path: Path, *, durable: bool = True) -> None:
    """Write JSON to ``path`` through a rename. ``durable``: fsync the file and its directory
    (False for rank markers: they only coordinate ranks, a crash discards the save anyway)."""
    # the owner's atomic write (through NAME.partial, the format's temporary name): a link
    # planted there is refused, never written through
    text = json.dumps(obj, indent=1, sort_keys=True)
    atomic_write(path, text, durable=durable, temp=path.name + ".partial")


def torch_load(path: Path) -> Any:
    import torch  # here: choosing a checkpoint (manifests, digests) needs no torch

    return torch.load(path, map_location="cpu", weights_only=True)


def _is_int(v: object, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def check_manifest(manifest: object, where: str | Path = "manifest") -> dict[str, Any]:
    """Return ``manifest`` if every field has the right type; CheckpointError naming the first
    that does not. A foreign, damaged or half-edited manifest is refused here, so no later
    reader (``int(m["epoch"])``, ``m["files"].items()``) can crash on it."""

    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"{where}: damaged {MANIFEST}: {why}")

    fmt = manifest.get("format") if isinstance(manifest, dict) else None
    if not isinstance(manifest, dict) or not _is_int(fmt) or fmt not in ALGORITHMS:
        known = " or ".join(str(f) for f in sorted(ALGORITHMS))
        raise CheckpointError(f"{where}: {MANIFEST} is not a format-{known} manifest")
    algo = ALGORITHMS[fmt]

    def is_hex(v: object) -> bool:
        return isinstance(v, str) and len(v) == HEX_LENGTH[algo] and bool(_HEX_RE.fullmatch(v))

    for key in ("step", "epoch", "epoch_step", "world_size", "digest", "files"):
        if key not in manifest:
            raise CheckpointError(f"{where}: {MANIFEST} lacks {key!r}")
    for key in ("step", "epoch", "epoch_step"):
        if not _is_int(manifest[key]):
            raise bad(f"{key} is {manifest[key]!r}, not a whole number >= 0")
    if not _is_int(manifest["world_size"], 1):
        raise bad(f"world_size is {manifest['world_size']!r}, not a whole number >= 1")
    if not is_hex(manifest["digest"]):
        raise bad(f"digest is not a {algo} hex string")
    metric = manifest.get("metric")
    if metric is not None and (isinstance(metric, bool) or not isinstance(metric, int | float)):
        raise bad(f"metric is {metric!r}, not a number or null")
    for key in ("spec_hash", "run_id"):
        if manifest.get(key) is not None and not isinstance(manifest[key], str):
            raise bad(f"{key} is {manifest[key]!r}, not a string")
    split = manifest.get("split")
    if split is not None and not (
        isinstance(split, dict) and all(_is_int(split.get(k), 1) for k in SPLIT_KEYS)
    ):
        raise bad(f"split is {split!r}, not {{{', '.join(SPLIT_KEYS)}: whole numbers >= 1}}")
    check_line(manifest, where)
    files = manifest["files"]
    if not isinstance(files, dict) or not files:
        raise bad("files is not a mapping of file names")
    for name, info in files.items():
        if not _FILE_RE.match(name):
            raise bad(f"lists {name!r}, not a plain file name inside the checkpoint")
        if not (isinstance(info, dict) and _is_int(info.get("size"))):
            raise bad(f"{name}: no size")
        if not is_hex(info.get(algo)):
            raise bad(f"{name}: no {algo}")
    return manifest


def written_split(manifest: dict[str, Any]) -> dict[str, int] | None:
    """The split (world_size, grad_accum, micro_batch) the checkpoint was trained with, as its
    (checked) manifest records it; None for a checkpoint that records none (an older one, or
    user code's)."""
    split = manifest.get("split")
    return {k: int(split[k]) for k in SPLIT_KEYS} if isinstance(split, dict) else None


def check_line(data: dict[str, Any], where: str | Path) -> tuple[int, tuple[tuple[int, int], ...]]:
    """``branch`` and ``parents`` of a manifest or ``branch.json``
    (:mod:`train.checkpoint.branches`); absent: branch 0 without parents. CheckpointError naming
    a field of the wrong type or shape."""

    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"{where}: damaged branch record: {why}")

    branch = data.get("branch", 0)
    parents = data.get("parents", [])
    if not _is_int(branch):
        raise bad(f"branch is {branch!r}, not a whole number >= 0")
    if not isinstance(parents, list) or len(parents) > MAX_DEPTH:
        raise bad("parents is not a list of [branch, step] pairs")
    out: list[tuple[int, int]] = []
    for p in parents:
        if not (isinstance(p, list) and len(p) == 2 and _is_int(p[0]) and _is_int(p[1])):
            raise bad(f"parents holds {p!r}, not a [branch, step] pair")
        out.append((p[0], p[1]))
    seen = [branch, *(b for b, _ in out)]
    if len(set(seen)) != len(seen):
        raise bad(f"parents repeat a branch ({seen})")
    if (branch == 0) != (not out):
        raise bad("branch 0 and only branch 0 has no parents")
    return branch, tuple(out)


def _refuse_link(path: Path) -> None:
    if path.is_symlink():
        raise CheckpointError(
            f"{path}: is a symbolic link; checkpoints are never read or written through links"
        )


def read_manifest(path: Path) -> dict[str, Any]:
    """The checked manifest of checkpoint directory ``path`` (CheckpointError if missing,
    unreadable, damaged, foreign, or if ``path`` is a symbolic link)."""
    _refuse_link(path)
    try:
        manifest = json.loads((path / MANIFEST).read_bytes().decode("utf-8"))
    except FileNotFoundError as exc:
        if not path.exists():  # a --resume PATH that names nothing
            raise CheckpointError(f"{path}: no such checkpoint") from exc
        raise CheckpointError(f"{path}: no {MANIFEST} (incomplete save)") from exc
    except NotADirectoryError as exc:
        raise CheckpointError(
            f"{path}: not a checkpoint (a checkpoint is a directory with a {MANIFEST})"
        ) from exc
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{path}: unreadable {MANIFEST}: {exc}") from exc
    return check_manifest(manifest, path)


def _check_file(path: Path, name: str, info: dict[str, Any], algo: str) -> None:
    f = path / name
    try:
        st = f.lstat()
    except OSError:
        raise CheckpointError(f"{path}: {name} is missing") from None
    if stat.S_ISLNK(st.st_mode):
        _refuse_link(f)
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{path}: {name} is missing (not a regular file)")
    if st.st_size != info["size"]:
        raise CheckpointError(
            f"{path}: {name} has {st.st_size} bytes, manifest says {info['size']} (truncated?)"
        )
    if hash_file(f, algo) != info[algo]:
        raise CheckpointError(f"{path}: {name} does not match its {algo} (corrupted)")


def verify(path: Path, only: set[str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Verify checkpoint ``path`` (all files, or those in ``only`` plus shared.pt); return the
    manifest and the loaded shared state (loaded once, used for the digest check)."""
    manifest = read_manifest(path)
    m = STEP_RE.match(path.name)
    if m and int(m.group(1)) != manifest["step"]:
        raise CheckpointError(f"{path}: manifest says step {manifest['step']}")
    if m and int(m.group(2) or 0) != manifest.get("branch", 0):
        raise CheckpointError(f"{path}: manifest says branch {manifest.get('branch', 0)}")
    if SHARED_FILE not in manifest["files"]:
        raise CheckpointError(f"{path}: {MANIFEST} does not list {SHARED_FILE}")
    algo = ALGORITHMS[manifest["format"]]
    for name, info in manifest["files"].items():
        if only is None or name in only or name == SHARED_FILE:
            _check_file(path, name, info, algo)
    try:
        shared = torch_load(path / SHARED_FILE)
    except Exception as exc:
        raise CheckpointError(f"{path}: {SHARED_FILE} cannot be loaded: {exc}") from exc
    model = shared.get("model") if isinstance(shared, dict) else None
    if not isinstance(model, dict) or state_digest(model, algo) != manifest["digest"]:
        raise CheckpointError(f"{path}: model digest does not match the manifest")
    return manifest, shared


def verify_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Check a checkpoint completely; return its manifest or raise CheckpointError saying why.

    Checks: a real directory, manifest present and well-formed, step matches the directory
    name, every listed file a regular file with the recorded size and digest, and the model
    digest of ``shared.pt``.
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
