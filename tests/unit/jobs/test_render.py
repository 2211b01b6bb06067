"""The generated sbatch script: the options that matter, and --dry-run == what is submitted."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from submitit.core.utils import DelayedSubmission

from cluster.client import SlurmClient
from jobs.cli import main
from jobs.errors import SubmitError
from jobs.executor import in_place_loop, safe_python, task_python
from jobs.launch import TrainLaunch
from jobs.load import load_spec, load_text
from jobs.render import rank_note, sbatch_script, submitit_folder, task_run_dir
from jobs.submit import make_plan, submit_slurm

if TYPE_CHECKING:
    from jobs.spec import JobSpec

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "cifar.yaml"


def _script(text: str, *overrides: str) -> str:
    loaded = load_text(text, "spec.yaml", overrides)
    size = len(loaded.tasks) if loaded.is_array else None
    return sbatch_script(loaded.spec, Path("/runs/demo"), size)


@pytest.mark.parametrize("release", ["22.05", "24.11", "26.05"])
def test_the_script_carries_what_the_preflight_read_of_each_release(release: str) -> None:
    """Issue 43: the release goes to the ranks (the stop path leaves a preemption's requeue to
    a release that requeues it itself, without asking Slurm), and a cluster that allows it
    (26.05 here) gets --requeue=expedite; a submission without a preflight gets neither."""
    from cluster import parse
    from train.env import SLURM_RELEASE_ENV

    data = REPO / "tests" / "unit" / "cluster" / "data" / release / "scontrol_config.txt"
    limits = parse.parse_config_limits(data.read_text())
    spec = load_spec(EXAMPLE).spec
    lines = sbatch_script(spec, Path("/runs/x"), None, limits).splitlines()
    (export,) = [line for line in lines if line.startswith(f"export {SLURM_RELEASE_ENV}=")]
    assert export.split("=", 1)[1].startswith(f"{release}.")
    expedite = "#SBATCH --requeue=expedite" in lines
    assert (expedite, "#SBATCH --requeue" in lines) == (release == "26.05", release != "26.05")
    plain = sbatch_script(spec, Path("/runs/x")).splitlines()
    assert "#SBATCH --requeue" in plain and not any(SLURM_RELEASE_ENV in x for x in plain)


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
    srun = next(ln.strip() for ln in lines if ln.strip().startswith("srun "))
    assert "--output /runs/x/slurm/%j_%t_log.out" in srun
    assert "--kill-on-bad-exit=1" in srun
    assert srun.endswith("-u -m submitit.core._submit /runs/x/slurm")


def test_ddp_runs_one_task_per_gpu_by_default() -> None:
    script = _script("name: d\nresources: {nodes: 2, gpus_per_node: 4}\ntrain: {}\n")
    assert "#SBATCH --ntasks-per-node=4" in script
    # GPUs one way on every path (jobs.render.slurm_options): --gres=gpu:N.
    assert "#SBATCH --gres=gpu:4" in script


def test_dataparallel_runs_one_task_with_all_gpus() -> None:
    script = _script("name: d\nresources: {gpus_per_node: 8}\ntrain: {strategy: dp}\n")
    assert "#SBATCH --ntasks-per-node=1" in script
    assert "#SBATCH --gres=gpu:8" in script


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
        "#SBATCH --time=1-00:00:00",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --mem=16G",
        "#SBATCH --account=a1",
        "#SBATCH --qos=high",
        "#SBATCH --constraint='a100&ib'",
        "#SBATCH --exclusive",
        "#SBATCH --mail-type=END",
    ):
        assert expected in lines
    srun = next(ln.strip() for ln in lines if ln.strip().startswith("srun "))
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


# -- the script is submitit's own text, but for our loop around its srun line -------------------
_SUBMITIT_CASES = [
    "name: plain\ntrain: {}\n",
    "name: gpus\nresources: {partition: debug, nodes: 2, gpus_per_node: 4, cpus_per_task: 8,"
    " mem: 64G, time: '1-02:03:04'}\ntrain: {}\n",
    "name: odd.name_1\nresources: {gres: 'gpu:a100:2', account: a1, qos: high,"
    " constraint: 'a100&ib', exclusive: true, time: UNLIMITED}\n"
    "requeue: {signal: USR1, signal_delay_s: 120}\n"
    "launch: {mpi: pmix, cpu_bind: cores, kill_on_bad_exit: false,"
    " srun_args: ['--label', '--export=ALL,X=a b'],"
    " sbatch_args: {mail-type: 'END,FAIL', mail-user: 'me@x.org', hold: true, wckey: mine,"
    " nice: 5}}\n"
    "environment: {variables: {A: 'x y', B: 1, C: true, D: \"$(rm -rf /)\"},"
    " setup: ['module load cuda', 'source .venv/bin/activate']}\n"
    "train: {}\n",
    "name: cmd\nentrypoint: {command: [python, train.py, --lr, '0.1']}\n",
    "name: sw\ntrain: {}\nsweep: {max_parallel: 3, grid: {train.seed: [1, 2, 3, 4, 5]}}\n",
    "name: big\ntrain: {}\nsweep: {max_parallel: 500, grid: {train.seed: [1, 2, 3]}}\n",
]


def _submitit_script(spec: JobSpec, run_dir: Path, array_size: int | None) -> str:
    """The same options rendered by the installed submitit's ``_make_sbatch_string`` (what its
    SlurmExecutor renders with ``python`` set to ``task_python()``)."""
    import shlex

    from submitit.slurm.slurm import _make_sbatch_string

    from jobs.render import setup_lines, slurm_options, submitit_folder

    opts = slurm_options(spec)
    extra = {k.replace("-", "_"): True if v is None else v for k, v in opts.sbatch}
    kwargs: dict[str, Any] = {
        "job_name": extra.pop("job_name"),
        "signal_delay_s": spec.requeue.signal_delay_s,
        "setup": setup_lines(spec),
        "srun_args": list(opts.srun),
        "stderr_to_stdout": True,
        "additional_parameters": extra,
    }
    if spec.resources.time_s is not None:
        kwargs["time"] = -(-spec.resources.time_s // 60)
    if array_size is not None:
        assert spec.sweep is not None
        kwargs["array_parallelism"] = spec.sweep.max_parallel
        kwargs["map_count"] = array_size
    folder = submitit_folder(run_dir)
    command = f"{task_python()} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    text: str = _make_sbatch_string(command=command, folder=folder, **kwargs)
    return text


@pytest.mark.parametrize("text", _SUBMITIT_CASES)
def test_script_is_byte_for_byte_what_submitit_renders(text: str) -> None:
    loaded = load_text(text, "spec.yaml", ())
    size = len(loaded.tasks) if loaded.is_array else None
    run_dir = Path("/runs/with space/x")
    ours = sbatch_script(loaded.spec, run_dir, size)
    theirs = _submitit_script(loaded.spec, run_dir, size)
    # submitit's script, byte for byte, but for its last line: the same srun step, run in the
    # loop that restarts a failed step in place (issue 26; jobs.executor.in_place_loop), with
    # what each rank runs above it as comments (issue 45)
    step = theirs.rstrip("\n").splitlines()[-1]
    # submitit's module through ours, which starts a command that can start first (issue 46)
    assert step.endswith(
        '-P -u -m jobs.taskstart --task "${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_'
        "${SLURM_ARRAY_TASK_ID}}\" -- -u -m submitit.core._submit '/runs/with space/x/slurm'"
    )
    ours_part = [
        *rank_note(loaded.spec, run_dir, size is not None),
        in_place_loop(
            step, submitit_folder(run_dir), run_dir=task_run_dir(run_dir, size is not None)
        ),
    ]
    assert ours == theirs.replace(step, "\n".join(ours_part))
    # the question after a step names the task's run directory: it loads no pickle (issue 46)
    where = (
        "'/runs/with space/x/tasks'/\"$SLURM_ARRAY_TASK_ID\"" if size else "'/runs/with space/x'"
    )
    assert f"--after-step '/runs/with space/x/slurm' --run-dir {where} --exit-code" in ours
    assert f"\n  {step}\n  rc=$?\n" in ours and ours.endswith("done\n")


# -- one mapping: the submitit script and --template ddp ask Slurm for the same resources -------
_RESOURCE_TABLE = [
    "resources: {partition: debug, nodes: 2, gpus_per_node: 2, cpus_per_task: 1, time: '00:10:00'}",
    "resources: {nodes: 1, gpus_per_node: 0, time: 90}",
    "resources: {nodes: 4, ntasks_per_node: 2, mem: 16G, time: '1-00:00:00', exclusive: true}",
    "resources: {gres: 'gpu:a100:4', account: a1, qos: high, constraint: 'a100&ib', time: '10:30'}",
    "resources: {gres: 'nvme:1', gpus_per_node: 1, time: 'UNLIMITED'}",
    "resources: {nodes: 2, time: '2:00:00'}\nlaunch: {sbatch_args: {mail-type: END}}",
]


def _sbatch_args(script: str) -> dict[str, str]:
    """The #SBATCH options of a script as sbatch reads them (quotes removed), by option name."""
    out: dict[str, str] = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line[len("#SBATCH --") :].partition("=")
            out[key] = value.strip("'\"")  # shlex's quotes (submitit) or sbatch's (templates)
    return out


