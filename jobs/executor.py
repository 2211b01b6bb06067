"""jobs' submitit executor: submitit's ``SlurmExecutor``, with the one thing submitit cannot say.

submitit renders the whole batch script from its parameters (``update_parameters``: its own
where it has one, ``additional_parameters`` for the rest, ``setup``, ``srun_args``) and its
``python`` command (:func:`task_python`: ``-P``, then :mod:`jobs.taskstart`). What it cannot
express is a job step run again in the same allocation when the run decides to restart in
place (a failure or a hang, asked of :mod:`train.stop.step` after each step): :meth:`TrainExecutor.
_make_submission_file_text`, the method submitit's backends implement, takes submitit's text
and puts its srun line, unchanged, inside :func:`in_place_loop`. Nothing else of
the text is ours (tests/unit/jobs/test_render.py renders through the installed submitit and
checks exactly that).

sbatch itself runs through :mod:`cluster.client` (its environment passed explicitly, its
timeouts, the ``--dependency`` of chained arrays), not submitit's ``subprocess`` call: this
executor renders, it does not submit. Imports submitit (asyncio, cloudpickle, ...): only
:func:`jobs.render.sbatch_script` imports this module.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import submitit

from train.safepath import SAFE_PATH

__all__ = ["SAFE_PATH", "TASK", "TrainExecutor", "in_place_loop", "safe_python", "task_python"]

#: The task as the batch script names it: ``ARRAYID_INDEX`` in an array, empty for one job
#: (then its job id, in the step). The same name as the task's pickle's.
TASK = '"${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}"'


class TrainExecutor(submitit.SlurmExecutor):
    """submitit's Slurm executor for one run's ``RUN_DIR/slurm`` folder.

    ``note``: comment lines written above the loop (what each rank runs). No requeue by
    submitit (``max_num_timeout=0``): train decides about requeues through its budgets.
    """

    def __init__(
        self, folder: Path, note: list[str] | None = None, run_dir: str | None = None
    ) -> None:
        super().__init__(folder, max_num_timeout=0, python=task_python())
        self._note = list(note or [])
        self._run_dir = run_dir

    @classmethod
    def affinity(cls) -> int:
        # submitit refuses a SlurmExecutor where `srun` is not on PATH; this one only renders
        # (--dry-run works on a laptop), sbatch runs through cluster.client.
        return 2

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        text: str = super()._make_submission_file_text(command, uid)
        lines = text.split("\n")
        steps = [i for i, ln in enumerate(lines) if ln.startswith("srun ") and ln.endswith(command)]
        if len(steps) != 1:  # a submitit release that lays the script out otherwise
            raise RuntimeError(
                f"submitit {submitit.__version__} wrote no single srun line for {command!r}: "
                "jobs cannot put the step in its restart loop (jobs.executor)"
            )
        i = steps[0]
        loop = in_place_loop(lines[i], self.folder, run_dir=self._run_dir)
        lines[i : i + 1] = [*self._note, *loop.split("\n")]
        return "\n".join(lines)

    def script(self, array_size: int | None = None) -> str:
        """The batch script of one job, or of an array of ``array_size`` tasks (submitit's
        ``map_count``, set as its own array submission sets it)."""
        if array_size is not None:
            self.parameters["map_count"] = array_size
        try:
            return self._make_submission_file_text(self._submitit_command_str, "")
        finally:
            self.parameters.pop("map_count", None)


def safe_python(python: str | None = None) -> str:
    """The interpreter command of every ``python`` line the script runs: ``-P``, so that a
    ``train.py``, ``jobs/`` or ``submitit.py`` in the submission directory (the job's working
    directory) never replaces this project's packages or submitit's (issue 42)."""
    return " ".join([shlex.quote(python or sys.executable), *SAFE_PATH])


def task_python(python: str | None = None) -> str:
    """The ``python`` of submitit's srun line: :func:`safe_python`, unbuffered, through
    :mod:`jobs.taskstart`, which starts a command that can start first before submitit's module
    (the rest of the line, submitit's ``-u -m submitit.core._submit FOLDER``) loads."""
    return " ".join([safe_python(python), "-u -m jobs.taskstart --task", TASK, "--"])


def in_place_loop(
    step: str, folder: Path, python: str | None = None, run_dir: str | None = None
) -> str:
    """The job step ``step`` (submitit's srun line) run again in the same allocation when the
    run decided to restart in place (a failure or a hang; :mod:`train.stop.step` says so after
    each step): no requeue, no trip through the queue. The only lines of the script that are
    ours rather than submitit's. A link of a chain that stopped for its successor (its exit
    code ``link_exit``, set by :func:`jobs.render.chain_lines`) ends the script at once: its
    successor resumes, and a run rank 0 completed meanwhile is found by the successor's
    ``link-start`` (the chain ends there). ``run_dir``: the task's run directory as a shell word
    (:func:`jobs.render.task_run_dir`), so that the question after a step reads no pickle."""
    ask = " ".join([
        safe_python(python), "-m jobs.launch --after-step", shlex.quote(str(folder)),
        *(["--run-dir", run_dir] if run_dir else []),
        '--exit-code "$rc"', '--in-place "$SLURM_TRAIN_IN_PLACE" --job-id "$SLURM_JOB_ID"',
        "--task", TASK,
        '--restart-count "${SLURM_RESTART_COUNT:-0}"',
    ])  # fmt: skip
    return "\n".join([
        "# a failed step restarts in this allocation when the run decides so (train.stop.step)",
        "export SLURM_TRAIN_IN_PLACE=0",
        "while :; do",
        f"  {step}",
        "  rc=$?",
        # a link of a chain (jobs.render.chain_lines sets link_exit) stopped for its successor
        '  if [ "$rc" = "${link_exit-}" ]; then exit "$rc"; fi',
        f"  next=$({ask}) || next=\"exit $rc\"",
        '  if [ "$next" != restart ]; then exit "${next#exit }"; fi',
        "  SLURM_TRAIN_IN_PLACE=$((SLURM_TRAIN_IN_PLACE + 1))",
        "done",
    ])  # fmt: skip
