"""The local cluster's life cycle: ``up`` (idempotent), ``status`` and ``down``.

Start order: munged -> MariaDB -> slurmdbd -> slurmctld -> slurmd n1, n2, n3. ``down`` goes in
reverse, after cancelling every job, and then proves that no marked process is left.

A changed config reaches running daemons by itself: each Slurm daemon gets a stamp (the SHA-256 of
the config files it reads) when ``up`` starts it, and ``up`` restarts the live ones whose stamp
differs (slurmctld before the slurmds; a new node needs both, ``scontrol reconfigure`` is not
enough). Jobs survive it: slurmctld keeps its state and running steps belong to slurmstepd.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cluster.conf import BIN_FILE
from cluster.errors import LocalClusterError
from cluster.local import config as cfg
from cluster.local import sshd
from cluster.local.daemons import (
    MARKER_ENV,
    DaemonStatus,
    log_tail,
    marked_processes,
    pid_alive,
    pid_runs,
    read_pid,
    read_text,
    run_checked,
    run_ok,
    spawn_detached,
    stop_pid,
    wait_until,
)
from cluster.local.files import is_stale, stamp, write_config
from cluster.local.hosts import (
    DEFAULT_LAYOUT,
    LOGIN,
    Network,
    check_layout,
    enter_command,
    is_shareable,
    shared_from_json,
)
from cluster.local.paths import port_offset as default_port_offset
from cluster.local.paths import state_dir as default_state_dir
from cluster.local.release import HOST_RELEASE, Release, Root, release

#: What the host needs for any release (munge and MariaDB stay the host's) ...
REQUIRED = {
    "munged": "munge",
    "mariadbd": "mariadb-server",
    "mariadb-install-db": "mariadb-server",
}
#: ... and for its own release (the others run their root's).
REQUIRED_HOST_SLURM = {
    "slurmdbd": "slurmdbd",
    "slurmctld": "slurm-wlm",
    "slurmd": "slurm-wlm",
    "sacctmgr": "slurm-wlm",
}
SBIN = "/usr/sbin:/usr/bin:/sbin:/bin"
#: How long slurmdbd may take to answer after its start (see :meth:`LocalCluster._start_slurmdbd`).
SLURMDBD_READY_S = 240.0


@dataclass(frozen=True)
class UpResult:
    started: list[str]
    already_running: list[str]
    config_changed: bool
    #: Live daemons restarted because the config they run with changed.
    restarted: list[str] = field(default_factory=list)


def _own_paths() -> list[str]:
    """The checkout this code runs from and the interpreter's prefixes (resolved): what every
    host must see, as on a real cluster's shared file system."""
    import sys

    paths = [Path(__file__).resolve().parents[2], Path(sys.prefix).resolve()]
    paths.append(Path(sys.base_prefix).resolve())
    return list(dict.fromkeys(str(p) for p in paths))


