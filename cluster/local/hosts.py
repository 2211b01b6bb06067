"""Where the local cluster's nodes live: all on this machine (``shared``), or each a host of
its own (``net``).

``shared`` (the default) is the layout the cluster always had: every ``slurmd`` runs in the
machine's own namespaces, the node names resolve to 127.0.0.1 and the nodes share ``/dev/shm``,
``/tmp`` and the host name.

``net`` makes each node (``n1``, ``n2``, ``n3``) a host of its own, and adds a login host that runs
no ``slurmd``:

- a network namespace per host (``ip netns``), joined to a bridge on the machine by a veth pair:
  the bridge holds the controller's address ``10.77.S.1`` (S from the cluster's port offset, so
  two clusters never share a subnet), the login host ``.10``, node ``nK`` ``.1K``. Only these
  addresses of our own hosts are ever configured; nothing is routed anywhere else;
- its own host name (a UTS namespace) and ``/etc/hosts`` (``/etc/netns/NS/hosts`` bound over it:
  every host's name and the controller's, so MASTER_ADDR resolves from one node to another);
- its own ``/dev/shm`` and ``/tmp`` (a mount namespace with private mounts: a tmpfs, and the
  host's folder ``STATE/hosts/HOST/tmp``), while the checkout, ``/var/tmp`` (the state
  directories), ``/home``, ``/root`` and the paths the cluster shares (:attr:`Network.shared`,
  e.g. the tests' ``/tmp/pytest-of-root``) stay the machine's: the shared file system;
- a long-lived first process (``slurmd`` of a node, ``sleep`` of the login host) whose
  namespaces ``python -m cluster shell HOST`` joins (``nsenter``).

munge stays one daemon on the machine (its socket is in the state directory, which every host
sees); Slurm talks over the addresses (``NodeAddr`` per node, ``SlurmctldHost`` and the
accounting host at the bridge's address). A release in a root file system of its own
(:mod:`cluster.local.release`: 24.11, 26.05) runs the same way: each host's mount namespace
binds its private ``/tmp`` (with the shared paths under it), ``/dev/shm`` and ``/etc/hosts``
over the root's too, so what a node's ``slurmd`` and its jobs see inside the root is that
host's, not the machine's (the root's own binds of the machine's folders stay for the shared
hosts and the machine itself).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cluster.errors import LocalClusterError

#: The layouts ``python -m cluster up --hosts`` accepts.
LAYOUTS = ("shared", "net")
DEFAULT_LAYOUT = "shared"
LOGIN = "login"


def check_layout(name: str) -> str:
    """``name`` if it is a layout, else one line naming the choices."""
    if name not in LAYOUTS:
        raise LocalClusterError(f"hosts layout {name!r}: choose one of {', '.join(LAYOUTS)}")
    return name


@dataclass(frozen=True)
class Network:
    """The hosts of one cluster in the ``net`` layout: names, addresses, namespaces."""

    #: The cluster's port offset (the subnet and the names derive from it).
    port_offset: int
    nodes: tuple[str, ...]
    #: Where each host's node-local folders live (``STATE/hosts``).
    base: Path
    #: Paths under ``/tmp`` every host sees as the machine's (run directories there).
    shared: tuple[str, ...] = field(default=())
    #: The checkout and the interpreter where they live under ``/tmp`` (a CI's clone): bound
    #: like ``shared``, never recorded (they are where this code runs, not the user's choice).
    own: tuple[str, ...] = field(default=())

    @property
    def subnet(self) -> int:
        """The third byte of ``10.77.S.0/24``: one subnet per port offset (offsets are 10
        apart at least: 0, 100, 130, 160, 200, ...)."""
        return (self.port_offset // 10) % 256

    @property
    def controller_addr(self) -> str:
        return f"10.77.{self.subnet}.1"

    @property
    def bridge(self) -> str:
        return f"stb{self.port_offset}"

    @property
    def hosts(self) -> tuple[str, ...]:
        """Every host, the login host first."""
        return (LOGIN, *self.nodes)

    def addr(self, host: str) -> str:
        if host == LOGIN:
            return f"10.77.{self.subnet}.10"
        return f"10.77.{self.subnet}.{11 + self.nodes.index(host)}"

    def netns(self, host: str) -> str:
        return f"slurmtrain-{self.port_offset}-{host}"

    def veth(self, host: str) -> str:
        """The machine's end of the host's veth pair (at most 15 characters)."""
        short = "lg" if host == LOGIN else host
        return f"st{self.port_offset}{short}"

    def host_dir(self, host: str) -> Path:
        return self.base / host

    def etc_hosts(self, host: str) -> Path:
        """The host's ``/etc/hosts`` on the machine (bound over /etc/hosts inside it; where
        ``ip netns exec NS`` would look for it too)."""
        return Path("/etc/netns") / self.netns(host) / "hosts"

    def hosts_file(self, machine: str) -> str:
        """``/etc/hosts`` inside every host: localhost, each host, the controller."""
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        lines += [f"{self.addr(h)} {h}" for h in self.hosts]
        lines.append(f"{self.controller_addr} {machine} controller")
        return "# Generated by `python -m cluster up --hosts net`.\n" + "\n".join(lines) + "\n"

    def setup_commands(self) -> list[list[str]]:
        """``ip`` commands that make the bridge, the namespaces and their links (each
        idempotent step is checked before by :meth:`missing_links`' caller)."""
        prefix = f"{self.controller_addr}/24"
        out = [
            ["ip", "link", "add", self.bridge, "type", "bridge"],
            ["ip", "addr", "add", prefix, "dev", self.bridge],
            ["ip", "link", "set", self.bridge, "up"],
        ]
        for h in self.hosts:
            ns, veth = self.netns(h), self.veth(h)
            out += [
                ["ip", "netns", "add", ns],
                ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns],
                ["ip", "link", "set", veth, "master", self.bridge, "up"],
                ["ip", "-n", ns, "addr", "add", f"{self.addr(h)}/24", "dev", "eth0"],
                ["ip", "-n", ns, "link", "set", "eth0", "up"],
                ["ip", "-n", ns, "link", "set", "lo", "up"],
            ]
        return out

    def teardown_commands(self) -> list[list[str]]:
        """Each host's veth pair (its machine end, by our name: both ends go at once), its
        namespace, then the bridge. Not the namespace alone: its veth pair goes only once the
        kernel destroys it, after its last process exits and then asynchronously, so a cluster
        made again at once met the old pair ("RTNETLINK answers: File exists", CI: the 24.11
        half after the 22.05 one on the same worker)."""
        out: list[list[str]] = []
        for h in self.hosts:
            out += [["ip", "link", "del", self.veth(h)], ["ip", "netns", "del", self.netns(h)]]
        return [*out, ["ip", "link", "del", self.bridge]]

    def host_command(self, host: str, argv: Sequence[str], root: Path | None = None) -> list[str]:
        """``argv`` run as the first process of ``host``: in its network namespace (joined by
        ``nsenter``, not ``ip netns exec``: that one mounts a sysfs of its own, without
        /sys/fs/cgroup, and slurmd 22.05 refuses to start), with its host name, /etc/hosts,
        private ``/dev/shm`` and ``/tmp`` (the shared paths under ``/tmp``
        bound back from the machine's ``/tmp``). ``root``: the release's root file system
        (None: the host's release), whose ``/tmp`` (recursively, with the shared paths),
        ``/dev/shm`` and ``/etc/hosts`` get the host's own too, inside this namespace only.
        An argument list; the script is fixed, every value reaches it as an argument."""
        script = (
            'set -e; name=$1; dir=$2; hosts=$3; root=$4; shift 4; hostname "$name"; '
            'mount --bind "$hosts" /etc/hosts; '
            'mkdir -p "$dir/tmp" "$dir/machine-tmp"; chmod 1777 "$dir/tmp"; '
            'mount --bind /tmp "$dir/machine-tmp"; '
            'mount -t tmpfs -o mode=1777,size=256m "shm-$name" /dev/shm; '
            'mount --bind "$dir/tmp" /tmp; '
            'while [ "$1" != "--" ]; do rel=${1#/tmp/}; mkdir -p "/tmp/$rel" '
            '"$dir/machine-tmp/$rel"; mount --bind "$dir/machine-tmp/$rel" "/tmp/$rel"; shift; '
            "done; shift; "
            'if [ -n "$root" ]; then mount --rbind /tmp "$root/tmp"; '
            'mount --bind /dev/shm "$root/dev/shm"; mount --bind "$hosts" "$root/etc/hosts"; fi; '
            'exec "$@"'
        )
        return [
            "nsenter", f"--net=/run/netns/{self.netns(host)}", "--",
            "unshare", "--uts", "--mount", "--propagation", "private",
            "sh", "-c", script, "sh", host, str(self.host_dir(host)),
            str(self.etc_hosts(host)), "" if root is None else str(root),
            *self.shared, *self.own, "--", *argv,
        ]  # fmt: skip

    def to_json(self) -> str:
        return json.dumps({"shared": list(self.shared)}) + "\n"


