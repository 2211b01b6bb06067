"""The local cluster's login node for ``--remote``: an OpenSSH server on loopback, or on the
login host's address where the nodes are hosts of their own (``--hosts net``: it runs in the
login host's namespaces, :mod:`cluster.local.hosts`).

``python -m cluster up`` starts it (Debian's openssh-server; skipped with a note where it is not
installed) on a port of the cluster's own (:data:`SSHD_PORT` + the port offset), with a host
key and a client key made here, and writes an OpenSSH client configuration,
``STATE_DIR/ssh/config``, with two aliases:

    slurm-train-login   ADDRESS:PORT (127.0.0.1, or the login host's) as the unprivileged
                        user (``trainee``), the set-up's key
    slurm-train-jump    the same server, reached through ``ProxyJump slurm-train-login``

``up`` prints ``export SLURM_TRAIN_SSH_CONFIG=STATE_DIR/ssh/config`` (cluster.ssh reads it
instead of ``~/.ssh/config``). Password and keyboard-interactive logins are off: the key is
the only way in.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from cluster.errors import LocalClusterError

SSHD = "/usr/sbin/sshd"
SSHD_PORT = 12222
USER_ENV = "SLURM_TRAIN_LOGIN_USER"
DEFAULT_USER = "trainee"
LOGIN_ALIAS = "slurm-train-login"
JUMP_ALIAS = "slurm-train-jump"


def installed() -> bool:
    return Path(SSHD).is_file()


def login_user() -> str | None:
    """The user the aliases log in as (``$SLURM_TRAIN_LOGIN_USER``, else trainee), None where
    that user does not exist here (scripts/setup.sh makes it)."""
    name = os.environ.get(USER_ENV) or DEFAULT_USER
    try:
        pwd.getpwnam(name)
    except KeyError:
        return None
    return name


class LoginServer:
    """One sshd for one local cluster (its folder ``ssh/`` under the cluster's state dir)."""

    def __init__(
        self,
        root: Path,
        port: int,
        run: Path,
        log: Path,
        address: str = "127.0.0.1",
        on_host: Callable[[list[str]], list[str]] | None = None,
    ) -> None:
        self.dir = root / "ssh"
        self.port = port
        #: Where it listens and the aliases connect (the login host's address with net hosts).
        self.address = address
        #: Turns sshd's argument list into one that runs it on the login host (None: here).
        self.on_host = on_host
        self.pid_file = run / "sshd.pid"
        self.log = log / "sshd.log"

    @property
    def client_config(self) -> Path:
        return self.dir / "config"

    @property
    def key(self) -> Path:
        return self.dir / "id_ed25519"

    def write(self, user: str) -> None:
        """Keys (once), sshd's configuration and the client's (every ``up``)."""
        self.dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        for key in (self.dir / "host_ed25519", self.key):
            if not key.exists():
                subprocess.run(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", key.name, "-f", str(key)],
                    check=True, capture_output=True, timeout=60,
                )  # fmt: skip
        authorized = self.dir / "authorized_keys"
        authorized.write_text(self.key.with_suffix(".pub").read_text())
        authorized.chmod(0o644)
        host_pub = (self.dir / "host_ed25519.pub").read_text().split()
        (self.dir / "known_hosts").write_text(
            f"[{self.address}]:{self.port} {host_pub[0]} {host_pub[1]}\n"
        )
        (self.dir / "sshd_config").write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    f"ListenAddress {self.address}",
                    f"HostKey {self.dir / 'host_ed25519'}",
                    f"PidFile {self.pid_file}",
                    f"AuthorizedKeysFile {authorized}",
                    f"AllowUsers {user}",
                    "PubkeyAuthentication yes",
                    "StrictModes no",  # the keys live under /var/tmp (sticky, world-writable)
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM yes",  # a user without a password (locked) may still use a key
                    "PermitRootLogin no",
                    "AllowTcpForwarding yes",  # ProxyJump goes through it
                    "X11Forwarding no",
                    "PrintMotd no",
                    "MaxStartups 100:30:200",
                    "MaxSessions 100",
                    "Subsystem sftp internal-sftp",
                    "",
                ]
            )
        )
        common = [
            f"  HostName {self.address}",
            f"  Port {self.port}",
            f"  User {user}",
            f"  IdentityFile {self.key}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {self.dir / 'known_hosts'}",
            "  StrictHostKeyChecking yes",
        ]
        self.client_config.write_text(
            "\n".join(
                [
                    "# written by python -m cluster up (cluster/local/sshd.py)",
                    f"Host {LOGIN_ALIAS}",
                    *common,
                    f"Host {JUMP_ALIAS}",
                    *common,
                    f"  ProxyJump {LOGIN_ALIAS}",
                    "",
                ]
            )
        )

    def start(self) -> None:
        """Start sshd (it detaches), on the login host where there is one."""
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation
        self.pid_file.unlink(missing_ok=True)
        argv = [SSHD, "-f", str(self.dir / "sshd_config"), "-E", str(self.log)]
        done = subprocess.run(
            argv if self.on_host is None else self.on_host(argv),
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if done.returncode != 0:
            raise LocalClusterError(
                f"sshd did not start (exit {done.returncode}): {done.stderr.strip()[-300:]}"
            )


def tools_missing() -> list[str]:
    return [t for t in ("ssh", "ssh-keygen", "rsync") if shutil.which(t) is None]
