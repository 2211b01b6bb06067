"""Which Slurm release a local cluster runs, and the root file system a newer release runs in.

22.05 is the host's own Debian package (Debian 12): its daemons and commands run as they are.
A newer release comes from Debian's own registry as a whole root file system, built once with
``mmdebstrap`` (24.11 from Debian 13 "trixie", 26.05 from "sid") and kept under
:data:`DEFAULT_CACHE` keyed by release (``slurm-24.11/root``). Every Slurm daemon of that
release is "a program run in its root" (:meth:`Root.command`: ``chroot ROOT PROGRAM ...``);
a node is a ``slurmd -N NODE`` run in the root (on net hosts, from inside its host's namespaces:
:meth:`cluster.local.hosts.Network.host_command` binds the host's folders over the root's).

What the root needs, and why (../shared/SLURM-NOTES.md, "Newer Slurm releases"):

- bind mounts of what jobs and daemons reach: ``/proc``, ``/sys``, ``/dev``, ``/dev/shm``
  (node-local heartbeats), ``/tmp``, ``/var/tmp`` (the clusters' state directories), ``/root``
  and ``$HOME``, ``/home``, the checkout and the virtual environment's interpreter prefix
  (``realpath``: a venv's ``python`` is a link to it). They are made once, in the machine's
  mount namespace, and kept while the root exists (every cluster of the release shares them);
  one whose source was removed or replaced since (a checkout cloned again at the same path) is
  unmounted and made again (:func:`bind`).
  Never delete a root with ``rm -r`` while they are mounted: unmount them first
  (``umount -R ROOT/proc`` and the rest, the lines of ``/proc/self/mountinfo`` under ROOT);
- ``libffi8`` (the interpreter's ctypes), the host's ``/etc/hosts`` (node names resolve);
- the machine's system Python (``/usr/bin/python3`` -> ``python3.X``, its standard library
  ``/usr/lib/python3.X`` and the shared libraries its interpreter links that the root lacks:
  :func:`system_python_binds`), where the root has no Python of its own: on a real cluster the
  login node and the compute nodes share one image, so a user's venv of the login node's
  ``/usr/bin/python3`` runs on the nodes; here the login host is this machine (Debian 12) and
  the nodes are the release's root (another Debian), which shows that one interpreter the same;
- its munge: the cluster's own munged (its own key and socket in the state directory) serves
  the root's commands through the bind-mounted socket; MariaDB stays the host's.

Plain Slurm commands reach a release through wrappers (:meth:`Root.write_wrappers`), one per
command in ``slurm-RELEASE/bin``: ``chroot ROOT`` then the release's own binary, with the caller's
working directory and arguments exactly (an argument list, nothing re-parsed). A user other than
root (``trainee``) enters the root through an unprivileged user namespace mapped to itself
(``unshare --user --map-current-user --root=ROOT``), and the root's ``/etc/passwd`` and
``/etc/group`` carry the machine's accounts it lacked (:meth:`Root.merge_accounts`). That
directory is not visible inside the root, so a ``PATH`` that names it still finds the release's
own binaries there (a job's ``scontrol requeue`` runs in the root already).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cluster.errors import LocalClusterError

#: The release of the host's own packages (Debian 12), the default.
HOST_RELEASE = "22.05"
#: Where roots are built and kept (one folder per release); the environment may move it.
CACHE_ENV = "SLURM_TRAIN_SLURM_ROOTS"
DEFAULT_CACHE = Path("/var/cache/slurm-train")
#: The commands a wrapper is written for (what people and this project run).
COMMANDS = ("sbatch", "srun", "squeue", "sacct", "scontrol", "scancel", "sinfo", "sacctmgr")
#: Packages of a root (slurm-client holds the commands, slurmdbd the accounting daemon).
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "libffi8")
#: Seconds a root's build may take (about 12 s seen; a slow mirror more).
BUILD_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Release:
    """One Slurm release a local cluster can run."""

    name: str
    #: Debian suite its root is built from; None: the host's own packages, no root.
    suite: str | None
    #: Port offset of its default cluster (beside the default 22.05 one, the life-cycle
    #: test's 100 and the test workers' 200, 300, ...: three ports each, no overlap).
    port_offset: int
    apt_options: tuple[str, ...] = ()

    @property
    def on_host(self) -> bool:
        return self.suite is None

    def default_state_dir(self, base: Path) -> Path:
        """``base`` for the host's release, ``base-RELEASE`` for another."""
        return base if self.on_host else base.with_name(f"{base.name}-{self.name}")


RELEASES: dict[str, Release] = {
    r.name: r
    for r in (
        Release(HOST_RELEASE, None, 0),
        Release("24.11", "trixie", 130),
        # sid's Release file on the mirror may be past its Valid-Until date.
        Release("26.05", "sid", 160, ('Acquire::Check-Valid-Until "false"',)),
    )
}


