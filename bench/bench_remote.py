"""From a laptop (issue 47): ``jobs status`` and one ``--follow`` poll over SSH, against the same
on the login node, on the local cluster (its sshd: ``python -m cluster up``).

One small run is submitted with ``jobs submit --remote slurm-train-login`` (the cluster user,
``trainee``); then, interleaved, in the same run:

- ``jobs status RUN`` from here (``python -m jobs ... --remote``: ssh -G, one ssh command over
  the shared connection, the remote CLI) against ``python3 -m jobs status RUN`` run as the
  cluster user on the login node itself (``runuser``: the same Python, environment and CLI);
- one ``--follow`` poll (:func:`jobs.remote.poll_once`: the remote ``jobs status --json`` and
  the log's new bytes in one round trip) against the same shell line run on the login node.

The ratio is what the laptop pays for the distance: the shared connection should keep it close
to one round trip (goal: status <= 1.6, poll <= 1.3).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from bench.common import REPO, Figure, Goal, Options, bench_env, interleave, skipped, timed

__all__ = ["run"]

SECTION = "From your laptop (local Slurm cluster over SSH)"
HOST = "slurm-train-login"
USER = "trainee"
PY = "/usr/bin/python3"


def run(opts: Options) -> list[Figure]:
    name = "jobs status over ssh"
    if not opts.slurm_conf:
        return [skipped(SECTION, name, "no local cluster config (python -m cluster up)")]
    config = Path(opts.slurm_conf).resolve().parents[1] / "ssh" / "config"
    if not config.is_file():
        return [skipped(SECTION, name, f"no {config}: python -m cluster up starts the sshd")]
    if shutil.which("runuser") is None:
        return [skipped(SECTION, name, "runuser is not installed")]
    work = opts.workdir / "remote"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    remote = Path(f"/var/tmp/slurm-train-bench-remote-{os.getpid()}")
    remote.mkdir(mode=0o755)
    shutil.chown(remote, USER, USER)
    try:
        return _measure(opts, config, work, remote)
    finally:
        shutil.rmtree(remote, ignore_errors=True)


def _measure(opts: Options, config: Path, work: Path, remote: Path) -> list[Figure]:
    from jobs import remote as jr

    code = f"$HOME/slurm-train/code/{REPO.name}"
    site = sysconfig.get_paths()["purelib"]
    setup = [
        f"export SLURM_CONF={opts.slurm_conf}",
        f"export PYTHONPATH={code}:{site}",
        f"export SLURM_TRAIN_STATE_DIR={remote}/state SLURM_TRAIN_RUNS_DIR={remote}/runs",
    ]
    spec = work / "remote.yaml"
    text = (REPO / "examples" / "cifar.yaml").read_text()
    lines = "".join(f'    - "{line}"\n' for line in setup)
    spec.write_text(text.replace("environment:\n", f"environment:\n  setup:\n{lines}", 1))
    env = bench_env(
        {"SLURM_TRAIN_SSH_CONFIG": str(config), "SLURM_TRAIN_STATE_DIR": str(work / "state")}
    )
    argv = [sys.executable, "-m", "jobs"]
    sub = subprocess.run(
        [*argv, "submit", str(spec), "--remote", HOST, "--remote-python", PY,
         "--set", "train.max_steps=4"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    found = re.search(r"submitted (\S+) on ", sub.stderr)
    if sub.returncode != 0 or found is None:
        return [skipped(SECTION, "jobs status over ssh", f"submit: {sub.stderr.strip()[-200:]}")]
    run_id = found.group(1)
    os.environ.update(env)  # the in-process poll reads the same configuration
    jr._TARGETS.clear()
    record = jr.find_remote(run_id)
    assert record is not None
    local = ["runuser", "-u", USER, "--", "sh", "-c"]

    def status_remote() -> None:
        subprocess.run([*argv, "status", run_id], cwd=REPO, env=env, capture_output=True,
                       timeout=120, check=True)  # fmt: skip

    def status_here() -> None:
        line = f"cd && {record.remote.shell(['status', record.run_dir])}"
        subprocess.run([*local, line], capture_output=True, timeout=120, check=True)

    job = record.job_ids[0] if record.job_ids else record.job_id
    tail = f"; tail -c +1 {record.run_dir}/slurm/{job}_0_log.out 2>/dev/null || true"

    def poll_remote() -> None:
        jr.poll_once(record, 0, 0, job)

    def poll_here() -> None:
        argv = ["status", record.run_dir, "--json", "--no-goodput"]
        line = f"cd && {record.remote.shell(argv, tail)}"
        subprocess.run([*local, line], capture_output=True, timeout=120, check=True)

    repeats = 3 if opts.quick else opts.repeats
    status = interleave(
        {"ssh": timed(status_remote), "here": timed(status_here)}, repeats, opts.warmup
    )
    poll = interleave({"ssh": timed(poll_remote), "here": timed(poll_here)}, repeats, opts.warmup)
    return [
        Figure.measured(
            SECTION, "jobs status RUN, from the laptop", "s", status["ssh"], status["here"],
            baseline_name="the same on the login node", goal=Goal("<=", 1.6),
            note="ssh: python -m jobs here + one ssh command (shared connection) + the CLI there",
        ),
        Figure.measured(
            SECTION, "one --follow poll (state + log), from the laptop", "s", poll["ssh"],
            poll["here"], baseline_name="the same shell line on the login node",
            goal=Goal("<=", 1.3), note="one ssh round trip per poll",
        ),
    ]  # fmt: skip
