"""Atomic, verifiable, optionally asynchronous checkpoints: ``ROOT/step-N/``.

Layout of one checkpoint (a directory made valid by its last atomic step)::

    step-N/shared.pt       rank 0: model (no ``module.`` prefix), optimizer, scheduler, scaler,
                           metrics, ... (whatever the trainer puts in ``shared_state``)
    step-N/rank-R.pt       every rank: its RNG states, sampler position (``rank_state``)
    step-N/manifest.json   written last: step, epoch, epoch_step, world_size, spec_hash,
                           sha256 digest of the model state, time, files with size and sha256

How a save becomes valid (no collective anywhere, so it can finish in a background thread):
every rank writes its file into ``.step-N.tmp/``, fsyncs it and drops a ``rank-R.done`` marker
(JSON with the file's size and sha256). Rank 0 waits for all markers, writes the manifest,
fsyncs, renames ``.step-N.tmp`` to ``step-N`` and fsyncs ``ROOT``. A directory without a valid
manifest, with a file that does not match it, or whose model digest differs is never loaded.
An existing valid ``step-N`` is never replaced, and old checkpoints are pruned only after a newer
one is complete. ``.step-N.tmp`` leftovers are removed by rank 0 when the manager is created,
so create the manager on every rank before the first collective of the run (a save always
follows one).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from torch import nn

from train import ckpt_io as _io
from train.ckpt_io import FORMAT_VERSION, MANIFEST, SHARED_FILE, read_manifest, verify_checkpoint
from train.ckpt_state import (
    capture_rng_state,
    load_model_state,
    make_weights_only_safe,
    model_digest,
    model_state_dict,
    restore_rng_state,
    snapshot_to_cpu,
    state_digest,
    strip_module_prefix,
)
from train.errors import CheckpointError

if TYPE_CHECKING:
    from typing_extensions import Self

    from train.config import TrainConfig

__all__ = [
    "FORMAT_VERSION",
    "CheckpointManager",
    "LoadedCheckpoint",
    "capture_rng_state",
    "load_model_state",
    "model_digest",
    "restore_rng_state",
    "strip_module_prefix",
    "verify_checkpoint",
]

log = logging.getLogger(__name__)

_STEP_RE = _io.STEP_RE
_TMP_RE = re.compile(r"^\.step-(\d+)\.tmp$")
_JUNK_RE = re.compile(r"^\.step-(\d+)\.(del|corrupt)-\d+$")


def _rank_file(rank: int) -> str:
    return f"rank-{rank}.pt"


def _marker(rank: int) -> str:
    return f"rank-{rank}.done"


@dataclass(frozen=True)
class LoadedCheckpoint:
    """What :meth:`CheckpointManager.load` returns; ``rank_state`` is None when the checkpoint
    was written with fewer ranks than this rank's number."""

    path: Path
    shared: dict[str, Any]
    rank_state: dict[str, Any] | None
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def step(self) -> int:
        return int(self.manifest["step"])


