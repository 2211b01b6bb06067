"""The generated sbatch script: the options that matter, and --dry-run == what is submitted."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from submitit.core.utils import DelayedSubmission

from cluster.client import SlurmClient
from jobs.cli import main
from jobs.errors import SubmitError
from jobs.launch import TrainLaunch
from jobs.load import load_spec, load_text
from jobs.render import sbatch_script
from jobs.submit import make_plan, submit_slurm

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "cifar.yaml"


def _script(text: str, *overrides: str) -> str:
    loaded = load_text(text, "spec.yaml", overrides)
    size = len(loaded.tasks) if loaded.is_array else None
    return sbatch_script(loaded.spec, Path("/runs/demo"), size)


def test_example_script_has_requeue_signal_append_and_per_rank_logs() -> None:
    loaded = load_spec(EXAMPLE)
    script = sbatch_script(loaded.spec, Path("/runs/x"))
    lines = script.splitlines()
    assert "#SBATCH --requeue" in lines
    assert "#SBATCH --signal=USR2@60" in lines
    assert "#SBATCH --open-mode=append" in lines
    assert "#SBATCH --nodes=2" in lines
    assert "#SBATCH --ntasks-per-node=1" in lines
    assert "#SBATCH --partition=debug" in lines
    assert not any("gpus" in ln for ln in lines)  # the local cluster's gpus are dummies
    srun = next(ln for ln in lines if ln.startswith("srun "))
    assert "--output /runs/x/slurm/%j_%t_log.out" in srun
    assert "--kill-on-bad-exit=1" in srun
    assert srun.endswith("-u -m submitit.core._submit /runs/x/slurm")


def test_ddp_runs_one_task_per_gpu_by_default() -> None:
    script = _script("name: d\nresources: {nodes: 2, gpus_per_node: 4}\ntrain: {}\n")
    assert "#SBATCH --ntasks-per-node=4" in script
    assert "#SBATCH --gpus-per-node=4" in script


def test_dataparallel_runs_one_task_with_all_gpus() -> None:
    script = _script("name: d\nresources: {gpus_per_node: 8}\ntrain: {strategy: dp}\n")
    assert "#SBATCH --ntasks-per-node=1" in script
    assert "#SBATCH --gpus-per-node=8" in script


def test_spec_signal_time_and_launch_options() -> None:
    text = (
        "name: d\nresources: {time: '1-00:00:00', cpus_per_task: 4, mem: 16G, account: a1,"
        " qos: high, constraint: 'a100&ib', exclusive: true}\n"
        "requeue: {signal: USR1, signal_delay_s: 120}\n"
        "launch: {mpi: pmix, cpu_bind: cores, srun_args: ['--label'],"
        " sbatch_args: {mail-type: END}}\n"
        "train: {}\n"
    )
    lines = _script(text).splitlines()
    for expected in (
        "#SBATCH --signal=USR1@120",
        "#SBATCH --time=1440",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --mem=16G",
        "#SBATCH --account=a1",
        "#SBATCH --qos=high",
        "#SBATCH --constraint='a100&ib'",
        "#SBATCH --exclusive",
        "#SBATCH --mail-type=END",
    ):
        assert expected in lines
    srun = next(ln for ln in lines if ln.startswith("srun "))
    for arg in ("--cpus-per-task=4", "--mpi=pmix", "--cpu-bind=cores", "--label"):
        assert arg in srun


def test_sweep_is_one_array_with_parallelism_limit() -> None:
    text = (
        "name: d\ntrain: {}\nsweep:\n  max_parallel: 2\n  grid:\n"
        "    train.optimizer.lr: [0.1, 0.05]\n    train.seed: [1, 2]\n"
    )
    script = _script(text)
    assert "#SBATCH --array=0-3%2" in script
    assert "%A_%a_%t_log.out" in script


def test_dry_run_is_exactly_what_is_submitted(tmp_path: Path, stub_slurm: Path) -> None:
    run_dir = tmp_path / "fixed-run"
    overrides = [f"train.run_dir={run_dir}", "train.max_steps=5"]
    out = io.StringIO()
    assert main(["submit", str(EXAMPLE), "--dry-run", *(f"--set={o}" for o in overrides)], out) == 0
    loaded = load_spec(EXAMPLE, overrides)
    record = submit_slurm(loaded, make_plan(loaded, tmp_path / "runs"), SlurmClient())
    assert record.job_id == "4242"
    submitted = (stub_slurm / "submitted-0.sh").read_text()
    assert submitted == out.getvalue()
    assert (run_dir / "sbatch.sh").read_text() == submitted


def test_dry_run_cache_gives_the_same_script(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["submit", str(EXAMPLE), "--dry-run", "--set", "train.run_dir=/fixed"]
    first, second = io.StringIO(), io.StringIO()
    assert main(args, first) == 0  # miss: validates and stores
    assert main(args, second) == 0  # hit
    monkeypatch.setenv("SLURM_TRAIN_NO_CACHE", "1")
    third = io.StringIO()
    assert main(args, third) == 0
    assert first.getvalue() == second.getvalue() == third.getvalue()


def test_dry_run_cache_notices_a_changed_spec(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("name: d\nresources: {nodes: 1}\ntrain: {}\n")
    first = io.StringIO()
    assert main(["submit", str(spec), "--dry-run"], first) == 0
    spec.write_text("name: d\nresources: {nodes: 2}\ntrain: {}\n")
    second = io.StringIO()
    assert main(["submit", str(spec), "--dry-run"], second) == 0
    assert "#SBATCH --nodes=1" in first.getvalue()
    assert "#SBATCH --nodes=2" in second.getvalue()
    spec.write_text("name: d\nresources: {nodes: 0}\ntrain: {}\n")
    assert main(["submit", str(spec), "--dry-run"], io.StringIO()) == 2


def test_failed_sbatch_is_one_line_and_leaves_no_run(
    tmp_path: Path, stub_slurm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (stub_slurm / "sbatch").write_text(
        "#!/bin/sh\n"
        "echo 'sbatch: error: Batch job submission failed: Invalid account' >&2\n"
        "exit 1\n"
    )
    loaded = load_spec(EXAMPLE)
    plan = make_plan(loaded, tmp_path / "runs")
    with pytest.raises(SubmitError, match=r"^sbatch failed: .*Invalid account"):
        submit_slurm(loaded, plan, SlurmClient())
    assert not plan.run_dir.exists()
    assert capsys.readouterr().err == ""  # the one line is the error's, printed by the CLI


def test_sweep_submission_is_one_sbatch_call(tmp_path: Path, stub_slurm: Path) -> None:
    text = "name: sw\ntrain: {}\nsweep:\n  max_parallel: 3\n  grid:\n    train.seed: [1, 2, 3, 4]\n"
    spec = tmp_path / "sweep.yaml"
    spec.write_text(text)
    loaded = load_spec(spec)
    record = submit_slurm(loaded, make_plan(loaded, tmp_path / "runs"), SlurmClient())
    assert sorted(p.name for p in stub_slurm.glob("submitted-*.sh")) == ["submitted-0.sh"]
    assert record.job_ids() == ["4242_0", "4242_1", "4242_2", "4242_3"]
    # The array script is exactly what --dry-run renders for the same run directory.
    submitted = (stub_slurm / "submitted-0.sh").read_text()
    assert submitted == sbatch_script(loaded.spec, Path(record.run_dir), 4)
    assert "#SBATCH --array=0-3%3" in submitted
    seeds = []
    for task in record.tasks:
        # Each array task carries its resolved spec in its pickle and writes it when it starts.
        pickle = Path(record.run_dir) / "slurm" / f"4242_{task.index}_submitted.pkl"
        launch = DelayedSubmission.load(pickle).function
        assert isinstance(launch, TrainLaunch)
        assert launch.config == str(Path(task.run_dir) / "resolved.yaml")
        launch.materialize()
        resolved = (Path(task.run_dir) / "resolved.yaml").read_text()
        assert "sweep" not in resolved
        seeds.append(task.values["train.seed"])
        assert f"seed: {task.values['train.seed']}" in resolved
    assert seeds == [1, 2, 3, 4]