@pytest.mark.parametrize("resources", _RESOURCE_TABLE)
def test_dry_run_and_ddp_template_ask_for_the_same_resources(
    resources: str, tmp_path: Path
) -> None:
    from jobs.render import RESOURCE_KEYS

    spec = tmp_path / "s.yaml"
    spec.write_text(f"name: same\n{resources}\ntrain: {{}}\n")
    plain, ddp = io.StringIO(), io.StringIO()
    assert main(["submit", str(spec), "--dry-run"], plain) == 0
    assert main(["submit", str(spec), "--dry-run", "--template", "ddp"], ddp) == 0
    got, want = _sbatch_args(plain.getvalue()), _sbatch_args(ddp.getvalue())
    asked = {k: got.get(k) for k in (*RESOURCE_KEYS, "job-name", "signal", "mail-type")}
    assert asked == {k: want.get(k) for k in asked}
    assert "gpus-per-node" not in got and "gpus-per-node" not in want
    assert got["nodes"] == want["nodes"] != ""


def test_sweep_bigger_than_an_array_is_chained_arrays_in_one_run(
    tmp_path: Path, stub_slurm: Path
) -> None:
    text = "name: sw\ntrain: {}\nsweep: {max_parallel: 2, grid: {train.seed: [1, 2, 3, 4, 5]}}"
    spec = tmp_path / "sweep.yaml"
    spec.write_text(text)
    loaded = load_spec(spec)
    plan = make_plan(loaded, tmp_path / "runs")
    record = submit_slurm(loaded, plan, SlurmClient(), array_limit=2)
    scripts = sorted(stub_slurm.glob("submitted-*.sh"))
    assert len(scripts) == 3  # 2 + 2 + 1 tasks
    arrays = [ln for s in scripts for ln in s.read_text().splitlines() if "--array" in ln]
    assert arrays == ["#SBATCH --array=0-1%2", "#SBATCH --array=0-1%2", "#SBATCH --array=0-0%1"]
    args = [(stub_slurm / f"sbatch-args-{n}.txt").read_text().split() for n in range(3)]
    assert not any(a.startswith("--dependency") for a in args[0])
    # Each array starts after the previous one ended: max_parallel holds over all of them.
    assert "--dependency=afterany:4242" in args[1] and "--dependency=afterany:4243" in args[2]
    assert record.job_id == "4242"
    assert record.job_ids() == ["4242_0", "4242_1", "4243_0", "4243_1", "4244_0"]
    assert record.slurm_job_ids() == ["4242", "4243", "4244"]
    for jid, task in zip(record.job_ids(), record.tasks, strict=True):
        launch = DelayedSubmission.load(Path(record.run_dir) / "slurm" / f"{jid}_submitted.pkl")
        assert launch.function.config == str(Path(task.run_dir) / "resolved.yaml")