class CheckpointManager:
    """Saves, finds and loads checkpoints under ``root`` (normally ``RUN_DIR/checkpoints``).

    Every rank creates one with its ``rank`` and calls :meth:`save` at the same steps.
    ``best_mode``: whether a higher (``"max"``, e.g. accuracy) or lower (``"min"``, loss)
    ``metric`` is better for ``keep_best``.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        rank: int,
        world_size: int,
        keep_last: int = 3,
        keep_best: bool = True,
        async_save: bool = False,
        spec_hash: str = "",
        best_mode: Literal["max", "min"] = "max",
        marker_timeout_s: float = 600.0,
    ) -> None:
        if keep_last < 1:
            raise CheckpointError(f"keep_last must be >= 1, got {keep_last}")
        self.root = Path(root)
        self.rank = rank
        self.world_size = world_size
        self.keep_last = keep_last
        self.keep_best = keep_best
        self.async_save = async_save
        self.spec_hash = spec_hash
        self.best_mode = best_mode
        self.marker_timeout_s = marker_timeout_s
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._last_step: int | None = None
        self.last_blocking_s = 0.0
        self.root.mkdir(parents=True, exist_ok=True)
        if rank == 0:
            self._remove_leftovers()

    @classmethod
    def for_run(cls, run_dir: Path, config: TrainConfig, *, rank: int, world_size: int) -> Self:
        """The manager of ``RUN_DIR/checkpoints`` with the spec's checkpoint settings."""
        from train.config import config_hash

        return cls(
            run_dir / "checkpoints",
            rank=rank,
            world_size=world_size,
            keep_last=config.checkpoint.keep_last,
            keep_best=config.checkpoint.keep_best,
            async_save=config.checkpoint.async_save,
            spec_hash=config_hash(config),
        )

    # -- saving ------------------------------------------------------------------------------
    def save(
        self,
        step: int,
        shared_state: Mapping[str, Any],
        rank_state: Mapping[str, Any],
        *,
        epoch: int,
        epoch_step: int,
        model: nn.Module,
        metric: float | None = None,
    ) -> Path | None:
        """Write checkpoint ``step`` (every rank calls this at the same step).

        Rank 0 stores ``shared_state`` with ``model``'s state dict (no ``module.`` prefix) as
        ``"model"``; every rank stores its ``rank_state``. Returns the checkpoint path (on
        ranks other than 0, and for async saves, where it will appear), or None when this step
        was already saved by this manager. Async: returns after a CPU copy; :meth:`wait` blocks
        until written.
        """
        start = time.perf_counter()
        self.wait()
        if step == self._last_step:
            return None
        final = self.root / f"step-{step}"
        shared: dict[str, Any] | None = None
        if self.rank == 0:
            shared = {str(k): v for k, v in shared_state.items() if k != "model"}
            shared["model"] = model_state_dict(model)
            shared = make_weights_only_safe(shared, "shared_state")
        rank_payload = make_weights_only_safe(dict(rank_state), "rank_state")
        meta = {"step": step, "epoch": epoch, "epoch_step": epoch_step, "metric": metric}
        self._last_step = step
        if not self.async_save:
            try:
                self._write(meta, shared, rank_payload)
            except BaseException as exc:
                self._last_step = None  # a failed save may be retried at the same step
                if isinstance(exc, OSError):
                    raise CheckpointError(f"cannot write checkpoint step-{step}: {exc}") from exc
                raise
        else:
            shared, rank_payload = snapshot_to_cpu((shared, rank_payload))
            self._error = None
            self._thread = threading.Thread(
                target=self._run_background,
                args=(meta, shared, rank_payload),
                name=f"checkpoint-step-{step}",
            )
            self._thread.start()
        self.last_blocking_s = time.perf_counter() - start
        return final

    def wait(self) -> None:
        """Block until the in-flight asynchronous save (if any) is finished; re-raise its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            err, self._error = self._error, None
            self._last_step = None  # a failed save may be retried at the same step
            if isinstance(err, CheckpointError):
                raise err
            raise CheckpointError(f"asynchronous checkpoint save failed: {err}") from err

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run_background(
        self, meta: dict[str, Any], shared: dict[str, Any] | None, rank_payload: dict[str, Any]
    ) -> None:
        try:
            self._write(meta, shared, rank_payload)
        except BaseException as exc:  # reported by the next wait()/save()
            log.error("checkpoint step-%s: background save failed: %s", meta["step"], exc)
            self._error = exc

    def _write(
        self, meta: dict[str, Any], shared: dict[str, Any] | None, rank_payload: dict[str, Any]
    ) -> None:
        step = int(meta["step"])
        tmp = self.root / f".step-{step}.tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        try:
            info = _io.write_torch(rank_payload, tmp / _rank_file(self.rank))
        except OSError as exc:
            raise CheckpointError(f"cannot write checkpoint {tmp}: {exc}") from exc
        _io.test_delay()
        _io.write_json_atomic({"rank": self.rank, "step": step, **info}, tmp / _marker(self.rank))
        if self.rank != 0:
            return
        assert shared is not None
        try:
            files = {SHARED_FILE: _io.write_torch(shared, tmp / SHARED_FILE)}
        except OSError as exc:
            raise CheckpointError(f"cannot write checkpoint {tmp}: {exc}") from exc
        _io.test_delay()
        files.update(self._collect_markers(tmp, step))
        manifest = {
            "format": FORMAT_VERSION,
            **meta,
            "world_size": self.world_size,
            "spec_hash": self.spec_hash,
            "digest": state_digest(shared["model"]),
            "time": time.time(),
            "files": files,
        }
        _io.write_json_atomic(manifest, tmp / MANIFEST)
        for r in range(self.world_size):
            (tmp / _marker(r)).unlink(missing_ok=True)
        _io.fsync_dir(tmp)
        _io.test_delay()
        self._commit(tmp, self.root / f"step-{step}")
        self._prune(keep=step)

    def _collect_markers(self, tmp: Path, step: int) -> dict[str, dict[str, Any]]:
        """Wait until every rank's marker exists; return their file entries."""
        deadline = time.monotonic() + self.marker_timeout_s
        files: dict[str, dict[str, Any]] = {}
        pending = set(range(self.world_size))
        while pending:
            for r in sorted(pending):
                try:
                    marker = json.loads((tmp / _marker(r)).read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
                if marker.get("step") == step:
                    files[_rank_file(r)] = {"size": marker["size"], "sha256": marker["sha256"]}
                    pending.discard(r)
            if pending:
                if time.monotonic() > deadline:
                    raise CheckpointError(
                        f"checkpoint step-{step}: ranks {sorted(pending)} did not finish writing "
                        f"within {self.marker_timeout_s:g}s (did a rank die?)"
                    )
                time.sleep(0.02)
        return files

    def _commit(self, tmp: Path, final: Path) -> None:
        """Put the complete ``tmp`` in place as ``final``; never destroy a valid ``final``.

        An existing valid ``step-N`` (e.g. written before a ``--resume`` from an older step) is
        swapped atomically with the new one and only then deleted; where an atomic swap is not
        possible the existing one is kept and the new copy discarded.
        """
        if final.exists():
            try:
                verify_checkpoint(final)
            except CheckpointError as exc:
                aside = final.with_name(f".{final.name}.corrupt-{time.time_ns()}")
                log.warning("replacing invalid %s (%s); kept as %s", final, exc, aside.name)
                os.rename(final, aside)
            else:
                if _io.exchange(tmp, final):
                    _io.fsync_dir(self.root)
                    log.warning("%s existed; replaced it atomically with this run's", final)
                else:
                    log.warning("%s already exists and is valid; keeping it", final)
                shutil.rmtree(tmp, ignore_errors=True)  # the old one after a swap, else the new
                return
        os.rename(tmp, final)
        _io.fsync_dir(self.root)
        log.info("checkpoint saved: %s", final)

    # -- housekeeping ------------------------------------------------------------------------
    def _step_dirs(self) -> list[tuple[int, Path]]:
        out = []
        for p in self.root.iterdir():
            m = _STEP_RE.match(p.name)
            if m and p.is_dir():
                out.append((int(m.group(1)), p))
        return sorted(out, reverse=True)

    def _remove_leftovers(self) -> None:
        for p in self.root.iterdir():
            if _TMP_RE.match(p.name):
                log.warning("removing %s: an incomplete checkpoint from an interrupted save", p)
                shutil.rmtree(p, ignore_errors=True)
            elif _JUNK_RE.match(p.name):
                shutil.rmtree(p, ignore_errors=True)

    def _prune(self, keep: int) -> None:
        """Keep the newest ``keep_last`` checkpoints and the best one; delete the others.

        Runs only after checkpoint ``keep`` is complete, so the only good one is never removed.
        """
        dirs = self._step_dirs()
        kept = {s for s, _ in dirs[: self.keep_last]} | {keep}
        if self.keep_best:
            best: tuple[float, int] | None = None
            for s, p in dirs:
                try:
                    metric = read_manifest(p).get("metric")
                except CheckpointError:
                    continue
                if isinstance(metric, int | float):
                    score = float(metric) if self.best_mode == "max" else -float(metric)
                    if best is None or score > best[0]:
                        best = (score, s)
            if best is not None:
                kept.add(best[1])
        for s, p in dirs:
            if s in kept:
                continue
            # rename first: a half-deleted directory must never look like a checkpoint
            doomed = p.with_name(f".{p.name}.del-{time.time_ns()}")
            try:
                os.rename(p, doomed)
            except OSError:
                continue
            shutil.rmtree(doomed, ignore_errors=True)

    # -- finding and loading -----------------------------------------------------------------
    def checkpoints(self) -> list[Path]:
        """All ``step-N`` directories, newest first (valid or not)."""
        return [p for _, p in self._step_dirs()]

    def latest_valid(self) -> Path | None:
        """The newest checkpoint that verifies completely; invalid newer ones are skipped with a
        warning. None when there is none (the caller starts fresh)."""
        dirs = self._step_dirs()
        newest = dirs[0][0] if dirs else -1
        for p in self.root.iterdir():
            m = _TMP_RE.match(p.name)
            if m and int(m.group(1)) >= newest:
                log.warning("skipping %s: incomplete checkpoint (interrupted save)", p.name)
        for _, p in dirs:
            try:
                verify_checkpoint(p)
            except CheckpointError as exc:
                log.warning("skipping invalid checkpoint: %s", exc)
                continue
            return p
        return None

    def load(self, path: str | os.PathLike[str], rank: int | None = None) -> LoadedCheckpoint:
        """Verify and load checkpoint ``path`` for ``rank`` (default: this manager's rank).

        Tensors are loaded to CPU with ``weights_only=True``; move them with the model's
        ``load_state_dict`` / the optimizer's, which place them on the right device.
        """
        p = Path(path)
        r = self.rank if rank is None else rank
        # this rank reads shared.pt and its own file: verify those (and the digest) only
        manifest, shared = _io.verify(p, only={_rank_file(r)})
        if self.spec_hash and manifest.get("spec_hash") not in ("", self.spec_hash):
            log.warning(
                "%s was written with a different training config (spec hash %s, now %s); "
                "resuming anyway",
                p,
                manifest.get("spec_hash"),
                self.spec_hash,
            )
        rank_state: dict[str, Any] | None = None
        if _rank_file(r) in manifest["files"]:
            rank_state = _io.torch_load(p / _rank_file(r))
        else:
            log.warning(
                "%s was written by %s ranks; rank %s starts with fresh RNG/sampler state",
                p,
                manifest["world_size"],
                r,
            )
        return LoadedCheckpoint(path=p, shared=shared, rank_state=rank_state, manifest=manifest)

    def close(self) -> None:
        """Finish any in-flight save (call before the process exits); raises its error."""
        self.wait()
