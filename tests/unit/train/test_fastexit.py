"""A supervised command's exit at a stop (train.command.fastexit, train/command/boot): its
Python interpreters skip the collector's last passes while this rank's stop marker exists, run
the ``sitecustomize`` they would have run without ours, and are otherwise left as they are.
Each case runs a real interpreter with the environment the supervisor gives its command. End to
end under a stop: tests/unit/train/test_command.py (``..._exits_without_the_last_collection``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from train.command import child_environ, fastexit, selfrequeue
from train.env import DistEnv

BOOT = str(fastexit.BOOT_DIR)

# An object in a reference cycle, alive until the interpreter's exit: only the collector's last
# pass at finalization frees it, and its __del__ then leaves a file (os functions held by the
# object: the module's globals may be gone by then).
CYCLE = """
import os, sys
class Cycle:
    def __init__(self, path):
        self.me, self.path, self.os_open, self.os_close = self, path, os.open, os.close
    def __del__(self):
        self.os_close(self.os_open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
keep = Cycle(sys.argv[1])
print("ran")
"""


def _python(
    tmp_path: Path, env: dict[str, str], code: str = CYCLE
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, str(tmp_path / "collected")], env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


def _env(tmp_path: Path, stopping: bool, **extra: str) -> dict[str, str]:
    marker = tmp_path / "requeue-0.stopping"
    if stopping:
        marker.touch()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", fastexit.STOPPING_ENV)}
    env.update(extra)
    fastexit.export(env, marker)
    return env


def test_without_the_boot_module_the_cycle_is_collected_at_exit(tmp_path: Path) -> None:
    # the premise the next cases rest on: Python's own exit runs this __del__
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = _python(tmp_path, env)
    assert proc.returncode == 0 and (tmp_path / "collected").exists()


def test_at_a_stop_the_interpreter_exits_without_the_last_collection(tmp_path: Path) -> None:
    proc = _python(tmp_path, _env(tmp_path, stopping=True))
    assert (proc.returncode, proc.stdout) == (0, "ran\n"), proc.stderr
    assert not (tmp_path / "collected").exists()


def test_outside_a_stop_the_exit_is_pythons_own(tmp_path: Path) -> None:
    proc = _python(tmp_path, _env(tmp_path, stopping=False))
    assert (proc.returncode, proc.stdout) == (0, "ran\n"), proc.stderr
    assert (tmp_path / "collected").exists()


def test_the_run_can_turn_it_off(tmp_path: Path) -> None:
    env = _env(tmp_path, stopping=True, **{fastexit.OPT_OUT_ENV: "0"})
    assert "PYTHONPATH" not in env and fastexit.STOPPING_ENV not in env
    proc = _python(tmp_path, env)
    assert proc.returncode == 0 and (tmp_path / "collected").exists()


def _theirs(tmp_path: Path, body: str) -> Path:
    folder = tmp_path / "theirs"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(body)
    return folder


SHOW = (
    "import sys; m = sys.modules.get('sitecustomize'); "
    f"print(getattr(m, '__file__', None)); print({BOOT!r} in sys.path)"
)


def test_the_sitecustomize_it_shadows_still_runs_and_is_the_interpreters(tmp_path: Path) -> None:
    theirs = _theirs(tmp_path, "import os\nos.environ['THEIRS'] = 'ran'\nprint('theirs')\n")
    env = _env(tmp_path, stopping=True, PYTHONPATH=str(theirs))
    assert env["PYTHONPATH"] == os.pathsep.join([BOOT, str(theirs)])
    proc = _python(tmp_path, env, SHOW + "; import os; print(os.environ['THEIRS'])")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["theirs", str(theirs / "sitecustomize.py"), "False", "ran"]


def test_an_error_in_the_shadowed_sitecustomize_is_reported_as_python_would(tmp_path: Path) -> None:
    # Python reports a failing sitecustomize and goes on: the same with ours in front of it
    theirs = _theirs(tmp_path, "raise RuntimeError('their start-up failed')\n")
    env = _env(tmp_path, stopping=True, PYTHONPATH=str(theirs))
    proc = _python(tmp_path, env)
    assert (proc.returncode, proc.stdout) == (0, "ran\n")
    assert "their start-up failed" in proc.stderr
    without = {**env, "PYTHONPATH": str(theirs)}
    assert _python(tmp_path, without).stderr.count("their start-up failed") == 1


def test_an_import_error_inside_the_shadowed_one_is_not_taken_for_its_absence(
    tmp_path: Path,
) -> None:
    theirs = _theirs(tmp_path, "import no_such_module_of_theirs\n")
    proc = _python(tmp_path, _env(tmp_path, stopping=True, PYTHONPATH=str(theirs)))
    assert proc.returncode == 0 and "no_such_module_of_theirs" in proc.stderr


def test_with_none_to_chain_ours_is_the_interpreters_and_off_its_path(tmp_path: Path) -> None:
    proc = _python(tmp_path, _env(tmp_path, stopping=True), SHOW)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [str(fastexit.BOOT_DIR / "sitecustomize.py"), "False"]


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (None, [BOOT]),
        ("", [BOOT, ""]),  # an empty entry (the working directory) is the user's: kept
        (f"/a{os.pathsep}{os.pathsep}/b", [BOOT, "/a", "", "/b"]),
        (f"{BOOT}{os.pathsep}/a{os.pathsep}{BOOT}/", [BOOT, "/a"]),  # ours once (nested runs)
    ],
)
def test_the_boot_folder_goes_first_once_and_the_rest_stays_as_written(
    before: str | None, after: list[str]
) -> None:
    env = {} if before is None else {"PYTHONPATH": before}
    fastexit.export(env, Path("/node/requeue-0.stopping"))
    assert env["PYTHONPATH"].split(os.pathsep) == after
    assert env[fastexit.STOPPING_ENV] == "/node/requeue-0.stopping"


def test_outside_a_slurm_job_nothing_is_added() -> None:
    env = {"PYTHONPATH": "/a", fastexit.STOPPING_ENV: "/stale"}
    fastexit.export(env, None)
    assert env == {"PYTHONPATH": "/a"}


def test_the_commands_environment_names_this_ranks_stop_marker(tmp_path: Path) -> None:
    env = DistEnv(job_id="77", rank=1, world_size=2)
    child = child_environ({"PYTHONPATH": "/theirs"}, env, tmp_path, None, "USR1")
    state = selfrequeue.state_path(tmp_path, env)
    assert child[fastexit.STOPPING_ENV] == str(selfrequeue.stopping_path(state))
    assert child["PYTHONPATH"] == os.pathsep.join([BOOT, "/theirs"])
    # the marker the boot module looks for is the one the stop writes
    assert selfrequeue.stopping_path(state) == Path(f"{state}.stopping")