def test_a_failed_later_array_cancels_the_earlier_ones(tmp_path: Path, stub_slurm: Path) -> None:
    real = (stub_slurm / "sbatch").read_text()
    (stub_slurm / "sbatch").write_text(
        real.replace(
            "#!/bin/sh\n",
            '#!/bin/sh\ncase " $* " in *dependency*) '
            "echo 'sbatch: error: QOSMaxSubmitJobPerUserLimit' >&2; exit 1;; esac\n",
        )
    )
    scancel = '#!/bin/sh\nprintf "%s\\n" "$@" > "$STUB_DIR/scancel.txt"\n'
    (stub_slurm / "scancel").write_text(scancel)
    (stub_slurm / "scontrol").write_text("#!/bin/sh\nexit 0\n")
    for name in ("scancel", "scontrol"):
        (stub_slurm / name).chmod(0o755)
    spec = tmp_path / "sweep.yaml"
    spec.write_text("name: sw\ntrain: {}\nsweep:\n  grid:\n    train.seed: [1, 2, 3]\n")
    loaded = load_spec(spec)
    plan = make_plan(loaded, tmp_path / "runs")
    with pytest.raises(SubmitError, match=r"^sbatch failed: .*QOSMaxSubmitJobPerUserLimit"):
        submit_slurm(loaded, plan, SlurmClient(), array_limit=2)
    assert (stub_slurm / "scancel.txt").read_text().split() == ["4242"]
    assert not plan.run_dir.exists()