def release(name: str) -> Release:
    """The release called ``name``; a bad name is one line naming the choices."""
    try:
        return RELEASES[name.strip()]
    except KeyError:
        raise LocalClusterError(
            f"Slurm release {name!r}: choose one of {', '.join(RELEASES)}"
        ) from None


def cache_dir(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get(CACHE_ENV) or DEFAULT_CACHE)


def checkout() -> Path:
    """The checkout this code runs from (jobs run its modules and its venv's interpreter)."""
    return Path(__file__).resolve().parents[2]


def bind_sources() -> list[Path]:
    """What the root shows of this machine, in mount order (``/dev`` before ``/dev/shm``)."""
    wanted = [Path(p) for p in ("/proc", "/sys", "/dev", "/dev/shm", "/dev/pts", "/tmp",
                                "/var/tmp", "/root", "/home")]  # fmt: skip
    home = os.environ.get("HOME")
    extra = [checkout(), Path(os.path.realpath(sys.base_prefix))]
    if home:
        extra.append(Path(home))
    out = [p for p in wanted if p.is_dir()]
    for path in extra:
        path = path.resolve()
        if len(path.parts) < 2 or path.parts[1] in _SYSTEM_TOPS:
            # never over the root's own system (Debian's /usr/bin/python3 has the prefix /usr:
            # a venv of it cannot run in another release's root; one of pyenv or uv can)
            continue
        if path.is_dir() and not any(path == p or p in path.parents for p in out):
            out.append(path)
    return out


#: The machine's system Python, as a user's venv names it (``home = /usr/bin``).
SYSTEM_PYTHON = Path("/usr/bin/python3")


def system_python() -> tuple[Path, Path] | None:
    """(the interpreter ``/usr/bin/python3.X``, its standard library ``/usr/lib/python3.X``)
    of the machine, None where there is no such Debian-style system Python."""
    binary = Path(os.path.realpath(SYSTEM_PYTHON))
    name = binary.name
    if binary.parent != Path("/usr/bin") or not name.startswith("python3.") or not binary.is_file():
        return None
    stdlib = Path("/usr/lib") / name
    return (binary, stdlib) if stdlib.is_dir() else None


def linked_libraries(ldd_output: str) -> list[Path]:
    """The shared libraries ``ldd`` names with a path (``name => /path (0x...)``)."""
    out = []
    for line in ldd_output.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/"):
            out.append(Path(parts[2]))
    return out


def system_python_binds(
    root: Path, ldd_output: str, mounted: Collection[str] = ()
) -> list[tuple[Path, Path]]:
    """(source on the machine, target in ``root``) for the machine's system Python where the
    root has none of its own: the interpreter, its standard library, and each library the
    interpreter links (``ldd_output``) that the root lacks, under the same folder as on the
    machine (its real path: ``/lib`` is a link to ``usr/lib`` in both). Nothing where the root
    has a ``python3.X`` of its own, nothing over a file of the root's. A target that is a
    mount point (``mounted``) is a bind of ours, listed again (:func:`bind` keeps it or, when
    stale, replaces it)."""
    found = system_python()
    if found is None:
        return []
    binary, stdlib = found
    rel_binary = binary.relative_to("/")
    own_binary = _own_file(root / rel_binary) and str(root / rel_binary) not in mounted
    own_stdlib = str(root / stdlib.relative_to("/")) not in mounted and _own_file(
        root / stdlib.relative_to("/") / "os.py"
    )
    if own_binary or own_stdlib:
        return []
    out = [(binary, root / rel_binary), (stdlib, root / stdlib.relative_to("/"))]
    for lib in linked_libraries(ldd_output):
        real = Path(os.path.realpath(lib))
        folder = real.parent.relative_to("/")
        target = root / folder / lib.name
        theirs = (target.exists() or target.is_symlink()) and str(target) not in mounted
        if not real.is_file() or theirs:
            continue  # the root's own (or its link to it)
        out.append((real, target))
    return out


def _own_file(path: Path) -> bool:
    """A file of the root's own there (not an empty placeholder we bind over)."""
    try:
        return path.is_file() and path.stat().st_size > 0
    except OSError:
        return False


#: Top folders of a root that are its own system: never bind-mounted over.
_SYSTEM_TOPS = frozenset({"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "var",
                          "boot", "run"})  # fmt: skip


def _unescape(field: str) -> str:
    # /proc/self/mountinfo escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_points(mountinfo: str) -> set[str]:
    """The mount points of ``/proc/self/mountinfo``'s text (its fifth field)."""
    points = set()
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            points.add(_unescape(fields[4]))
    return points


