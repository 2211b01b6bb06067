"""Slurm over SSH: the transport :func:`cluster.slurm.slurm_client` builds for ``remote=HOST``.

Every command goes through the system's ``ssh`` (the user's OpenSSH configuration, agents,
ProxyJump, 2FA and all): ``HOST`` is an alias of that configuration (``-F FILE`` where
``SLURM_TRAIN_SSH_CONFIG`` names one, else ``~/.ssh/config``), read once with ``ssh -G HOST``.

- Connections are shared: ``ControlMaster=auto``, a short ``ControlPath`` and ``ControlPersist``
  are added where the user's configuration sets no ``ControlPath`` of its own; never under
  ``ProxyJump`` (nested masters are flaky: each command connects through the jump afresh).
- Every command runs with ``BatchMode=yes`` and no stdin: a connection that would need a
  password, a passphrase, a 2FA code or a new host key fails at once
  (:class:`SshLoginRequiredError`: run ``python -m jobs login HOST``, the one interactive
  connection, :func:`login`, which starts the shared master) instead of waiting on a prompt.
- The remote command is an argument list, each word ``shlex.quote``d for the remote shell;
  every command has a timeout (the client's, as for local commands).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cluster.client import DEFAULT_TIMEOUT_S, SlurmClient, Started
from cluster.errors import BadInputError, ClusterError, SlurmCommandError, SlurmTimeoutError

#: an OpenSSH configuration file to read instead of ``~/.ssh/config``
CONFIG_ENV = "SLURM_TRAIN_SSH_CONFIG"
#: what is added where the user set no ControlPath: ``~/.ssh/st-%C`` (``%C``: a hash of the
#: host, port and user; short: a socket's path has room for ~100 bytes)
CONTROL_NAME = "st-%C"
CONTROL_PERSIST = "4h"
CONNECT_TIMEOUT_S = 15
#: ssh's own failures exit 255 (a remote command's status is passed through otherwise)
SSH_FAILED = 255
_LOGIN_NEEDED = (
    "permission denied",
    "host key verification failed",
    "no more authentication methods",
    "too many authentication failures",
)


class SshError(ClusterError):
    """ssh could not run the command on the remote host (not the command's own failure)."""


class SshLoginRequiredError(SshError):
    """The connection needs a prompt (password, passphrase, 2FA, host key): ``jobs login``."""

    def __init__(self, host: str, detail: str) -> None:
        super().__init__(
            f"ssh {host}: the connection needs a password, a code or a host key check "
            f"({detail}): run `python -m jobs login {host}` once, then try again"
        )
        self.host = host


class SshConnectionError(SshError):
    """The host could not be reached (down, network, a master that went away): retryable."""

    def __init__(self, host: str, detail: str) -> None:
        super().__init__(f"ssh {host}: cannot connect ({detail})")
        self.host = host


def check_host(host: str) -> str:
    """An ssh alias as the user wrote it; refuses what ssh would read as an option."""
    if not host or host.startswith("-") or any(c.isspace() or ord(c) < 32 for c in host):
        raise BadInputError(
            f"--remote {host!r}: not a host name (give an alias of your OpenSSH configuration)"
        )
    return host


@dataclass(frozen=True)
class SshTarget:
    """A host of the user's OpenSSH configuration, as ``ssh -G`` resolved it."""

    host: str
    config: str | None  # the -F file, None: ssh's default (~/.ssh/config)
    options: Mapping[str, str]  # ssh -G's keys (lower case) and values

    @property
    def jumps(self) -> bool:
        return self.options.get("proxyjump", "none") not in ("none", "")

    @property
    def multiplexed(self) -> bool:
        """Whether commands share one connection (never through a ProxyJump of ours)."""
        if "controlpath" in self.options:
            return self.options.get("controlmaster", "false") not in ("false", "no")
        return not self.jumps

    def option_args(self, *, batch: bool = True) -> list[str]:
        """``ssh``'s arguments before the host: ``-F``, BatchMode, the added multiplexing."""
        args = ["-F", self.config] if self.config else []
        if batch:
            args += ["-o", "BatchMode=yes"]
        if self.options.get("connecttimeout", "none") == "none":
            args += ["-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}"]
        if "controlpath" not in self.options:  # the user's own multiplexing is left alone
            if self.jumps:
                args += ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
            else:
                args += ["-o", "ControlMaster=auto", "-o", f"ControlPath={control_path()}"]
                if self.options.get("controlpersist", "no") == "no":
                    args += ["-o", f"ControlPersist={CONTROL_PERSIST}"]
        return args

    def argv(
        self, remote: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] = {}
    ) -> list[str]:
        """The local ``ssh`` argument list that runs ``remote`` (an argument list) there."""
        return [
            "ssh",
            *self.option_args(),
            "--",
            self.host,
            remote_command(remote, cwd=cwd, env=env),
        ]


def control_path() -> str:
    """``HOME/.ssh/st-%C`` (the home of the user, as ssh finds it; the folder made 0700)."""
    import pwd

    folder = os.path.join(pwd.getpwuid(os.getuid()).pw_dir, ".ssh")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return os.path.join(folder, CONTROL_NAME)