def test_dry_run_of_a_sweep_bigger_than_one_array_says_it_will_be_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "big.yaml"
    seeds = ", ".join(str(i) for i in range(1002))
    spec.write_text(f"name: big\ntrain: {{}}\nsweep: {{grid: {{train.seed: [{seeds}]}}}}\n")
    assert main(["submit", str(spec), "--dry-run"], io.StringIO()) == 0
    err = capsys.readouterr().err
    assert "1002 tasks" in err and "--dependency=afterany" in err
    spec.write_text("name: small\ntrain: {}\nsweep: {grid: {train.seed: [1, 2]}}\n")
    assert main(["submit", str(spec), "--dry-run"], io.StringIO()) == 0
    assert capsys.readouterr().err == ""


# -- issue 42: the script's interpreters never take a package from the working directory --------
_SHADOWS = {
    "train.py": "raise SystemExit('SHADOWED by train.py')\n",
    "cluster.py": "raise SystemExit('SHADOWED by cluster.py')\n",
    "submitit.py": "raise SystemExit('SHADOWED by submitit.py')\n",
    "jobs/__init__.py": "raise SystemExit('SHADOWED by jobs/')\n",
    "jobs/launch.py": "raise SystemExit('SHADOWED by jobs/launch.py')\n",
}


def test_every_python_line_of_the_script_is_safe_path() -> None:
    script = _script("name: d\nentrypoint: {command: [python, train.py]}\n")
    exe = safe_python().split(" -P")[0]
    runs = [ln for ln in script.splitlines() if not ln.startswith("#") and exe in ln]
    assert len(runs) == 2  # submitit's task and our after-step question
    assert all(f"{exe} -P " in ln for ln in runs)


def test_the_scripts_commands_run_ours_in_a_folder_of_the_users_own(tmp_path: Path) -> None:
    # A submission directory (the job's working directory) holding train.py, jobs/, cluster.py
    # and submitit.py of the user's own: both python lines of the script still run ours.
    import pickle as pkl
    import shlex
    import subprocess

    from submitit.helpers import DelayedSubmission

    work = tmp_path / "project"
    for name, text in _SHADOWS.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    run_dir = tmp_path / "run"
    folder = submitit_folder(run_dir)
    folder.mkdir(parents=True)
    target = tmp_path / "ran"
    delayed = DelayedSubmission(Path.write_text, target, "called")
    delayed.set_timeout(5, 0)
    delayed.dump(folder / "77_submitted.pkl")
    script = sbatch_script(load_text("name: d\ntrain: {}\n", "s.yaml", ()).spec, run_dir)
    exe = shlex.quote(safe_python().split(" -P")[0])
    srun = next(ln for ln in script.splitlines() if ln.strip().startswith("srun "))
    task = srun[srun.index(exe) :]
    ask = next(ln for ln in script.splitlines() if "--after-step" in ln)
    ask = ask[ask.index("$(") + 2 : ask.rindex(")")]
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),  # the script's setup block exports the checkout
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": "77",
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_TRAIN_IN_PLACE": "0",
        "rc": "3",
    }
    done = subprocess.run(
        ["bash", "-c", task], cwd=work, env=env, capture_output=True, text=True, timeout=120
    )
    assert "SHADOWED" not in done.stdout + done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
    assert target.read_text() == "called"
    with (folder / "77_0_result.pkl").open("rb") as f:
        assert pkl.load(f)[0] == "success"
    after = subprocess.run(
        ["bash", "-c", ask], cwd=work, env=env, capture_output=True, text=True, timeout=60
    )
    assert "SHADOWED" not in after.stdout + after.stderr
    # jobs.launch (ours) answered: the pickle holds no TrainLaunch, the step's own code stands
    assert after.stdout.strip() == "exit 3"


