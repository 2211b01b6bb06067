"""Atomic, verifiable, optionally asynchronous checkpoints: ``ROOT/step-N/`` (``step-N.bB/`` on
branch ``B``).

Layout of one checkpoint (a directory made valid by its last atomic step)::

    step-N/shared.pt       rank 0: model (no ``module.`` prefix), optimizer, scheduler, scaler,
                           metrics, ... (whatever the trainer puts in ``shared_state``)
    step-N/rank-R.pt       every rank: its RNG states, sampler position (``rank_state``)
    step-N/manifest.json   written last: step, epoch, epoch_step, world_size, spec_hash, run_id,
                           branch and parents (absent: branch 0), digest of the model state,
                           time, files with size and digest (xxh3-128; format-1 manifests,
                           read only: sha256)
    branch.json            the current line of the history (below), one small atomic file

How a save becomes valid (no collective anywhere, so it can finish in a background thread):
every rank writes its file into ``.step-N.tmp/`` (hashed while written, see
:mod:`train.checkpoint.write`), fsyncs it and drops a ``rank-R.done`` marker (JSON with the file's
size and digest). Rank 0 waits for all markers, writes the manifest, fsyncs, renames
``.step-N.tmp`` to ``step-N`` and fsyncs ``ROOT``. A directory without a valid manifest (missing,
damaged, foreign: see :func:`train.checkpoint.manifest.check_manifest`), with a file that does
not match it, whose model digest differs, or that is a symbolic link is never loaded: the
previous valid one is. Old checkpoints are pruned only after a newer one is complete.

Ownership: every manifest records the ``run_id`` of the run that wrote it. Pruning
(``keep_last``/``keep_best``) and replacing an existing ``step-N`` only ever touch checkpoints
of the runs this manager owns: its own ``run_id`` (a fresh one unless given) and the run of a
checkpoint it loaded from its own root (resuming continues that run, and saves under its id).
A save over another run's ``step-N`` is refused; links are never followed, loaded or replaced.

History with branches (:mod:`train.checkpoint.branches`): resuming from a checkpoint that is not
the newest of its branch and training on starts a new branch (``step-N.bB``, its manifests say
``branch: B`` and the fork points ``parents``); ``branch.json`` names the current branch and is
written atomically by rank 0 before anything trains on it. Automatic resumes
(:func:`~train.checkpoint.dirs.latest_valid`) take the newest valid checkpoint on the current
branch's line (the branch, and each ancestor up to its fork point); pruning weighs only that
line and never deletes a checkpoint another branch's line holds; a save never replaces another
branch's checkpoint (the names differ). A crash after ``branch.json`` and before the branch's
first save resumes from the fork point, on the new branch. Manifests without a branch are of
branch 0: an old history is one implicit branch. Rank 0 decides (train.resume.plan_resume) and
every rank gets the line with the resume plan: no rank reads another rank's files.
``.step-N.tmp`` leftovers are removed by rank 0 when the manager is created, so create the
manager on every rank before the first collective of the run (a save always follows one).

Asynchronous saves block training for almost nothing (:class:`train.checkpoint.state.Snapshotter`):
CPU state is copied copy-on-write by the background thread while the model's next forward pass
and ``optimizer.step()`` wait for that copy; CUDA state is copied to pinned host buffers with
non-blocking copies. Hashing, writing and committing run in the background thread, at most one
save in flight.

Modules: :mod:`train.checkpoint.manager` (:class:`CheckpointManager`: save, load, prune, the
ownership rules), :mod:`train.checkpoint.dirs` (finding valid ``step-N`` directories, never
following a link), :mod:`train.checkpoint.branches` (branches, lines, ``branch.json``),
:mod:`train.checkpoint.manifest` (the format: manifests, checks, loading),
:mod:`train.checkpoint.write` (files at the disk's speed, hashed inline),
:mod:`train.checkpoint.digest` (xxh3-128, format-1 sha256 read back), :mod:`train.checkpoint.state`
(snapshots of the state an asynchronous save writes, RNG states).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from train._lazy import lazy_exports

if TYPE_CHECKING:
    from train.checkpoint.branches import Line, next_line
    from train.checkpoint.branches import current as current_line
    from train.checkpoint.branches import entries as branch_entries
    from train.checkpoint.branches import read_record as read_branch_record
    from train.checkpoint.digest import FORMAT_VERSION, state_digest
    from train.checkpoint.dirs import checkpoint_run_id, checkpoint_step, latest_valid
    from train.checkpoint.manager import SAVE_PHASE_HOOKS, CheckpointManager
    from train.checkpoint.manifest import (
        STEP_RE,
        LoadedCheckpoint,
        read_manifest,
        verify_checkpoint,
        written_split,
    )
    from train.checkpoint.state import (
        Snapshotter,
        capture_rng_state,
        load_model_state,
        make_weights_only_safe,
        model_digest,
        model_state_dict,
        restore_rng_state,
        strip_module_prefix,
    )

_EXPORTS = {
    "Line": "branches",
    "next_line": "branches",
    "current_line": "branches:current",
    "branch_entries": "branches:entries",
    "read_branch_record": "branches:read_record",
    "FORMAT_VERSION": "digest",
    "state_digest": "digest",
    "checkpoint_run_id": "dirs",
    "checkpoint_step": "dirs",
    "latest_valid": "dirs",
    "SAVE_PHASE_HOOKS": "manager",
    "CheckpointManager": "manager",
    "STEP_RE": "manifest",
    "LoadedCheckpoint": "manifest",
    "read_manifest": "manifest",
    "verify_checkpoint": "manifest",
    "written_split": "manifest",
    "Snapshotter": "state",
    "capture_rng_state": "state",
    "load_model_state": "state",
    "make_weights_only_safe": "state",
    "model_digest": "state",
    "model_state_dict": "state",
    "restore_rng_state": "state",
    "strip_module_prefix": "state",
}
__all__ = [
    "FORMAT_VERSION",
    "SAVE_PHASE_HOOKS",
    "STEP_RE",
    "CheckpointManager",
    "Line",
    "LoadedCheckpoint",
    "Snapshotter",
    "branch_entries",
    "capture_rng_state",
    "checkpoint_run_id",
    "checkpoint_step",
    "current_line",
    "latest_valid",
    "load_model_state",
    "make_weights_only_safe",
    "model_digest",
    "model_state_dict",
    "next_line",
    "read_branch_record",
    "read_manifest",
    "restore_rng_state",
    "state_digest",
    "strip_module_prefix",
    "verify_checkpoint",
    "written_split",
]
__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