def shared_from_json(text: str | None) -> tuple[str, ...]:
    """The shared paths a cluster's ``etc/hosts.json`` records (none when it is damaged)."""
    try:
        data = json.loads(text or "{}")
        shared = data.get("shared", []) if isinstance(data, dict) else []
    except ValueError:
        return ()
    if not isinstance(shared, list):
        return ()
    return tuple(p for p in shared if isinstance(p, str) and is_shareable(p))


def is_shareable(path: str) -> bool:
    """A path under ``/tmp`` (elsewhere is shared already), absolute, without ``..``."""
    p = Path(path)
    under_tmp = p.parts[:2] == ("/", "tmp") and len(p.parts) > 2
    return p.is_absolute() and under_tmp and ".." not in p.parts


def netns_problem() -> str | None:
    """Why network namespaces cannot be made here (None: they can). Tries one: a probe
    namespace made and removed at once (containers without CAP_SYS_ADMIN refuse it)."""
    import os
    import shutil
    import subprocess

    missing = [t for t in ("ip", "nsenter", "unshare") if shutil.which(t) is None]
    if missing:
        return f"--hosts net needs {', '.join(missing)} (apt-get install -y iproute2 util-linux)"
    if os.geteuid() != 0:
        return "--hosts net needs root (network namespaces, a bridge)"
    probe = f"slurmtrain-probe-{os.getpid()}"
    try:
        made = subprocess.run(
            ["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"network namespaces cannot be made here: ip netns add: {exc}"
    if made.returncode != 0:
        return f"network namespaces cannot be made here: ip netns add: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30, check=False)
    return None


def enter_command(pid: int, cwd: str, argv: Sequence[str], user: str | None) -> list[str]:
    """``argv`` in the namespaces of process ``pid`` (a host's first process), in ``cwd``, as
    ``user`` (None: as we are). ``setpriv`` keeps the caller's environment (SLURM_CONF, PATH);
    HOME, USER and LOGNAME are the user's (given by the caller)."""
    inner = 'cd "$1" || exit 1; shift; exec "$@"'
    run_as: list[str] = []
    if user is not None:
        run_as = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups"]
    return [
        "nsenter", "-t", str(pid), "-n", "-u", "-m", "--",
        *run_as, "sh", "-c", inner, "sh", cwd, *argv,
    ]  # fmt: skip