@pytest.mark.parametrize("decided", [True, False])
def test_the_question_after_a_step_reads_the_run_directory_the_script_names(
    tmp_path: Path, decided: bool
) -> None:
    """Issue 46 (a restart in place at the floor): the batch script's question after a step
    names the task's run directory, so a step whose failing rank decided a restart in place is
    restarted without loading the task's pickle (submitit) or the run's spec (pydantic): ~0.2 s
    of one interpreter between the steps. A step nobody decided reads the spec then."""
    import shlex
    import subprocess

    from train.history import RunHistory

    run_dir = tmp_path / "runs" / "r 1"
    spec = load_text("name: d\ntrain: {}\nrequeue: {max_restarts_in_place: 2}\n", "s.yaml", ())
    script = sbatch_script(spec.spec, run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / "resolved.yaml").write_text(
        "name: d\ntrain: {}\nrequeue: {max_restarts_in_place: 2}\n"
    )
    if decided:
        RunHistory(run_dir).append("failure", step=5, restart_count=0, job_id="77",
                                   action="restart_in_place", failure_class="infra")  # fmt: skip
    ask = next(ln for ln in script.splitlines() if "--after-step" in ln)
    ask = ask[ask.index("$(") + 2 : ask.rindex(")")]
    assert f"--run-dir {shlex.quote(str(run_dir))} " in ask
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "SLURM_JOB_ID": "77",
           "SLURM_TRAIN_IN_PLACE": "0", "rc": "1", "PYTHONPROFILEIMPORTTIME": "1"}  # fmt: skip
    done = subprocess.run(["bash", "-c", ask], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in done.stderr.splitlines() if "|" in ln}
    events = [e["event"] for e in RunHistory(run_dir).events()]
    if decided:
        assert done.stdout.strip() == "restart", done.stderr[-2000:]
        assert events == ["failure", "restart_in_place"]
        assert not {"submitit", "pydantic", "yaml"} & imported, sorted(imported)
    else:  # nobody decided: the spec read, the step decided here (no Slurm on this machine)
        assert "pydantic" in imported and "submitit" not in imported
        assert events and events[0] == "failure", done.stderr[-2000:]


def test_dry_run_says_what_each_rank_runs(tmp_path: Path) -> None:
    # Issue 45: not only `python -m submitit.core._submit` on a pickle.
    run_dir = tmp_path / "r"
    out = io.StringIO()
    assert main(["submit", str(EXAMPLE), "--dry-run", f"--set=train.run_dir={run_dir}"], out) == 0
    config = run_dir / "resolved.yaml"
    assert f"#   python -m train --config {config} --run-dir {run_dir}" in out.getvalue()
    sweep = _script("name: d\ntrain: {}\nsweep: {grid: {train.seed: [1, 2]}}\n")
    task = "/runs/demo/tasks/$SLURM_ARRAY_TASK_ID"
    assert f"#   python -m train --config '{task}/resolved.yaml' --run-dir '{task}'" in sweep
    fn = _script("name: d\nentrypoint: {function: 'mine:main'}\n")
    assert "#   which calls entrypoint.function mine:main" in fn


def test_a_path_cannot_end_the_comment_that_names_it() -> None:
    from jobs.render import rank_note

    spec = load_text("name: d\ntrain: {}\n", "s.yaml", ()).spec
    note = rank_note(spec, Path("/runs/a\nrm -rf x"))
    assert all(line.startswith("#") and "\n" not in line for line in note)
