"""The plain Slurm commands ``cluster up`` prints, run by an unprivileged user (issue 43).

On another release than the host's (``SLURM_TRAIN_TEST_SLURM=24.11``), the ``PATH`` the
cluster prints names wrappers that run that release's commands in its root file system: root
through ``chroot``, any other user through an unprivileged user namespace mapped to itself
(cluster/local/release.py). As ``trainee``, in a clean environment holding only that
``PATH`` and ``SLURM_CONF``: ``scontrol version`` names the cluster's release, and a job it
submits runs, as ``trainee``, with that release's commands. On the host's release the same
test holds with Debian's own commands.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from user_helpers import USER, skip_reason, uid, user_dir

pytestmark = [
    pytest.mark.integration,
    pytest.mark.release_sensitive("the release's own commands as a user other than root"),
]


def _as_user(env: dict[str, str], cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    clean = ["env", "-i", f"HOME={cwd}", f"PATH={env['PATH']}", f"SLURM_CONF={env['SLURM_CONF']}"]
    return subprocess.run(
        ["runuser", "-u", USER, "--", *clean, "LANG=C.UTF-8", *argv],
        cwd=cwd, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def test_a_user_runs_the_clusters_own_release_and_its_job_runs_as_it(
    slurm_cluster: object, slurm_env: dict[str, str]
) -> None:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    release = slurm_cluster.slurm.release.name  # type: ignore[attr-defined]
    cluster_dir = Path(slurm_env["SLURM_TRAIN_CLUSTER_DIR"])
    work = user_dir(cluster_dir.parent / f"{cluster_dir.name}-{USER}-release")
    version = _as_user(slurm_env, work, "scontrol", "version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.split()[-1].startswith(f"{release}."), version.stdout
    script = 'printf "%s %s\\n" "$(id -un)" "$(scontrol version)"'
    job = _as_user(
        slurm_env, work, "sbatch", "--parsable", "--wait", "--partition=debug", "--nodes=1",
        "--ntasks=1", "--time=2", "--output=job-%j.out", "--wrap", script,
    )  # fmt: skip
    assert job.returncode == 0, job.stdout + job.stderr
    job_id = job.stdout.strip().split(";")[0]
    out = work / f"job-{job_id}.out"
    assert out.stat().st_uid == uid()
    who, _, said = out.read_text().strip().partition(" ")
    assert who == USER
    assert said.split()[-1].startswith(f"{release}."), said
    # the user's job in accounting, as the user (the release's own sacct; slurmdbd may take
    # a moment to have the end)
    deadline = time.monotonic() + 60
    while True:
        acct = _as_user(
            slurm_env, work, "sacct", "-n", "-X", "-P", "-j", job_id, "-o", "User,State"
        )
        assert acct.returncode == 0, acct.stderr
        if f"{USER}|COMPLETED" in acct.stdout.splitlines() or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert f"{USER}|COMPLETED" in acct.stdout.splitlines(), acct.stdout