#: Where the wrappers find chroot and unshare (util-linux 2.38+: ``--map-current-user``).
CHROOT = "/usr/sbin/chroot"
UNSHARE = "/usr/bin/unshare"


def render_wrapper(root: Path, command: str, release_name: str) -> str:
    """A wrapper that runs ``command`` of the release in ``root``: the caller's cwd (``/``
    when the root does not show it) and arguments passed on as they are. Root enters the root
    file system with ``chroot``; any other user (``trainee``) through an unprivileged user
    namespace that maps it to itself (``unshare --user --map-current-user --root``: the same
    uid and gid, so munge vouches for the user as it is and the job runs as it; the root's
    ``/etc/passwd`` knows the machine's users, :func:`merge_accounts`). Where the machine
    refuses such namespaces, one line says so."""
    inner = 'cd "$1" 2>/dev/null || cd /; shift; exec "$@"'
    q_root, q_inner = shlex.quote(str(root)), shlex.quote(inner)
    refused = shlex.quote(
        f"Slurm {release_name}'s {command}: a user other than root runs it through an "
        "unprivileged user namespace (unshare --user), which this machine refuses: run it as "
        "root, or allow user namespaces (sysctl kernel.unprivileged_userns_clone=1)"
    )
    return (
        "#!/bin/sh\n"
        f"# Generated by `python -m cluster up --slurm {release_name}`: Slurm {release_name}'s"
        f" {command}, run in its root file system\n"
        "# (root: chroot; any other user: an unprivileged user namespace, its own uid and gid).\n"
        f'set -- "$PWD" /usr/bin/{command} "$@"\n'
        'if [ "$(id -u)" -eq 0 ]; then\n'
        f'  exec {CHROOT} {q_root} /bin/sh -c {q_inner} sh "$@"\n'
        "fi\n"
        f"if ! {UNSHARE} --user --map-current-user true 2>/dev/null; then\n"
        f"  echo {refused} >&2\n"
        "  exit 1\n"
        "fi\n"
        f'exec {UNSHARE} --user --map-current-user --root={q_root} /bin/sh -c {q_inner} sh "$@"\n'
    )


def merge_accounts(host: str, root: str) -> str:
    """``/etc/passwd`` (or ``/etc/group``) of a root with the machine's accounts it lacks
    appended: an entry whose name and id are both unknown there (``trainee``); the root's own
    system accounts (its munge, ...) are kept as they are. Returns ``root`` unchanged when
    nothing is missing. Lines that are not ``name:x:id:...`` are skipped."""
    names, ids = set(), set()
    for line in root.splitlines():
        fields = line.split(":")
        if len(fields) > 2:
            names.add(fields[0])
            ids.add(fields[2])
    added = []
    for line in host.splitlines():
        fields = line.split(":")
        if len(fields) < 3 or not fields[0] or not fields[2].isdigit():
            continue
        if fields[0] in names or fields[2] in ids:
            continue
        names.add(fields[0])
        ids.add(fields[2])
        added.append(line)
    if not added:
        return root
    head = root if not root or root.endswith("\n") else root + "\n"
    return head + "\n".join(added) + "\n"


def shows(source: Path, target: Path) -> bool:
    """Whether ``target`` is ``source`` itself (a bind of it shows its device and inode)."""
    try:
        s, t = os.stat(source), os.stat(target)
    except OSError:
        return False
    return (s.st_dev, s.st_ino) == (t.st_dev, t.st_ino)


def _read_mount_points() -> set[str]:
    return mount_points(Path("/proc/self/mountinfo").read_text())


def bind(source: Path, target: Path) -> None:
    """``target`` (in a root of ours) showing ``source``: bound unless it shows it already. A
    bind left by an earlier run whose source was removed or replaced since (a checkout cloned
    again at the same path: the mount still shows the deleted folder, and a job there finds
    nothing) is unmounted first (lazily: a process still in it keeps it), every layer of it."""
    mounted = _read_mount_points()
    for _ in range(16):
        if str(target) not in mounted:
            break
        if shows(source, target):
            return
        _mount(["umount", "--lazy", str(target)])  # stale
        mounted = _read_mount_points()
    else:
        raise LocalClusterError(f"{target}: more than 16 stale mounts on it; unmount them")
    if source.is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.touch(exist_ok=True)  # an empty placeholder the bind covers
    _mount(["mount", "--bind", str(source), str(target)])


