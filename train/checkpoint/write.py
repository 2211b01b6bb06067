"""Checkpoint files written at the disk's speed, hashed as they are written.

``torch.save`` hands its chunks to :class:`_DiskWriter`, which hashes each one inline
(xxh3-128, ~30 GB/s: why that digest, see :mod:`train.checkpoint.digest`), writes it with
``os.write``
(small records are gathered first, big tensors go in 8 MiB slices) and, every 8 MiB, asks the
kernel to start writing those pages to the disk (``sync_file_range(SYNC_FILE_RANGE_WRITE)``,
Linux; elsewhere nothing). The disk therefore works while the rest is still being copied, and
the closing ``fsync`` only waits for the tail: it is still what makes the file durable.
torch.save's own per-record CRC32 is switched off for our files (a second pass over the bytes;
the digest covers them). Measured (``python -m bench --only ckpt``): a synchronous save of the
52.6 MB ResNet-9 state writes at ~1.0x a plain write + fsync of the same number of bytes.
Used by :mod:`train.checkpoint.manager`; read back and checked by :mod:`train.checkpoint.manifest`.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, cast

import torch
from torch.utils.serialization import config as _serialization_config

from train.checkpoint.digest import ALGORITHMS, FORMAT_VERSION, new_hasher

__all__ = ["write_torch"]


# torch.save's zip writer computes a CRC32 of every record by default (a second pass over the
# bytes); the digest computed while writing covers the same bytes, so our saves switch it off.
# The setting is process-global: it is off while any of our saves runs and restored after the
# last (another torch.save running at that moment may skip it).
class _NoZipCrc:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._saved = True

    def __enter__(self) -> None:
        with self._lock:
            if self._users == 0:
                self._saved = _serialization_config.save.compute_crc32
                _serialization_config.save.compute_crc32 = False
            self._users += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                _serialization_config.save.compute_crc32 = self._saved


_NO_ZIP_CRC = _NoZipCrc()


_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the range, do not wait


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], fn)


_sync_file_range = _load_sync_file_range()


class _DiskWriter:
    """A write-only file object for ``torch.save`` over a raw descriptor (see the module doc).

    Every chunk is hashed, then written (or, when small, copied into one buffer that is written
    when it fills) before ``write`` returns: ``torch.save`` may free a GPU storage's host copy
    right after. Every
    ``writeback_every`` bytes the written range is handed to the disk with ``sync_file_range``;
    a file system that refuses it just stops being asked.
    """

    SMALL = 1 << 16  # chunks below this are gathered (torch.save's headers and small records)

    def __init__(self, fd: int, algo: str, writeback_every: int = 8 << 20) -> None:
        self.fd = fd
        self.hash = new_hasher(algo)
        self.size = 0  # bytes handed to the kernel
        self._pending = bytearray()
        self._every = writeback_every
        self._started = 0  # start of the range not yet handed to the disk
        self._writeback = _sync_file_range

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = view.nbytes
        self.hash.update(view)
        if n < self.SMALL:
            self._pending += view
            if len(self._pending) >= self.SMALL:
                self._drain()
        else:
            self._drain()
            # a big tensor in slices: the disk starts on its first pages while the rest is
            # still being copied
            for at in range(0, n, self._every):
                self._write_all(view[at : at + self._every])
        return n

    def _drain(self) -> None:
        if self._pending:
            self._write_all(memoryview(self._pending))
            self._pending = bytearray()

    def _write_all(self, view: memoryview) -> None:
        while view.nbytes:
            k = os.write(self.fd, view)
            view = view[k:]
            self.size += k
        if self._writeback is not None and self.size - self._started >= self._every:
            if (
                self._writeback(
                    self.fd, self._started, self.size - self._started, _SYNC_FILE_RANGE_WRITE
                )
                != 0
            ):
                self._writeback = None
            self._started = self.size

    def flush(self) -> None:
        self._drain()

    def digest(self) -> str:
        return self.hash.hexdigest()


def write_torch(obj: Any, path: Path) -> dict[str, Any]:
    """torch.save + fsync at the disk's speed, hashed as written (see the module docstring).

    Returns the file's entry for the manifest: its size and its digest (keyed by the
    algorithm's name). Refuses to write through a symbolic link.
    """
    algo = ALGORITHMS[FORMAT_VERSION]
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    flags |= getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o644)
    try:
        w = _DiskWriter(fd, algo)
        with _NO_ZIP_CRC:
            torch.save(obj, cast(IO[bytes], w))  # only write() and flush() are used
        w.flush()
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"size": w.size, algo: w.digest()}
