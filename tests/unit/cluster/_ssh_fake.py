"""A stand-in ``ssh`` for unit tests: ``-G`` prints options, ``-O`` fails, anything else runs
its last word (the remote line) here with ``sh -c``, after logging its arguments (unless
``$FAKE_SSH_PLAN`` drops the connection or loses the reply)."""

from __future__ import annotations

import os
from pathlib import Path

FAKE_SSH = r"""#!/bin/sh
# a stand-in for ssh: -G prints options; -O check fails; else the words after the host run here
case " $* " in *" -G "*)
  for a; do last=$a; done
  printf 'hostname %s\nport 22\nbatchmode no\ncontrolmaster false\n' "$last"
  printf 'connecttimeout none\ncontrolpersist no\n'; exit 0;; esac
case " $* " in *" -O "*" -- "*) exit 255;; esac  # ssh's -O (not a remote squeue -O)
printf '%s\n' "$*" >> "$FAKE_SSH_LOG"
if [ -n "$FAKE_SSH_FAIL" ]; then echo "$FAKE_SSH_FAIL" >&2; exit 255; fi
# FAKE_SSH_PLAN: a file whose first line decides this command: "drop" (not run: the connection
# is gone), "lose WORD" (a command with WORD in it runs, its reply is lost); the line is used up
lose=
if [ -n "$FAKE_SSH_PLAN" ] && [ -s "$FAKE_SSH_PLAN" ]; then
  step=$(head -n 1 "$FAKE_SSH_PLAN")
  case "$step" in
    drop) sed -i 1d "$FAKE_SSH_PLAN"; echo "Connection closed by 127.0.0.1 port 22" >&2; exit 255;;
    "lose "*) case "$*" in *"${step#lose }"*) sed -i 1d "$FAKE_SSH_PLAN"; lose=1;; esac;;
  esac
fi
if [ -n "$FAKE_SSH_SLEEP" ]; then exec sleep "$FAKE_SSH_SLEEP"; fi
while [ $# -gt 0 ]; do
  case "$1" in -o|-F) shift 2;; --) shift;; -*) shift;; *) break;; esac
done
shift  # the host
if [ -n "$lose" ]; then
  sh -c "$*" >/dev/null 2>&1; echo "Connection reset by 127.0.0.1 port 22" >&2; exit 255
fi
exec sh -c "$*"
"""


def fake_ssh(tmp_path: Path, **env: str) -> dict[str, str]:
    """An environment whose ``ssh`` is :data:`FAKE_SSH`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "ssh"
    script.write_text(FAKE_SSH)
    script.chmod(0o755)
    out = dict(os.environ)
    out["PATH"] = f"{bin_dir}:{out.get('PATH', '')}"
    out["FAKE_SSH_LOG"] = str(tmp_path / "ssh.log")
    out.pop("SLURM_TRAIN_SSH_CONFIG", None)
    out.update(env)
    return out
