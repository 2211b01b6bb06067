"""``submit --dry-run`` without re-validating a spec that has not changed.

Validation needs pydantic's full import and the spec models built (tens of milliseconds,
more than everything else on this path together). A dry-run is the edit-and-look loop, so the
validated result (submitit parameters, job name, run_dir, array size) is kept under
``$SLURM_TRAIN_STATE_DIR/cache`` keyed by everything it depends on: the spec's bytes, the
``--set`` values, the interpreter, the installed pydantic/pydantic-core/submitit/PyYAML files
and the path, size and mtime of every source file that validates or renders (jobs/,
train/config.py, train/errors.py, cluster/). The rendering itself always runs (submitit's
function, a fresh run directory). Invalid specs are never cached; ``SLURM_TRAIN_NO_CACHE=1``
turns the cache off.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jobs.records import Plan, state_dir
from jobs.render import script_from_parameters

NO_CACHE_ENV = "SLURM_TRAIN_NO_CACHE"
_ROOT = Path(__file__).resolve().parents[1]
_SOURCES = ("train/config.py", "train/errors.py", "train/__init__.py")
_DIRS = ("jobs", "cluster")
FORMAT = 2


def _code_stamp() -> list[Any]:
    stamp: list[Any] = []
    paths = [_ROOT / rel for rel in _SOURCES]
    for d in _DIRS:
        with os.scandir(_ROOT / d) as it:
            paths.extend(Path(e.path) for e in it if e.name.endswith(".py"))
    for p in sorted(paths):
        try:
            st = p.stat()
        except OSError:
            stamp.append([str(p), None])
            continue
        stamp.append([str(p), st.st_size, st.st_mtime_ns])
    return stamp


def _library_stamp() -> list[Any]:
    """The installed pydantic, pydantic-core, submitit and PyYAML, without importing them.

    Importing pydantic and PyYAML only to read their versions would cost more than the cache
    saves; ``find_spec`` of a top-level package locates it without running it. Any install,
    upgrade or edit rewrites these files (new size or mtime) or the package directory.
    """
    stamp: list[Any] = []
    for name in ("pydantic", "pydantic_core", "submitit", "yaml"):
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        if not origin:
            stamp.append([name, None])
            continue
        pkg = Path(origin).parent
        files = [pkg, Path(origin)] + [p for p in (pkg / "version.py",) if p.exists()]
        for f in files:
            st = f.stat()
            stamp.append([str(f), st.st_size, st.st_mtime_ns])
    return stamp


def cache_key(spec_text: str, overrides: Sequence[str]) -> str:
    """Everything the validated parameters depend on, as one string."""
    data = [FORMAT, sys.executable, _library_stamp(), list(overrides), spec_text, _code_stamp()]
    return json.dumps(data, separators=(",", ":"))


def _cache_file(key: str) -> Path:
    return state_dir() / "cache" / f"dry-run-{zlib.crc32(key.encode()):08x}-{len(key)}.json"


def _lookup(key: str) -> dict[str, Any] | None:
    try:
        entry = json.loads(_cache_file(key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    # The file name is only a checksum: the full key must match.
    return entry if isinstance(entry, dict) and entry.get("key") == key else None


def _store(key: str, entry: dict[str, Any]) -> None:
    path = _cache_file(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, **entry}), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written only costs time


def dry_run(spec_path: str, overrides: Sequence[str], root: Path) -> str:
    """The sbatch script ``submit`` would send for this spec (validated, or from the cache)."""
    key = None
    if not os.environ.get(NO_CACHE_ENV):
        try:
            text = Path(spec_path).read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            text = None  # let the loader report it
        if text is not None:
            key = cache_key(text, overrides)
            hit = _lookup(key)
            if hit is not None:
                plan = Plan.new(hit["name"], hit["explicit_dir"], root)
                return script_from_parameters(hit["params"], plan.run_dir, hit["array_size"])
    from jobs.load import load_spec
    from jobs.render import slurm_parameters

    loaded = load_spec(spec_path, overrides)
    spec = loaded.spec
    explicit = spec.train.run_dir if spec.train is not None and not loaded.is_array else None
    array_size = len(loaded.tasks) if loaded.is_array else None
    params = slurm_parameters(spec)
    if key is not None:
        _store(
            key,
            {
                "name": spec.name,
                "explicit_dir": explicit,
                "array_size": array_size,
                "params": params,
            },
        )
    plan = Plan.new(spec.name, explicit, root)
    return script_from_parameters(params, plan.run_dir, array_size)
