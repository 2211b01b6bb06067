"""A wheel of the project holds everything the tool needs once installed (``pip install``, no
checkout): every module of its packages, the sbatch templates ``--template`` fills, ``py.typed``
and both entry points (the ``slurm-train`` command, the local cluster's slurm.conf finder).

Built with the setuptools of this environment (``build_meta``, as ``pip wheel`` would) from a
copy of the sources, so the checkout gets no ``build/`` or ``*.egg-info``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("jobs", "train", "cluster")

pytestmark = pytest.mark.slow  # a wheel build: a few seconds


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in (*PACKAGES, "sbatch_templates"):
        shutil.copytree(REPO / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    build = f"from setuptools import build_meta; print(build_meta.build_wheel({str(out)!r}))"
    proc = subprocess.run(
        [sys.executable, "-c", build], cwd=src, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return zipfile.ZipFile(out / proc.stdout.strip().splitlines()[-1])


def test_the_wheel_holds_every_module_of_the_packages(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            rel = path.relative_to(REPO).as_posix()
            assert rel in names, f"{rel} is not in the wheel"
        assert f"{package}/py.typed" in names


def test_the_wheel_holds_the_sbatch_templates_that_template_names(
    wheel: zipfile.ZipFile,
) -> None:
    from jobs.templates import TEMPLATE_NAMES, TEMPLATES_DIR

    names = set(wheel.namelist())
    where = TEMPLATES_DIR.relative_to(REPO).as_posix()  # beside the packages, once installed
    for name in TEMPLATE_NAMES:
        assert f"{where}/{name}.sbatch" in names, f"{where}/{name}.sbatch is not in the wheel"


def test_the_wheel_declares_the_console_command_and_the_conf_finder(
    wheel: zipfile.ZipFile,
) -> None:
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry_points).decode()
    assert "[console_scripts]\nslurm-train = jobs.cli:console" in text
    assert "[slurm_train.slurm_conf]\nlocal = cluster.local.paths:find_local_conf" in text


def test_the_wheel_holds_our_scontrol_executable(wheel: zipfile.ZipFile) -> None:
    # put first on a supervised command's PATH (train.command.selfrequeue): pip installs a
    # member with an executable mode as executable
    info = wheel.getinfo("train/command/bin/scontrol")
    assert (info.external_attr >> 16) & 0o111 == 0o111


def test_the_wheel_holds_the_boot_module_of_a_commands_exit(wheel: zipfile.ZipFile) -> None:
    # put first on a supervised command's PYTHONPATH (train.command.fastexit): data, beside
    # the package, the one file of its folder
    names = [n for n in wheel.namelist() if n.startswith("train/command/boot/")]
    assert names == ["train/command/boot/sitecustomize.py"]