def remote_command(
    argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] = {}
) -> str:
    """One line for the remote shell: every word quoted (``cd DIR &&`` and ``env K=V`` too)."""
    words = [shlex.quote(a) for a in argv]
    if env:
        words = ["env", *(shlex.quote(f"{k}={v}") for k, v in env.items()), *words]
    line = " ".join(words)
    return f"cd {shlex.quote(cwd)} && {line}" if cwd else line


def config_file(environ: Mapping[str, str] | None = None) -> str | None:
    """The OpenSSH configuration to read: ``$SLURM_TRAIN_SSH_CONFIG``, else ssh's default."""
    value = (os.environ if environ is None else environ).get(CONFIG_ENV, "")
    return value or None


def resolve(
    host: str, environ: Mapping[str, str] | None = None, *, timeout: float = 10.0
) -> SshTarget:
    """``ssh -G HOST``: the options ssh will use for it (nothing is connected)."""
    check_host(host)
    config = config_file(environ)
    if config is not None and not os.path.isfile(config):
        raise BadInputError(f"{CONFIG_ENV}={config}: no such file (an OpenSSH configuration)")
    cmd = ["ssh", *(["-F", config] if config else []), "-G", "--", host]
    try:
        done = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
    except FileNotFoundError:
        raise SshError("ssh: not found on PATH (install OpenSSH's client)") from None
    except subprocess.TimeoutExpired:
        raise SlurmTimeoutError(cmd, timeout) from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BadInputError(f"--remote {host}: ssh -G refused it: {last}")
    return SshTarget(host, config, parse_ssh_g(done.stdout))


def parse_ssh_g(text: str) -> dict[str, str]:
    """``ssh -G``'s lines (``key value``); a key given twice keeps its first value, as ssh."""
    options: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            options.setdefault(key.lower(), value.strip())
    return options


def classify(host: str, returncode: int, stderr: str) -> SshError | None:
    """ssh's own failure (exit 255: none of the commands we run exits so) as one of ours;
    None: the remote command ran and this is its own status."""
    if returncode != SSH_FAILED:
        return None
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else "no message"
    if any(m in stderr.lower() for m in _LOGIN_NEEDED):
        return SshLoginRequiredError(host, last)
    return SshConnectionError(host, last)


class SshSlurmClient(SlurmClient):
    """:class:`cluster.client.SlurmClient` whose commands run on ``target`` through ssh.

    ``conf``: the slurm.conf on the remote host (exported there as ``SLURM_CONF``), None: the
    remote host's own default. Paths (a script for :meth:`submit`, ``cwd``) are remote paths.
    """

    def __init__(
        self,
        target: SshTarget,
        conf: str | os.PathLike[str] | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        environ: Mapping[str, str] | None = None,
        setup: str = "",
    ) -> None:
        super().__init__(conf=None, timeout=timeout, environ=environ)
        self.target = target
        self.setup = setup  # shell text opening every command line there (already quoted)
        self.conf = str(conf) if conf is not None else ""
        self._env.pop("SLURM_CONF", None)
        self._cluster_name: str | None = None

    def remote_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {"SLURM_CONF": self.conf} if self.conf else {}
        return {**env, **(extra or {})}

    def start(
        self,
        cmd: Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | os.PathLike[str] | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> Started:
        argv = self.target.argv(
            cmd, cwd=None if cwd is None else str(cwd), env=self.remote_env(extra_env)
        )
        if self.setup:
            argv[-1] = self.setup + argv[-1]
        limit = self.timeout if timeout is None else timeout
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self._env,
        )
        return Started(tuple(cmd), proc, limit, time.monotonic() + limit)

    def finish(self, started: Started, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = super().finish(started, check=False)
        failed = classify(self.target.host, done.returncode, done.stderr)
        if failed is not None:
            raise failed
        if check and done.returncode != 0:
            raise SlurmCommandError(started.cmd, done.returncode, done.stderr or done.stdout)
        return done

    def prefetch_cluster_state(self) -> None:
        if self._prefetched is None:
            from cluster.client import _SINFO

            self._prefetched = self.start(_SINFO)

    def installed(self) -> bool:
        done = self.run(["sh", "-c", "command -v sbatch && command -v squeue"], check=False)
        return done.returncode == 0

    def conf_stamp(self) -> str:
        return f"ssh:{self.target.host}:{self.conf}"

    def cluster_name(self) -> str:
        """The remote ClusterName (one ``scontrol show config``, kept for this client)."""
        if self._cluster_name is None:
            out = self.run(["scontrol", "show", "config"], check=False).stdout
            names = [
                ln.split("=", 1)[1].strip()
                for ln in out.splitlines()
                if ln.startswith("ClusterName")
            ]
            self._cluster_name = names[0] if names else ""
        return self._cluster_name


def login(target: SshTarget, *, timeout: float = 600.0) -> int:
    """The one interactive connection: ssh may prompt on this terminal (password, 2FA, a host
    key); where commands are multiplexed, it leaves the shared master running
    (ControlPersist). Returns ssh's exit status."""
    argv = ["ssh", *target.option_args(batch=False), "--", target.host, "true"]
    try:
        return subprocess.run(argv, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return SSH_FAILED


def master_running(target: SshTarget, *, timeout: float = 10.0) -> bool:
    """Whether a shared connection to ``target`` is up (``ssh -O check``)."""
    if not target.multiplexed:
        return False
    argv = ["ssh", *target.option_args(), "-O", "check", "--", target.host]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0
