"""The checkpoint manager: saves, finds, loads and prunes ``ROOT/step-N/`` (the protocol is
drawn in :mod:`train.checkpoint`)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from train.checkpoint import branches as _branches
from train.checkpoint import dirs as _dirs
from train.checkpoint import manifest as _io
from train.checkpoint.branches import Line
from train.checkpoint.digest import FORMAT_VERSION
from train.checkpoint.dirs import latest_valid
from train.checkpoint.manifest import (
    MANIFEST,
    SHARED_FILE,
    LoadedCheckpoint,
)
from train.errors import CheckpointError
from train.runfiles import CHECKPOINTS

if TYPE_CHECKING:
    from torch import nn
    from typing_extensions import Self

    from train.checkpoint.state import Snapshotter
    from train.spec import TrainConfig

__all__ = ["SAVE_PHASE_HOOKS", "CheckpointManager"]

log = logging.getLogger(__name__)

#: Called with the name of each phase of a save as it completes ("snapshot", "rank file",
#: "shared file", "manifest"), in the thread that saves: observers (a test's delay, a
#: progress beat) hook in here; nothing is called when the list is empty.
SAVE_PHASE_HOOKS: list[Callable[[str], None]] = []


def _phase(name: str) -> None:
    for hook in SAVE_PHASE_HOOKS:
        hook(name)


class CheckpointManager:
    """Saves, finds and loads checkpoints under ``root`` (normally ``RUN_DIR/checkpoints``).

    Every rank creates one with its ``rank`` and calls :meth:`save` at the same steps.
    ``best_mode``: whether a higher (``"max"``, e.g. accuracy) or lower (``"min"``, loss)
    ``metric`` is better for ``keep_best``. ``run_id``: recorded in every manifest; only
    checkpoints of owned runs are pruned or replaced (see the module docstring). Give every
    rank the same one; None: a fresh id (this manager owns only what it writes or resumes).
    ``line``: the branch it saves on and follows (:mod:`train.checkpoint.branches`); None: the
    current one (``ROOT/branch.json``; rank 0 alone falls back to the manifests without it).
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
        run_id: str | None = None,
        line: Line | None = None,
        tidy: bool = True,
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
        # one long-lived worker: handing a save to it costs no thread start on the training
        # path; it finishes a save in flight when the interpreter exits (ThreadPoolExecutor)
        self._saver: ThreadPoolExecutor | None = None
        self._future: Future[None] | None = None
        self._error: BaseException | None = None
        self._last_step: int | None = None
        self.last_blocking_s = 0.0
        self.run_id = run_id or uuid.uuid4().hex
        self._owned = {self.run_id}
        self._saved = False  # until the first save, loading from ROOT adopts that run's id
        self._snapshotter: Snapshotter | None = None  # made on the first async save
        self._pool: ThreadPoolExecutor | None = None
        self._deleting: Future[None] | None = None
        #: Around rank 0's wait for the other ranks' parts of a checkpoint (waiting for peers,
        #: not work: the run session tells its hang watchdog so; nothing by default).
        self.collect_wait: Callable[[], contextlib.AbstractContextManager[Any]] = (
            contextlib.nullcontext
        )
        #: Whether the step is ending under this rank (srun's TERM at a peer's bad exit; the run
        #: session says so): rank 0 then stops waiting for a part that no longer moves
        #: (:func:`train.checkpoint.dirs.collect_markers`). Never, by default.
        self.step_ending: Callable[[], bool] | None = None
        self.root.mkdir(parents=True, exist_ok=True)
        self.line = line if line is not None else _branches.current(self.root, scan=rank == 0)
        if async_save:  # start the worker now, not on the training path of the first save
            self._saver_pool().submit(lambda: None).result()
        if rank == 0 and tidy:  # not under a command started first: its saves, not leftovers
            _dirs.remove_leftovers(self.root)

    @classmethod
    def for_run(
        cls,
        run_dir: Path,
        config: TrainConfig,
        *,
        rank: int,
        world_size: int,
        run_id: str | None = None,
        tidy: bool = True,
    ) -> Self:
        """The manager of ``RUN_DIR/checkpoints`` with the spec's checkpoint settings."""
        from train.spec import config_hash

        return cls(
            run_dir / CHECKPOINTS,
            rank=rank,
            world_size=world_size,
            keep_last=config.checkpoint.keep_last,
            keep_best=config.checkpoint.keep_best,
            async_save=config.checkpoint.async_save,
            spec_hash=config_hash(config),
            run_id=run_id,
            tidy=tidy,
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
        split: Mapping[str, int] | None = None,
    ) -> Path | None:
        """Write checkpoint ``step`` (every rank calls this at the same step).

        ``split``: how the global batch was computed (the built-in trainer's
        :meth:`train.loop.order.BatchSplit.to_json`), recorded in the manifest so that a
        resume keeps it.

        Rank 0 stores ``shared_state`` with ``model``'s state dict (no ``module.`` prefix) as
        ``"model"``; every rank stores its ``rank_state``. Returns the checkpoint path (on
        ranks other than 0, and for async saves, where it will appear), or None when this step
        was already saved by this manager. Async: returns at once (see
        :class:`~train.checkpoint.state.Snapshotter`: the copy is taken before training changes the
        state); :meth:`wait` blocks until written.
        """
        start = time.perf_counter()
        self.wait()
        if step == self._last_step:
            return None
        final = self.path_for(step)
        from train.checkpoint.state import make_weights_only_safe, model_state_dict

        shared: dict[str, Any] | None = None
        if self.rank == 0:
            shared = {str(k): v for k, v in shared_state.items() if k != "model"}
            shared["model"] = model_state_dict(model)
            shared = make_weights_only_safe(shared, "shared_state")
        rank_payload = make_weights_only_safe(dict(rank_state), "rank_state")
        meta: dict[str, Any] = {"step": step, "epoch": epoch, "epoch_step": epoch_step}
        meta["metric"] = metric
        if split is not None:
            meta["split"] = dict(split)
        meta.update(self.line.to_json())  # branch and parents: train.checkpoint.branches
        self._last_step = step
        self._saved = True
        if not self.async_save:
            try:
                self._write(meta, shared, rank_payload)
            except BaseException as exc:
                self._last_step = None  # a failed save may be retried at the same step
                if isinstance(exc, OSError):
                    raise CheckpointError(f"cannot write checkpoint step-{step}: {exc}") from exc
                raise
        else:
            self._snap.begin((shared, rank_payload), model)
            self._error = None
            self._future = self._saver_pool().submit(self._run_background, meta)
        self.last_blocking_s = time.perf_counter() - start
        return final

    def wait(self) -> None:
        """Block until the in-flight asynchronous save (if any) and the deletion of pruned
        checkpoints are finished; re-raise the save's error."""
        if self._future is not None:
            self._future.result()
            self._future = None
        if self._deleting is not None:
            self._deleting.result()
            self._deleting = None
        if self._error is not None:
            err, self._error = self._error, None
            self._last_step = None  # a failed save may be retried at the same step
            if isinstance(err, CheckpointError):
                raise err
            raise CheckpointError(f"asynchronous checkpoint save failed: {err}") from err

    @property
    def in_flight(self) -> bool:
        return self._future is not None and not self._future.done()

    def _saver_pool(self) -> ThreadPoolExecutor:
        if self._saver is None:
            self._saver = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-save")
        return self._saver

    @property
    def _snap(self) -> Snapshotter:
        if self._snapshotter is None:
            from train.checkpoint.state import Snapshotter

            self._snapshotter = Snapshotter()
        return self._snapshotter

    def wait_copied(self) -> None:
        """Block until the in-flight asynchronous save has copied the state. Training's own
        forward passes and ``optimizer.step()`` wait for it by themselves; call this before
        changing the model's or optimizer's tensors in place any other way."""
        if self._snapshotter is not None:
            self._snapshotter.wait_copied()

    def _run_background(self, meta: dict[str, Any]) -> None:
        try:
            _phase("snapshot")
            shared, rank_payload = self._snap.finish()
            self._write(meta, shared, rank_payload)
        except BaseException as exc:  # reported by the next wait()/save()
            log.error("checkpoint step-%s: background save failed: %s", meta["step"], exc)
            self._error = exc

    def _io_pool(self) -> ThreadPoolExecutor:
        # rank 0's small rank file is written (and fsynced) beside shared.pt; pruned
        # checkpoints are deleted here too
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="ckpt-io")
        return self._pool

    def _write(
        self, meta: dict[str, Any], shared: dict[str, Any] | None, rank_payload: dict[str, Any]
    ) -> None:
        from train.checkpoint import write as _write
        from train.checkpoint.digest import state_digest

        step = int(meta["step"])
        pool = self._io_pool()
        try:
            tmp = _dirs.tmp_dir(self.root, step, self.rank)
            rank_path = tmp / _io.rank_file(self.rank)
            if self.rank != 0:
                info = _write.write_torch(rank_payload, rank_path)
                _phase("rank file")
                marker = {"rank": self.rank, "step": step, **info}
                _io.write_json_atomic(marker, tmp / _io.marker_file(self.rank), durable=False)
                return
            assert shared is not None
            model_digest_value = state_digest(shared["model"])  # xxh3: ~1 ms for 26 MB
            rank_file = pool.submit(_write.write_torch, rank_payload, rank_path)
            try:
                _phase("rank file")
                files = {SHARED_FILE: _write.write_torch(shared, tmp / SHARED_FILE)}
            finally:
                files_rank = rank_file.result()
            files[_io.rank_file(0)] = files_rank
        except OSError as exc:
            raise CheckpointError(f"cannot write checkpoint step-{step}: {exc}") from exc
        _phase("shared file")
        with self.collect_wait():
            peers = range(1, self.world_size)
            files.update(
                _dirs.collect_markers(tmp, step, peers, self.marker_timeout_s, self.step_ending)
            )
        manifest = {
            "format": FORMAT_VERSION,
            **meta,
            "world_size": self.world_size,
            "spec_hash": self.spec_hash,
            "run_id": self.run_id,
            "digest": model_digest_value,
            "time": time.time(),
            "files": files,
        }
        _io.write_json_atomic(manifest, tmp / MANIFEST)  # fsyncs the file and ``tmp``
        for r in range(1, self.world_size):
            (tmp / _io.marker_file(r)).unlink(missing_ok=True)
        _phase("manifest")
        line = _branches.parse_line(meta, "checkpoint")
        final = self.root / _branches.dir_name(step, line.branch)
        _dirs.commit(tmp, final, self._owned)
        doomed = _dirs.prune(
            self.root,
            self._owned,
            keep=final,
            keep_last=self.keep_last,
            keep_best=self.keep_best,
            best_mode=self.best_mode,
            line=line,
        )
        if doomed:  # renamed away already; the deletion itself need not block a save
            self._deleting = pool.submit(_dirs.remove_all, doomed)

    def path_for(self, step: int) -> Path:
        """Where this manager's checkpoint of ``step`` is (or will be): ``step-N`` on branch 0,
        ``step-N.bB`` on branch ``B``."""
        return self.root / _branches.dir_name(step, self.line.branch)

    def follow(self, line: Line, *, record: bool = False, resumed_from: str | None = None) -> None:
        """Save on and follow ``line`` from now on; call before the first save on it.
        ``record`` (rank 0, once): make it the current line first (``branch.json``, atomic:
        see :mod:`train.checkpoint.branches`), with the checkpoint an explicit resume started
        from (``resumed_from``, its name). The session sets the line rank 0 chose on every
        rank."""
        self.wait()
        if record:
            _branches.write_current(self.root, line, resumed_from)
        self.line = line

    # -- finding and loading -----------------------------------------------------------------
    def foreign_checkpoints(self) -> list[Path]:
        """``step-N`` entries (newest first) that this manager does not own: another run's,
        damaged ones, links. A new run in a directory that has any is not this run's to mix."""
        return _dirs.foreign_checkpoints(self.root, self._owned)

    def checkpoints(self) -> list[Path]:
        """All ``step-N`` directories, newest first (valid or not; links left out)."""
        return [p for _, p in _dirs.step_dirs(self.root)]

    def latest_valid(self) -> Path | None:
        """The newest checkpoint on this manager's line that verifies completely; invalid
        newer ones (damaged, half written, links) are skipped with a warning, other branches
        are not candidates. None when there is none (start fresh)."""
        return latest_valid(self.root, self.line)

    def load(self, path: str | os.PathLike[str], rank: int | None = None) -> LoadedCheckpoint:
        """Verify and load checkpoint ``path`` for ``rank`` (default: this manager's rank).

        Tensors are loaded to CPU with ``weights_only=True``; move them with the model's
        ``load_state_dict`` / the optimizer's, which place them on the right device.
        """
        p = Path(path)
        r = self.rank if rank is None else rank
        # this rank reads shared.pt and its own file: verify those (and the digest) only
        manifest, shared = _io.verify(p, only={_io.rank_file(r)})
        self._adopt(p, manifest)
        if self.spec_hash and manifest.get("spec_hash") not in ("", self.spec_hash):
            log.warning(
                "%s was written with a different training config (spec hash %s, now %s); "
                "resuming anyway",
                p,
                manifest.get("spec_hash"),
                self.spec_hash,
            )
        rank_state: dict[str, Any] | None = None
        if _io.rank_file(r) in manifest["files"]:
            rank_state = _io.torch_load(p / _io.rank_file(r))
        else:
            log.warning(
                "%s was written by %s ranks; rank %s starts with fresh RNG/sampler state",
                p,
                manifest["world_size"],
                r,
            )
        return LoadedCheckpoint(path=p, shared=shared, rank_state=rank_state, manifest=manifest)

    def _adopt(self, path: Path, manifest: Mapping[str, Any]) -> None:
        """Resuming from a checkpoint of this root continues its run: that run's checkpoints
        become ours to prune, and (before our first save) we save under its id."""
        rid = manifest.get("run_id")
        if not rid or rid in self._owned:
            return
        try:
            inside = path.parent.resolve() == self.root.resolve()
        except OSError:
            return
        if inside:
            self._owned.add(rid)
            if not self._saved:
                self.run_id = rid

    def close(self) -> None:
        """Finish any in-flight save (call before the process exits); raises its error."""
        try:
            self.wait()
        finally:
            if self._snapshotter is not None:
                self._snapshotter.close()
            for pool in (self._pool, self._saver):
                if pool is not None:
                    pool.shutdown()
            self._pool = self._saver = None
