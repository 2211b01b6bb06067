"""The user's own files never stand in for this project's packages (stdlib only, torch-free).

``python -m jobs`` (and ``python -m train``, ``python SCRIPT``) puts the working directory first
on ``sys.path``: in a folder holding the user's own ``train.py`` (the most common file name in
this field), a ``jobs/`` folder or a ``cluster.py``, ``import train`` would run the user's file
instead of this project's package. Two defences, one module:

- :func:`python_module_argv`: every Python subprocess this project starts runs with ``-P``
  (Python >= 3.11: the working directory is not put on ``sys.path``). A flag, not
  ``PYTHONSAFEPATH`` in the environment: the environment reaches the user's own code, whose
  ``python train.py`` must keep finding the modules beside it.
- :func:`shadowed` / :func:`refuse_shadowing`: a command line run as ``python -m PKG`` looks,
  without importing anything of the user's, whether the first entry of ``sys.path`` provides one
  of our package names; if it does, one line names the file and the fix, and the process exits 2.
  Each ``__main__`` calls it before it imports the other packages (``jobs/__main__.py`` says how
  it imports this module while ``train`` itself may be shadowed).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path

PACKAGES = ("jobs", "train", "cluster")
# The folder that holds this project's packages (the checkout, or site-packages).
ROOT = Path(__file__).resolve().parent.parent


#: ``-P`` (Python 3.11+) for a ``python`` line in a script (``jobs.executor``: the batch
#: script's). A script line has no room for :func:`python_module_argv`'s prologue, and the only
#: other way before 3.11, ``-I``, would drop the ``PYTHONPATH`` the script exports.
SAFE_PATH: tuple[str, ...] = ("-P",) if sys.version_info >= (3, 11) else ()


def python_module_argv(module: str, *args: str, unbuffered: bool = False) -> list[str]:
    """``[python, -P, -m, module, *args]``: this project's module, never one from the cwd.

    Before Python 3.11 (no ``-P``) a ``-c`` prologue drops the first ``sys.path`` entry and runs
    the module as ``-m`` would; the module's name stays an argument of its own (``jobs.monitor``
    recognises a local run's processes by it).
    """
    flags = ["-u"] if unbuffered else []
    if SAFE_PATH:
        return [sys.executable, *flags, *SAFE_PATH, "-m", module, *args]
    prologue = (
        "import runpy, sys; del sys.path[0]; "
        "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
    )
    return [sys.executable, *flags, "-c", prologue, module, *args]


def unsafe_first_entry() -> str | None:
    """The ``sys.path`` entry Python put first for the script or ``-m`` (the working directory),
    or None where there is none to fear: ``-P``/``PYTHONSAFEPATH``, or it is our own root."""
    if getattr(sys.flags, "safe_path", False) or not sys.path:
        return None
    first = sys.path[0]
    try:
        if Path(first or ".").resolve() == ROOT:
            return None
    except OSError:
        return None
    return first


def shadowed(entry: str, names: Sequence[str] = PACKAGES) -> list[Path]:
    """The files or folders in ``entry`` that ``import NAME`` would take instead of ours.

    Asked of the import system's own finders, in order, as a fresh import of each name would
    ask them (:func:`fresh_spec`; nothing is imported): a module, a package or a compiled
    extension in ``entry``. A folder there without ``__init__.py`` (a data folder named
    ``train/``) counts only where the import would end in it: under an editable install (our
    packages found by a finder after the path's), not where our regular package comes later
    on the path (a wheel in site-packages).
    """
    where = Path(entry or ".").resolve()
    found: list[Path] = []
    for name in names:
        spec = fresh_spec(name)
        if spec is None:
            continue
        if spec.origin and spec.origin != "namespace":
            origin = Path(spec.origin)
            location = origin.parent if origin.name.startswith("__init__.") else origin
        elif spec.submodule_search_locations:
            location = Path(next(iter(spec.submodule_search_locations)))
        else:
            continue
        if location.resolve().parent == where:
            found.append(location)
    return found


def fresh_spec(name: str) -> ModuleSpec | None:
    """The spec a first ``import NAME`` would get (``sys.modules`` left out of it)."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name, None)
        except (ImportError, OSError, ValueError):
            continue
        if spec is not None:
            return spec
    return None


def shadow_message(found: Sequence[Path], fix: str) -> str:
    """One line: which of the user's files shadows which package, and the fix."""
    first = found[0]
    name = first.name.split(".", 1)[0]
    what = f"./{first.name}" + ("/" if first.is_dir() else "")
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return (
        f"your {what}{more} shadows slurm-train's `{name}` package: run {fix} "
        "(python -m puts the working directory first on sys.path; -P leaves it out)"
    )


def refuse_shadowing(entry: str | None, names: Sequence[str], fix: str) -> None:
    """Exit 2 with one line if ``entry`` (see :func:`unsafe_first_entry`) shadows ``names``."""
    if entry is None:
        return
    found = shadowed(entry, names)
    if found:
        print(shadow_message(found, fix), file=sys.stderr)
        raise SystemExit(2)