class LocalCluster:
    """A real Slurm cluster of three nodes on this machine, in one state directory."""

    def __init__(
        self,
        root: Path | None = None,
        hostname: str | None = None,
        port_offset: int | None = None,
        slurm: str | None = None,
        hosts: str | None = None,
        shared: Sequence[str] | None = None,
    ) -> None:
        """``root`` and ``port_offset`` default to what the environment says
        (SLURM_TRAIN_CLUSTER_DIR, SLURM_TRAIN_CLUSTER_PORT_OFFSET), else the default cluster.
        ``slurm``: the release (:data:`cluster.local.release.RELEASES`); by default the one the
        state directory records, else the host's. ``hosts``: the hosts layout
        (:mod:`cluster.local.hosts`: ``shared`` or ``net``), by default the recorded one, else
        ``shared``; ``shared``: the paths under /tmp every host of ``net`` sees as the
        machine's (by default the recorded ones)."""
        offset = default_port_offset() if port_offset is None else port_offset
        self.layout = cfg.Layout((root or default_state_dir()).resolve(), offset)
        self.hostname = hostname or socket.gethostname().split(".", 1)[0]
        recorded = self.recorded_release()
        self.release: Release = release(slurm or recorded or HOST_RELEASE)
        self.slurm = Root(self.release)
        self.hosts_layout = check_layout(hosts or self.recorded_hosts_layout() or DEFAULT_LAYOUT)
        if shared is None:
            shared_paths = shared_from_json(read_text(self.layout.hosts_json))
        else:
            bad = [p for p in shared if not is_shareable(p)]
            if bad:
                raise LocalClusterError(
                    f"--share {bad[0]!r}: give an absolute path under /tmp (the rest of the "
                    "machine's file system is shared already)"
                )
            shared_paths = tuple(shared)
        self.net: Network | None = None
        if self.hosts_layout == "net":
            # the checkout and this interpreter are the shared file system of the hosts too,
            # also where they live under /tmp (a CI's clone): bound into every host's /tmp
            own = tuple(p for p in _own_paths() if is_shareable(p) and p not in shared_paths)
            self.net = Network(self.layout.port_offset, cfg.NODES, self.layout.hosts_dir,
                               shared_paths, own)  # fmt: skip

    def recorded_hosts_layout(self) -> str | None:
        """The hosts layout the state directory's cluster was last brought up with."""
        return read_text(self.layout.hosts_layout_file) or None

    def recorded_release(self) -> str | None:
        """The release the state directory's cluster was last brought up with (None: none)."""
        return read_text(self.layout.release_file) or None

    # -- paths and environment ---------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.layout.slurm_conf

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = f"{env.get('PATH', '')}:{SBIN}"
        env[MARKER_ENV] = str(self.layout.root)
        return env

    def client_environ(self) -> dict[str, str]:
        """What a shell (or a :class:`cluster.client.SlurmClient`) needs to reach this cluster:
        ``SLURM_CONF``, and the release's wrappers first on ``PATH``."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        if self.slurm.bin_dir is not None:
            env["PATH"] = f"{self.slurm.bin_dir}:{env.get('PATH', '')}"
        return env

    def _cmd(self, *argv: str) -> list[str]:
        """A Slurm program of this cluster's release, as it runs (in its root, if any)."""
        return self.slurm.command(argv)

    def daemons(self) -> list[tuple[str, Path, Path]]:
        """(name, pid file, log file) in start order."""
        L = self.layout
        out = [
            ("munged", L.pid_file("munged"), L.log_file("munged")),
            ("mariadbd", L.pid_file("mariadbd"), L.log_file("mariadbd")),
            ("slurmdbd", L.pid_file("slurmdbd"), L.log_file("slurmdbd")),
            ("slurmctld", L.pid_file("slurmctld"), L.log_file("slurmctld")),
        ]
        out += [
            (f"slurmd-{n}", L.run / f"slurmd-{n}.pid", L.log / f"slurmd-{n}.log") for n in cfg.NODES
        ]
        if self.net is not None:
            # the login host's first process (``sleep``), whose namespaces `cluster shell` joins
            out.append((LOGIN, L.pid_file(LOGIN), L.log_file(LOGIN)))
        if self.login_server() is not None:  # the login node of --remote (cluster/local/sshd.py)
            out.append(("sshd", L.pid_file("sshd"), L.log_file("sshd")))
        return out

    @staticmethod
    def _program(daemon: str) -> str:
        """The program a daemon's pid runs (its /proc/PID/comm)."""
        return "sleep" if daemon == LOGIN else daemon.split("-", 1)[0]

    def login_server(self) -> sshd.LoginServer | None:
        """The cluster's sshd, None where openssh-server or the login user is missing."""
        if not sshd.installed() or sshd.login_user() is None:
            return None
        L, net = self.layout, self.net
        # with net hosts it is the login host's own: its address, its namespaces
        return sshd.LoginServer(
            L.root, sshd.SSHD_PORT + L.port_offset, L.run, L.log,
            address="127.0.0.1" if net is None else net.addr(LOGIN),
            on_host=None if net is None else self._on_login_host,
            bin_dir=self.slurm.bin_dir, slurm_conf=L.slurm_conf,
        )  # fmt: skip

    # -- checks ------------------------------------------------------------------------------
    def check_installed(self) -> None:
        path = f"{os.environ.get('PATH', '')}:{SBIN}"
        required = dict(REQUIRED, **(REQUIRED_HOST_SLURM if self.release.on_host else {}))
        missing = sorted({pkg for exe, pkg in required.items() if not shutil.which(exe, path=path)})
        if missing:
            raise LocalClusterError(
                "Slurm packages missing: apt-get install -y "
                + " ".join(missing)
                + " (or run `make setup`, which installs them)"
            )
        if os.geteuid() != 0:
            raise LocalClusterError("the local cluster needs root (daemons, /etc/hosts)")

    def status(self) -> list[DaemonStatus]:
        out = []
        for name, pid_file, log in self.daemons():
            pid = read_pid(pid_file)
            out.append(DaemonStatus(name, pid, pid_runs(pid, self._program(name)), log))
        return out

    def healthy(self) -> bool:
        return all(d.alive for d in self.status()) and self._nodes_ready()

    # -- up ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """One ``up``/``down`` at a time per state directory: a second one waits for the first
        (two at once raced, e.g. two mariadbd on one data directory)."""
        self.layout.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.layout.root / "cluster.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def up(self, timeout: float = 120.0) -> UpResult:
        """Bring every daemon up (live ones with the current config are left alone, those with
        an older one restarted) and wait for idle nodes. Concurrent calls run one after another."""
        with self._exclusive():
            return self._up(timeout)

    def _up(self, timeout: float) -> UpResult:
        self.check_installed()
        self._check_release()
        self._check_hosts_layout()
        changed = write_config(self.layout, self.hostname, self.release.name, self.net)
        self.layout.release_file.write_text(f"{self.release.name}\n")
        self._write_bin_file()
        self.layout.hosts_layout_file.write_text(f"{self.hosts_layout}\n")
        if self.net is None:
            self.layout.hosts_json.unlink(missing_ok=True)
            self._ensure_hosts()
        else:
            self.layout.hosts_json.write_text(self.net.to_json())
            self._ensure_network()
        self.slurm.prepare()
        started: list[str] = []
        running: list[str] = []
        restarted: list[str] = []
        steps = [
            ("munged", self._start_munged),
            ("mariadbd", self._start_mariadb),
            ("slurmdbd", self._start_slurmdbd),
            ("slurmctld", self._start_slurmctld),
        ] + [(f"slurmd-{n}", lambda n=n: self._start_slurmd(n)) for n in cfg.NODES]
        if self.net is not None:
            steps.append((LOGIN, self._start_login))
        login = self.login_server()
        if login is not None:
            if login.write(sshd.login_user() or sshd.DEFAULT_USER):  # a new port, a new Match
                changed.add(login.dir / "sshd_config")
            steps.append(("sshd", login.start))
        status = {d.name: d for d in self.status()}
        for name, start in steps:
            if status[name].alive and is_stale(self.layout, name, changed):
                # Started with an older config: stop it here, start it again below.
                stop_pid(status[name].pid or 0)
                restarted.append(name)
            elif status[name].alive:
                running.append(name)
                stamp(self.layout, name)
                continue
            start()
            stamp(self.layout, name)
            if name not in restarted:
                started.append(name)
            if name == "slurmdbd" or (name == "slurmctld" and "slurmdbd" in running):
                self._register_cluster()
        self._wait_nodes(timeout)
        return UpResult(started, running, bool(changed), restarted)

    def _write_bin_file(self) -> None:
        """``etc/slurm-bin`` beside slurm.conf names the release's wrappers, so a client given
        only ``SLURM_CONF`` runs them (:func:`cluster.conf.with_slurm_bin`); none for the host's
        release."""
        path = self.layout.etc / BIN_FILE
        if self.slurm.bin_dir is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(f"{self.slurm.bin_dir}\n")

    def _check_release(self) -> None:
        """A state directory keeps its release: its accounting database and the controller's
        state are that release's (an older Slurm cannot read a newer one's). Another release
        gets a state directory of its own (each release's default is)."""
        recorded = self.recorded_release()
        if recorded and recorded != self.release.name:
            raise LocalClusterError(
                f"{self.layout.root} holds a cluster of Slurm {recorded}, not "
                f"{self.release.name}: use another --state-dir, or bring it down "
                f"(python -m cluster --state-dir {self.layout.root} down) and remove it"
            )

    def _check_hosts_layout(self) -> None:
        """A running cluster keeps its hosts layout (its nodes' addresses are in the
        controller's state)."""
        recorded = self.recorded_hosts_layout()
        running = any(d.alive for d in self.status())
        if running and recorded and recorded != self.hosts_layout:
            raise LocalClusterError(
                f"{self.layout.root} runs a cluster with --hosts {recorded}: bring it down "
                f"(python -m cluster --state-dir {self.layout.root} down) before --hosts "
                f"{self.hosts_layout}"
            )

    def _ensure_network(self) -> None:
        """The bridge, each host's namespace, link and address, and its /etc/hosts
        (``/etc/netns/NS/hosts``, which ``ip netns exec`` shows as /etc/hosts). Made afresh
        unless all of it is there."""
        net = self.net
        assert net is not None
        for h in net.hosts:
            path = net.etc_hosts(h)
            path.parent.mkdir(parents=True, exist_ok=True)
            text = net.hosts_file(self.hostname)
            if read_text(path, strip=False) != text:
                path.with_name("hosts.tmp").write_text(text)
                path.with_name("hosts.tmp").replace(path)
            net.host_dir(h).mkdir(parents=True, exist_ok=True)
        complete = Path(f"/sys/class/net/{net.bridge}").exists() and all(
            Path(f"/run/netns/{net.netns(h)}").exists() for h in net.hosts
        )
        if complete:
            return
        self._remove_network(keep_files=True)
        for argv in net.setup_commands():
            run_checked(argv, env=self.env(), what="the hosts' network (--hosts net)")

    def _remove_network(self, keep_files: bool = False) -> None:
        """The namespaces (their veth pairs go with them) and the bridge, if there."""
        if self.net is None:
            return
        for argv in self.net.teardown_commands():
            run_ok(argv, self.env())
        if not keep_files:
            for h in self.net.hosts:
                shutil.rmtree(self.net.etc_hosts(h).parent, ignore_errors=True)

    def _as_host(self, host: str, argv: list[str]) -> list[str]:
        """``argv`` as the first process of ``host`` (as it is in the shared layout)."""
        return argv if self.net is None else self.net.host_command(host, argv, self.slurm.path)

    def _start_login(self) -> None:
        L = self.layout
        pid_file, log = L.pid_file(LOGIN), L.log_file(LOGIN)
        pid = spawn_detached(self._as_host(LOGIN, ["sleep", "infinity"]), env=self.env(), log=log)
        pid_file.write_text(f"{pid}\n")
        wait_until(
            lambda: pid_runs(pid, "sleep"), timeout=20, what="the login host", log=log,
            pid_file=pid_file,
        )  # fmt: skip

    def _on_login_host(self, argv: list[str]) -> list[str]:
        """``argv`` in the login host's namespaces (joined, as `cluster shell login` does)."""
        return enter_command(self.host_pid(LOGIN), "/", argv, None)

    def host_pid(self, host: str) -> int:
        """The first process of ``host`` (a node's slurmd, the login host's sleep)."""
        if self.net is None:
            raise LocalClusterError(
                f"{self.layout.root} runs every node on this machine (--hosts shared): there "
                "is no host to enter; bring it up with --hosts net"
            )
        if host not in self.net.hosts:
            raise LocalClusterError(f"host {host!r}: choose one of {', '.join(self.net.hosts)}")
        name = LOGIN if host == LOGIN else f"slurmd-{host}"
        pid_file = dict((d, p) for d, p, _ in self.daemons())[name]
        pid = read_pid(pid_file)
        if pid is None or not pid_runs(pid, self._program(name)):
            raise LocalClusterError(
                f"host {host} is not running: python -m cluster --state-dir {self.layout.root} up"
            )
        return pid

    def shell_command(self, host: str, argv: list[str], cwd: str, user: str | None) -> list[str]:
        """``argv`` on ``host`` in ``cwd`` as ``user`` (None: root, as we are)."""
        return enter_command(self.host_pid(host), cwd, argv, user)

    def _ensure_hosts(self) -> None:
        """Node names must resolve (they become MASTER_ADDR): missing ones get a line."""
        missing = []
        for n in cfg.NODES:
            try:
                socket.gethostbyname(n)
            except OSError:
                missing.append(n)
        if missing:
            with open("/etc/hosts", "a") as f:
                f.write(f"127.0.0.1 {' '.join(missing)}  # slurm-train local cluster\n")

    def _start_munged(self) -> None:
        L = self.layout
        L.munge_dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(L.munge_dir, "munge", "munge")
        L.munge_dir.chmod(0o755)
        if not L.munge_key.exists():
            L.munge_key.write_bytes(secrets.token_bytes(1024))
        shutil.chown(L.munge_key, "munge", "munge")
        L.munge_key.chmod(0o400)
        pid_file, log = L.pid_file("munged"), L.log_file("munged")
        pid_file.unlink(missing_ok=True)
        run_checked(
            [
                "runuser", "-u", "munge", "--", "munged",
                f"--socket={L.munge_socket}",
                f"--key-file={L.munge_key}",
                f"--pid-file={L.munge_dir / 'munged.pid'}",
                f"--log-file={L.munge_dir / 'munged.log'}",
                f"--seed-file={L.munge_dir / 'munged.seed'}",
            ],
            env=self.env(),
            what="munged",
            log=L.munge_dir / "munged.log",
        )  # fmt: skip

        def ready() -> bool:
            cred = run_ok(["munge", "-n", f"--socket={L.munge_socket}"], self.env())
            return (
                cred is not None
                and run_ok(["unmunge", f"--socket={L.munge_socket}"], self.env(), cred) is not None
            )

        wait_until(ready, timeout=20, what="munged", log=L.munge_dir / "munged.log")
        # munged writes its pid file as the munge user inside its own dir; mirror it to run/.
        pid = read_pid(L.munge_dir / "munged.pid")
        pid_file.write_text(f"{pid}\n")
        log.unlink(missing_ok=True)
        log.symlink_to(L.munge_dir / "munged.log")

    def _start_mariadb(self) -> None:
        L = self.layout
        pid_file, log = L.pid_file("mariadbd"), L.log_file("mariadbd")
        shutil.chown(L.mysql_dir, "mysql", "mysql")
        L.mysql_tmp.mkdir(exist_ok=True)
        shutil.chown(L.mysql_tmp, "mysql", "mysql")
        fresh = not (L.mysql_data / "mysql").exists()
        if fresh:
            run_checked(
                [
                    "mariadb-install-db", "--no-defaults", "--user=mysql",
                    f"--datadir={L.mysql_data}", f"--tmpdir={L.mysql_tmp}",
                    "--auth-root-authentication-method=socket", "--skip-test-db",
                ],
                env=self.env(), timeout=120, what="mariadb-install-db",
            )  # fmt: skip
        pid = spawn_detached(
            [
                "mariadbd", "--no-defaults", "--user=mysql", f"--datadir={L.mysql_data}",
                f"--tmpdir={L.mysql_tmp}", f"--socket={L.mysql_socket}", f"--port={L.mariadb_port}",
                "--bind-address=127.0.0.1", f"--pid-file={L.mysql_dir / 'mariadbd.pid'}",
                "--innodb-buffer-pool-size=64M", "--skip-name-resolve",
                # the log is flushed at each commit, synced to disk once a second: a crash of
                # mariadbd loses nothing, one of the host at most the last second of accounting,
                # and jobs' accounting writes do not wait for the disk (several clusters at
                # once on one disk: the test workers)
                "--innodb-flush-log-at-trx-commit=2",
            ],
            env=self.env(),
            log=log,
        )  # fmt: skip
        pid_file.write_text(f"{pid}\n")
        wait_until(
            lambda: L.mysql_socket.exists() and self._sql("SELECT 1") is not None,
            timeout=60, what="mariadbd", log=log, pid_file=pid_file,
        )  # fmt: skip
        password = L.db_password.read_text().strip()
        # Idempotent: the password is hex, so it is safe inside the SQL string literal.
        setup = (
            f"CREATE DATABASE IF NOT EXISTS {cfg.DB_NAME}; "
            f"CREATE USER IF NOT EXISTS '{cfg.DB_USER}'@'127.0.0.1' IDENTIFIED BY '{password}'; "
            f"CREATE USER IF NOT EXISTS '{cfg.DB_USER}'@'localhost' IDENTIFIED BY '{password}'; "
            f"GRANT ALL ON {cfg.DB_NAME}.* TO '{cfg.DB_USER}'@'127.0.0.1'; "
            f"GRANT ALL ON {cfg.DB_NAME}.* TO '{cfg.DB_USER}'@'localhost'; FLUSH PRIVILEGES;"
        )
        if self._sql(setup) is None:
            raise LocalClusterError(
                f"mariadbd: could not create the accounting database\n{log_tail(log)}"
            )

    def _sql(self, statement: str) -> str | None:
        return run_ok(
            ["mysql", "--no-defaults", f"--socket={self.layout.mysql_socket}", "-u", "root",
             "-N", "-e", statement],
            self.env(),
        )  # fmt: skip

    def _start_slurmdbd(self) -> None:
        L = self.layout
        pid_file, log = L.pid_file("slurmdbd"), L.log_file("slurmdbd")
        pid_file.unlink(missing_ok=True)
        env = self.env()
        env["SLURM_CONF"] = str(L.slurm_conf)
        run_checked(self._cmd("slurmdbd"), env=env, what="slurmdbd", log=log)
        # Its first start on a new database creates the accounting tables (dozens, each synced
        # to disk) before it answers or logs a line: a minute and more on a busy disk (seen:
        # a test's second cluster starting beside four test workers' busy ones).
        wait_until(
            lambda: run_ok(self._cmd("sacctmgr", "-n", "-P", "list", "cluster"), env) is not None,
            timeout=SLURMDBD_READY_S, what="slurmdbd", log=log, pid_file=pid_file,
        )  # fmt: skip

    def _register_cluster(self) -> None:
        # Registered before slurmctld starts, so accounting of the first jobs is not lost.
        env = self.env()
        clusters = run_ok(
            self._cmd("sacctmgr", "-n", "-P", "list", "cluster", "format=Cluster"), env
        )
        if cfg.CLUSTER_NAME not in (clusters or "").split():
            run_checked(
                self._cmd("sacctmgr", "-i", "add", "cluster", cfg.CLUSTER_NAME),
                env=env, what="sacctmgr add cluster", log=self.layout.log_file("slurmdbd"),
            )  # fmt: skip

    def _start_slurmctld(self) -> None:
        L = self.layout
        pid_file, log = L.pid_file("slurmctld"), L.log_file("slurmctld")
        pid_file.unlink(missing_ok=True)
        env = self.env()
        run_checked(self._cmd("slurmctld"), env=env, what="slurmctld", log=log)
        wait_until(
            lambda: "UP" in (run_ok(self._cmd("scontrol", "ping"), env) or ""),
            timeout=60, what="slurmctld", log=log, pid_file=pid_file,
        )  # fmt: skip

    def _start_slurmd(self, node: str) -> None:
        L = self.layout
        pid_file, log = L.run / f"slurmd-{node}.pid", L.log / f"slurmd-{node}.log"
        pid_file.unlink(missing_ok=True)
        run_checked(
            self._as_host(node, self._cmd("slurmd", "-N", node)),
            env=self.env(), what=f"slurmd {node}", log=log,
        )  # fmt: skip
        wait_until(
            lambda: pid_alive(read_pid(pid_file)),
            timeout=30, what=f"slurmd {node}", log=log, pid_file=None,
        )  # fmt: skip

    def scontrol(self, args: list[str], what: str) -> str:
        return run_checked(self._cmd("scontrol", *args), env=self.env(), what=what).stdout

    def node_states(self) -> dict[str, str]:
        out = run_ok(self._cmd("sinfo", "-h", "-N", "-o", "%N|%T"), self.env()) or ""
        states: dict[str, str] = {}
        for line in out.splitlines():
            if "|" in line:
                name, state = line.split("|", 1)
                states[name.strip()] = state.strip()
        return states

    def _nodes_ready(self) -> bool:
        states = self.node_states()
        return all(
            states.get(n, "").rstrip("*~#%$@^-+").lower() in {"idle", "mixed", "allocated"}
            for n in cfg.NODES
        )

    def _wait_nodes(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        resumed = False
        while time.monotonic() < deadline:
            states = self.node_states()
            if self._nodes_ready():
                return
            bad = [
                n for n, s in states.items()
                if any(k in s.lower() for k in ("drain", "inval", "down", "fail"))
            ]  # fmt: skip
            if bad and not resumed:
                # A node left drained/INVAL by an earlier run: Slurm needs an explicit resume.
                run_ok(
                    self._cmd("scontrol", "update", f"nodename={','.join(bad)}", "state=resume"),
                    self.env(),
                )
                resumed = True
            time.sleep(0.5)
        logs = "\n".join(
            f"--- {log} ---\n{log_tail(log, 8)}" for name, _, log in self.daemons()
            if name.startswith("slurmd") or name == "slurmctld"
        )  # fmt: skip
        raise LocalClusterError(
            f"nodes not idle after {timeout:g}s "
            f"(sinfo: {self.node_states() or 'no answer'})\n{logs}"
        )

    # -- down --------------------------------------------------------------------------------
    def down(self) -> list[str]:
        """Cancel all jobs, stop every daemon we started (reverse order), kill leftovers."""
        with self._exclusive():
            return self._down()

    def _down(self) -> list[str]:
        stopped: list[str] = []
        status = {d.name: d for d in self.status()}
        if status.get("slurmctld") and status["slurmctld"].alive:
            run_ok(self._cmd("scancel", "--full", "--quiet", "--state=RUNNING"), self.env())
            run_ok(self._cmd("scancel", "--quiet", "--state=PENDING"), self.env())
            jobs = (run_ok(self._cmd("squeue", "-h", "-o", "%i"), self.env()) or "").split()
            if jobs:
                run_ok(self._cmd("scancel", *jobs), self.env())
        for name, pid_file, _ in reversed(self.daemons()):
            pid = read_pid(pid_file)
            if pid is not None and pid_runs(pid, self._program(name)):
                stop_pid(pid)
                stopped.append(name)
            pid_file.unlink(missing_ok=True)
        # slurmstepd and anything else started under our daemons carries the marker.
        for pid in marked_processes(self.layout.root):
            stop_pid(pid, timeout=5)
        self.layout.mysql_socket.unlink(missing_ok=True)
        login = self.login_server()
        if login is not None:  # its PAM service in /etc/pam.d goes with it
            login.forget_pam()
        self._remove_network()
        return stopped

    def leftovers(self) -> list[int]:
        return [p for p in marked_processes(self.layout.root) if pid_alive(p)]
