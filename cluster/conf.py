"""Which slurm.conf the Slurm commands use: the one small discovery the client relies on.

``SLURM_CONF`` when set; else Slurm's own default when the machine has ``/etc/slurm/slurm.conf``
(a real cluster); else the first config a registered finder offers. Finders register under the
entry-point group :data:`FINDERS_GROUP` (``pyproject.toml``): the local dev cluster
(``cluster.local.paths:find_local_conf``) is one, so ``python -m jobs`` finds it by itself while
this module, and everything else outside ``cluster/local/``, knows nothing about it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

FINDERS_GROUP = "slurm_train.slurm_conf"
DISTRIBUTION = "slurm-train"
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")

Finder = Callable[[Mapping[str, str]], "str | None"]


def registered_finders() -> list[Finder]:
    """The finders this project's distribution registers under :data:`FINDERS_GROUP`.

    Only our own distribution's ``entry_points.txt`` is read (about 1 ms), not every installed
    package's (``entry_points(group=...)``: 15-40 ms here, on every command). A broken entry
    is skipped.
    """
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        entries = distribution(DISTRIBUTION).entry_points
    except PackageNotFoundError:  # a checkout used without `pip install -e .`
        return []
    finders: list[Finder] = []
    for ep in entries:
        if ep.group != FINDERS_GROUP:
            continue
        try:
            finders.append(ep.load())
        except (ImportError, AttributeError):
            continue
    return finders


def find_slurm_conf(environ: Mapping[str, str], finders: list[Finder] | None = None) -> str | None:
    """The slurm.conf to export as ``SLURM_CONF``; None: leave Slurm to its built-in default."""
    if environ.get("SLURM_CONF"):
        return environ["SLURM_CONF"]
    if SYSTEM_CONF.exists():
        return None
    for finder in registered_finders() if finders is None else finders:
        found = finder(environ)
        if found:
            return str(found)
    return None


#: A folder of Slurm commands to use before PATH's (a local cluster of a release other than the
#: host's prints it: its wrappers of sbatch, squeue, ... run that release's own).
BIN_ENV = "SLURM_TRAIN_SLURM_BIN"
#: The same, found beside a slurm.conf: a one-line file naming the folder (the local cluster
#: writes it), so that ``SLURM_CONF`` alone reaches the commands of the release it runs.
BIN_FILE = "slurm-bin"


def with_slurm_bin(environ: Mapping[str, str], conf: str | None) -> dict[str, str]:
    """``environ`` with the Slurm commands that match ``conf`` first on ``PATH``:
    ``$SLURM_TRAIN_SLURM_BIN``, else the folder the file ``slurm-bin`` beside ``conf`` names,
    else ``PATH`` as it is. A folder that does not exist (inside a job, where the release's own
    commands are on PATH already) changes nothing."""
    env = dict(environ)
    folder = env.get(BIN_ENV, "").strip()
    if not folder and conf:
        try:
            folder = (Path(conf).parent / BIN_FILE).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            folder = ""
    if folder and Path(folder).is_dir() and folder not in env.get("PATH", "").split(":"):
        env["PATH"] = f"{folder}:{env['PATH']}" if env.get("PATH") else folder
    return env


def conf_stamp(conf: str | None) -> str:
    """Changes whenever the config file is edited (path, size, mtime); for caching its limits."""
    path = Path(conf) if conf else SYSTEM_CONF
    try:
        st = path.stat()
    except OSError:
        return f"{path}:missing"
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def cluster_name(conf: str | None) -> str:
    """The ``ClusterName`` of a slurm.conf (how Slurm's accounting names the cluster); "" when
    the file or the line cannot be read. A read of one small file, no Slurm command."""
    path = Path(conf) if conf else SYSTEM_CONF
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        key, sep, value = line.split("#", 1)[0].partition("=")
        if sep and key.strip().lower() == "clustername":
            return value.strip().lower()  # Slurm lower-cases it too
    return ""
