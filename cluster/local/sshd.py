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

    slurm-train-login-2fa   ADDRESS:PORT+1 as the same user, no key: a password and, where
                            Debian's libpam-oath is installed, a one-time code (TOTP), asked
                            by PAM through keyboard-interactive (``jobs login`` answers them)

``up`` prints ``export SLURM_TRAIN_SSH_CONFIG=STATE_DIR/ssh/config`` (cluster.ssh reads it
instead of ``~/.ssh/config``). On PORT the key is the only way in; on PORT+1 (``Match
LocalPort``) only keyboard-interactive. Its PAM service is the server's own: sshd names it after
the program (``argv[0]``), so the server runs as ``ssh/slurm-train-sshd-PORT`` (a link to sshd)
and ``up`` writes ``/etc/pam.d/slurm-train-sshd-PORT``: ``pam_exec`` checks the password against
the SHA-256 in ``ssh/check-password``, ``pam_oath`` the code against ``ssh/users.oath``; the
rest (account, session) is Debian's ``sshd``. The secrets are ``ssh/login-2fa.password`` and
``ssh/login-2fa.oath-key`` (hex; root's only). Where ``up`` is not root or the state folder is
writable by others (a script there runs as root), the 2FA alias is left out.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import secrets
import shutil
import stat
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
TWO_FA_ALIAS = "slurm-train-login-2fa"
PASSWORD_FILE = "login-2fa.password"  # noqa: S105 (a file's name)
OATH_KEY_FILE = "login-2fa.oath-key"
PAM_DIR = Path("/etc/pam.d")


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


#: The PATH after a release's commands in a session of a cluster of another release (sshd's
#: own default for a user, which SetEnv replaces).
SESSION_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/games"


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
        bin_dir: Path | None = None,
        slurm_conf: Path | None = None,
    ) -> None:
        """``bin_dir``: the cluster's release's commands (a release other than the host's:
        :attr:`cluster.local.release.Root.bin_dir`), first on PATH in every session, as a
        login node of that release has them. ``slurm_conf``: the cluster's configuration,
        ``SLURM_CONF`` in every session (a real login node has its cluster's in /etc/slurm:
        plain ``sinfo`` after ``ssh slurm-train-login`` reaches this cluster)."""
        self.dir = root / "ssh"
        self.port = port
        #: Where it listens and the aliases connect (the login host's address with net hosts).
        self.address = address
        #: Turns sshd's argument list into one that runs it on the login host (None: here).
        self.on_host = on_host
        self.bin_dir = bin_dir
        self.slurm_conf = slurm_conf
        self.pid_file = run / "sshd.pid"
        self.log = log / "sshd.log"

    def _set_env(self) -> list[str]:
        """sshd's ``SetEnv`` line (one: sshd keeps the first of a repeated keyword)."""
        pairs = []
        if self.bin_dir is not None:
            pairs.append(f'"PATH={self.bin_dir}:{SESSION_PATH}"')
        if self.slurm_conf is not None:
            pairs.append(f'"SLURM_CONF={self.slurm_conf}"')
        return [f"SetEnv {' '.join(pairs)}"] if pairs else []

    @property
    def client_config(self) -> Path:
        return self.dir / "config"

    @property
    def key(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def two_fa_port(self) -> int:
        return self.port + 1

    @property
    def service(self) -> str:
        """The PAM service (sshd's program name): one per cluster (its port)."""
        return f"slurm-train-sshd-{self.port}"

    @property
    def program(self) -> Path:
        """``ssh/slurm-train-sshd-PORT``: a link to sshd (its name is the PAM service)."""
        return self.dir / self.service

    def two_fa_possible(self) -> bool:
        """Root (it writes /etc/pam.d), pam_exec there, and a state folder no one else may
        write (PAM runs its password check as root)."""
        if os.geteuid() != 0 or not pam_module("pam_exec.so"):
            return False
        for folder in (self.dir, self.dir.parent):
            st = folder.stat()
            if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return False
        return PAM_DIR.is_dir()

    def forget_pam(self) -> None:
        """``down``: the cluster's PAM service goes (``up`` writes it again)."""
        if os.geteuid() == 0:
            (PAM_DIR / self.service).unlink(missing_ok=True)

    def _write_two_fa(self, user: str) -> bool:
        """The 2FA alias's PAM service, password and code (every ``up``: fresh secrets)."""
        if not self.two_fa_possible():
            return False
        password = secrets.token_urlsafe(12)
        digest = hashlib.sha256(password.encode()).hexdigest()
        _private(self.dir / PASSWORD_FILE, password + "\n")
        check = self.dir / "check-password"
        _private(
            check,
            "#!/bin/sh\n# written by python -m cluster up (cluster/local/sshd.py): pam_exec gives "
            "the password on stdin (NUL-ended)\n"
            f'[ "$PAM_USER" = "{user}" ] || exit 1\n'
            "pw=$(tr -d '\\000')\n"
            f'[ "$(printf %s "$pw" | sha256sum | cut -d" " -f1)" = "{digest}" ]\n',
            mode=0o700,
        )
        lines = [
            "# written by python -m cluster up (cluster/local/sshd.py): the login of "
            f"{TWO_FA_ALIAS} (port {self.two_fa_port}); account and session are Debian's sshd",
            f"auth requisite pam_exec.so quiet expose_authtok {check}",
        ]
        (self.dir / OATH_KEY_FILE).unlink(missing_ok=True)
        if pam_module("pam_oath.so"):  # Debian's libpam-oath: a one-time code
            key = secrets.token_hex(20)
            _private(self.dir / OATH_KEY_FILE, key + "\n")
            _private(self.dir / "users.oath", f"HOTP/T30/6 {user} - {key}\n")
            oath = self.dir / "users.oath"
            lines.append(f"auth required pam_oath.so usersfile={oath} window=4 digits=6")
        lines += ["account include sshd", "session include sshd", "password include sshd", ""]
        (PAM_DIR / self.service).write_text("\n".join(lines))
        if not self.program.is_symlink():
            self.program.unlink(missing_ok=True)
            self.program.symlink_to(SSHD)
        return True

    def write(self, user: str) -> bool:
        """Keys (once), sshd's configuration and the client's (every ``up``); whether sshd's
        changed (a running server is then started again: ``files.config_files``)."""
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
        two_fa = self._write_two_fa(user)
        ports = [self.port, *([self.two_fa_port] if two_fa else [])]
        (self.dir / "known_hosts").write_text(
            "".join(f"[{self.address}]:{p} {host_pub[0]} {host_pub[1]}\n" for p in ports)
        )
        server = self.dir / "sshd_config"
        before = server.read_text() if server.exists() else None
        server.write_text(
            "\n".join(
                [
                    *(f"Port {p}" for p in ports),
                    f"ListenAddress {self.address}",
                    f"HostKey {self.dir / 'host_ed25519'}",
                    f"PidFile {self.pid_file}",
                    f"AuthorizedKeysFile {authorized}",
                    f"AllowUsers {user}",
                    "PubkeyAuthentication yes",
                    "StrictModes no",  # the keys live under /var/tmp (sticky, world-writable)
                    "PasswordAuthentication no",
                    f"KbdInteractiveAuthentication {'yes' if two_fa else 'no'}",
                    "AuthenticationMethods publickey",  # the 2FA port: its Match below
                    "UsePAM yes",  # a user without a password (locked) may still use a key
                    "PermitRootLogin no",
                    "AllowTcpForwarding yes",  # ProxyJump goes through it
                    "X11Forwarding no",
                    "PrintMotd no",
                    "MaxStartups 100:30:200",
                    "MaxSessions 100",
                    "Subsystem sftp internal-sftp",
                    *self._set_env(),
                    *(
                        [
                            f"Match LocalPort {self.two_fa_port}",
                            "    AuthenticationMethods keyboard-interactive",
                        ]
                        if two_fa
                        else []
                    ),
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
        two_fa_block = [
            f"Host {TWO_FA_ALIAS}",
            f"  HostName {self.address}",
            f"  Port {self.two_fa_port}",
            f"  User {user}",
            "  PubkeyAuthentication no",
            "  PreferredAuthentications keyboard-interactive",
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
                    *(two_fa_block if two_fa else []),
                    "",
                ]
            )
        )
        return server.read_text() != before

    def start(self) -> None:
        """Start sshd (it detaches), on the login host where there is one."""
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation
        self.pid_file.unlink(missing_ok=True)
        # argv[0] names the PAM service (the 2FA port's); the program stays sshd (its comm)
        named = self.program.is_symlink()
        argv0 = str(self.program) if named else SSHD
        args = ["-f", str(self.dir / "sshd_config"), "-E", str(self.log)]
        program: str | None = SSHD
        cmd = [argv0, *args]
        if self.on_host is not None:  # the same argv[0], in the login host's namespaces
            program = None
            cmd = self.on_host(["bash", "-c", 'exec -a "$0" "$@"', argv0, SSHD, *args])
        done = subprocess.run(
            cmd, executable=program, capture_output=True, text=True, timeout=30
        )  # fmt: skip
        if done.returncode != 0:
            raise LocalClusterError(
                f"sshd did not start (exit {done.returncode}): {done.stderr.strip()[-300:]}"
            )


def tools_missing() -> list[str]:
    return [t for t in ("ssh", "ssh-keygen", "rsync") if shutil.which(t) is None]


def _private(path: Path, text: str, mode: int = 0o600) -> None:
    """A secret of root's: written with ``mode`` from the start (no moment readable by all)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def pam_module(name: str) -> bool:
    """Whether PAM has the module ``name`` (Debian's multiarch folder, or the plain one)."""
    found = [*Path("/lib").glob(f"*/security/{name}"), *Path("/usr/lib").glob(f"*/security/{name}")]
    return bool(found) or Path("/lib/security", name).is_file()