def _mount(cmd: list[str]) -> None:
    """``mount`` or ``umount``; a refusal is one line naming the command."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        raise LocalClusterError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")


class Root:
    """Runs a release's programs: in its root file system, or as they are for the host's."""

    def __init__(self, rel: Release, cache: Path | None = None) -> None:
        self.release = rel
        self.dir = (cache or cache_dir()) / f"slurm-{rel.name}"

    @property
    def path(self) -> Path | None:
        """The root file system (None for the host's release)."""
        return None if self.release.on_host else self.dir / "root"

    @property
    def bin_dir(self) -> Path | None:
        """The wrappers' folder (None for the host's release: its commands are on PATH)."""
        return None if self.release.on_host else self.dir / "bin"

    def command(self, argv: Iterable[str]) -> list[str]:
        """``argv`` as it runs for this release (``chroot ROOT argv...``, an argument list)."""
        argv = list(argv)
        return argv if self.path is None else ["chroot", str(self.path), *argv]

    # -- making it ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One build or mount at a time per release (test workers start clusters at once)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def prepare(self, hosts: Path = Path("/etc/hosts")) -> None:
        """Build the root once, mount what it must show, copy /etc/hosts in, write the
        wrappers. Idempotent; nothing for the host's release."""
        if self.path is None:
            return
        with self._locked():
            if not (self.path / "usr" / "sbin" / "slurmctld").exists():
                self._build()
            self._bind()
            text = hosts.read_text()
            target = self.path / "etc" / "hosts"
            if not target.exists() or target.read_text() != text:
                target.write_text(text)
            self.merge_accounts()
            self.write_wrappers()

    def merge_accounts(self, etc: Path = Path("/etc")) -> None:
        """The machine's users and groups the root lacks (``trainee``) added to its
        ``/etc/passwd`` and ``/etc/group``: its slurmd starts their jobs as them, its commands
        name them (:func:`merge_accounts`). Replaced whole (a temporary file renamed)."""
        assert self.path is not None
        for name in ("passwd", "group"):
            target = self.path / "etc" / name
            try:
                host, own = (etc / name).read_text(), target.read_text()
            except OSError:
                continue  # no such file on one side: nothing to merge
            merged = merge_accounts(host, own)
            if merged != own:
                tmp = target.with_name(f".{name}.slurm-train")
                tmp.write_text(merged)
                tmp.chmod(target.stat().st_mode & 0o7777)
                tmp.replace(target)

    def _build(self) -> None:
        assert self.path is not None and self.release.suite is not None
        if shutil.which("mmdebstrap") is None:
            raise LocalClusterError(
                f"Slurm {self.release.name} needs mmdebstrap to build its root file system: "
                f"apt-get install -y mmdebstrap (or `make setup SLURM={self.release.name}`)"
            )
        # Built beside its place and renamed when complete: a root is there whole or not at all.
        tmp = self.dir / f"root.building-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)  # a build of ours that died; nothing is mounted in it
        cmd = ["mmdebstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}"]
        cmd += [f"--aptopt={opt}" for opt in self.release.apt_options]
        cmd += [self.release.suite, str(tmp)]
        log = self.dir / "build.log"
        with open(log, "wb") as out:
            try:
                proc = subprocess.run(
                    cmd, stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S,
                    check=False,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                proc = None
        if proc is None or proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise LocalClusterError(
                f"building the root of Slurm {self.release.name} ({self.release.suite}) failed;"
                f" see {log}"
            )
        tmp.rename(self.path)

    def _bind(self) -> None:
        assert self.path is not None
        for source in bind_sources():
            bind(source, self.path / source.relative_to("/"))
        self._bind_system_python()

    def _bind_system_python(self) -> None:
        """The machine's system Python in the root (:func:`system_python_binds`), and
        ``/usr/bin/python3`` linking to it where the root has no ``python3`` of its own."""
        assert self.path is not None
        found = system_python()
        if found is None:
            return
        try:
            ldd = subprocess.run(
                ["ldd", str(found[0])], capture_output=True, text=True, timeout=30, check=False
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            ldd = ""
        root = self.path.resolve()
        for source, target in system_python_binds(root, ldd, _read_mount_points()):
            parent = Path(os.path.realpath(target.parent))
            if parent != root and root not in parent.parents:
                continue  # a link in the root pointing out of it: never follow it
            bind(source, target)
        link = root / SYSTEM_PYTHON.relative_to("/")
        if (
            not link.exists()
            and not link.is_symlink()
            and (root / found[0].relative_to("/")).exists()
        ):
            link.symlink_to(found[0].name)  # relative: python3.X beside it, in the root

    def write_wrappers(self) -> None:
        assert self.path is not None and self.bin_dir is not None
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        for command in COMMANDS:
            path = self.bin_dir / command
            text = render_wrapper(self.path, command, self.release.name)
            if not path.exists() or path.read_text() != text:
                tmp = path.with_name(f".{command}.tmp")
                tmp.write_text(text)
                tmp.chmod(0o755)
                tmp.replace(path)
