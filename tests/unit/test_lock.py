"""requirements.lock (what ``make setup`` and CI install) agrees with pyproject.toml (what users
who ``pip install`` the package get): every requirement and every extra is locked at a version
inside its range, every entry is one exact pin with hashes, the lock has no entry that only a
removed requirement wanted, and no CUDA wheels (the CPU-torch rule). ``make lock`` refreshes it.
Reads files only: no network, no pip.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+ (the lock's Python)")

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements.lock"
LOCK_INPUT = REPO / "requirements" / "lock-input.txt"
PYPROJECT = REPO / "pyproject.toml"
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")
# What pip-compile writes for a requirement of the project itself.
FROM_PYPROJECT = "(pyproject.toml)"


class Entry:
    """One package of the lock: its requirement line (pin and hashes) and its ``# via`` lines."""

    def __init__(self, line_no: int, text: str) -> None:
        self.line_no = line_no
        self.text = text
        self.via: list[str] = []

    @property
    def requirement(self) -> Requirement:
        return Requirement(self.text.split(" --", 1)[0].strip())

    @property
    def name(self) -> str:
        return canonicalize_name(self.requirement.name)

    @property
    def version(self) -> Version:
        (spec,) = self.requirement.specifier
        return Version(spec.version)


def parse_lock(text: str) -> list[Entry]:
    """The lock's entries: a requirement with its ``\\``-continued ``--hash`` lines, then the
    indented comments that say which requirements pulled it in."""
    entries: list[Entry] = []
    pending: Entry | None = None  # a requirement line still continued by a trailing backslash
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if pending is not None:
            pending.text += " " + line.rstrip("\\").strip()
            if not line.endswith("\\"):
                pending = None
            continue
        if not line:
            continue
        if line.startswith("#"):
            if raw.startswith(" ") and entries:
                via = line.lstrip("#").strip()
                via = via.removeprefix("via").strip()
                if via:
                    entries[-1].via.append(via)
            continue
        entry = Entry(no, line.rstrip("\\").strip())
        entries.append(entry)
        if line.endswith("\\"):
            pending = entry
    return entries


def project_requirements() -> list[tuple[str, Requirement]]:
    """(where, requirement) for ``[project].dependencies`` and every optional extra."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    found = [("dependencies", Requirement(r)) for r in project["dependencies"]]
    for extra, reqs in project.get("optional-dependencies", {}).items():
        found += [(f"extra {extra!r}", Requirement(r)) for r in reqs]
    return found


def _lock() -> dict[str, Entry]:
    entries = parse_lock(LOCK.read_text())
    assert entries, f"{LOCK.name} has no entries"
    return {e.name: e for e in entries}


def test_every_requirement_and_extra_is_locked_inside_its_range() -> None:
    lock = _lock()
    problems = []
    for where, req in project_requirements():
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # not for this interpreter or platform
        entry = lock.get(canonicalize_name(req.name))
        if entry is None:
            problems.append(f"pyproject.toml {where}: {req} is not in {LOCK.name}")
        elif not req.specifier.contains(entry.version, prereleases=True):
            problems.append(
                f"pyproject.toml {where}: {req} but {LOCK.name}:{entry.line_no} pins "
                f"{entry.version}"
            )
    assert not problems, "run `make lock`:\n" + "\n".join(problems)


def test_every_entry_is_one_exact_pin_with_hashes() -> None:
    problems = []
    for entry in parse_lock(LOCK.read_text()):
        where = f"{LOCK.name}:{entry.line_no}"
        specs = list(entry.requirement.specifier)
        if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
            problems.append(f"{where}: {entry.requirement} is not one exact ==pin")
        if entry.requirement.extras or entry.requirement.url:
            problems.append(f"{where}: {entry.requirement} has extras or a URL")
        if not HASH.search(entry.text):
            problems.append(f"{where}: {entry.name} has no --hash=sha256:")
    assert not problems, "\n".join(problems)


def test_nothing_is_locked_only_for_a_requirement_that_is_gone() -> None:
    """An entry that only the project itself pulled in must still be one of its requirements
    (pip-compile's ``# via`` comments say who pulled each entry in)."""
    wanted = {canonicalize_name(req.name) for _, req in project_requirements()}
    problems = []
    for entry in parse_lock(LOCK.read_text()):
        others = [v for v in entry.via if not v.startswith("-c ")]
        direct_only = bool(others) and all(v.endswith(FROM_PYPROJECT) for v in others)
        if direct_only and entry.name not in wanted:
            problems.append(
                f"{LOCK.name}:{entry.line_no}: {entry.name} is no requirement of pyproject.toml"
            )
    assert not problems, "run `make lock`:\n" + "\n".join(problems)


def test_torch_is_the_cpu_build_and_no_cuda_wheel_is_locked() -> None:
    lock = _lock()
    cuda = [
        f"{LOCK.name}:{e.line_no}: {e.name}"
        for e in lock.values()
        if e.name.startswith("nvidia-") or "cuda" in e.name or e.name == "triton"
    ]
    assert not cuda, "CUDA packages locked (a GPU machine gets them from setup):\n" + "\n".join(
        cuda
    )
    assert lock["torch"].version.local == "cpu", f"torch is locked as {lock['torch'].version}"


def test_the_lock_input_pins_hold_in_the_lock() -> None:
    """requirements/lock-input.txt steers pip-compile (the CPU torch): the lock says the same."""
    lock = _lock()
    for line in LOCK_INPUT.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        entry = lock.get(canonicalize_name(req.name))
        assert entry is not None, f"{LOCK_INPUT.name}: {req} is not in {LOCK.name}"
        assert req.specifier.contains(entry.version, prereleases=True), (
            f"{LOCK_INPUT.name}: {req} but {LOCK.name}:{entry.line_no} pins {entry.version}"
        )


def test_the_parser_reads_pip_compile_output() -> None:
    """The reader above, on a sample in pip-compile's layout (so a format it misreads cannot
    pass the checks above by finding nothing)."""
    sample = (
        "#\n# This file is autogenerated by pip-compile with Python 3.11\n#\n"
        "numpy==2.4.6 \\\n"
        "    --hash=sha256:" + "a" * 64 + " \\\n"
        "    --hash=sha256:" + "b" * 64 + "\n"
        "    # via\n    #   slurm-train (pyproject.toml)\n    #   torch\n"
        "six==1.17.0 \\\n    --hash=sha256:" + "c" * 64 + "\n    # via python-dateutil\n"
        "\n# The following packages are considered to be unsafe in a requirements file:\n"
        "setuptools==84.2.1\n    # via torch\n"
    )
    entries = parse_lock(sample)
    assert [(e.name, str(e.version), e.line_no) for e in entries] == [
        ("numpy", "2.4.6", 4),
        ("six", "1.17.0", 10),
        ("setuptools", "84.2.1", 15),
    ]
    assert entries[0].via == ["slurm-train (pyproject.toml)", "torch"]
    assert entries[1].via == ["python-dateutil"]
    assert len(HASH.findall(entries[0].text)) == 2
    assert not HASH.search(entries[2].text)
