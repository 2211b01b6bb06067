"""A stand-in ``ssh`` for unit tests: ``-G`` prints options, ``-O`` fails, anything else runs
its last word (the remote line) here with ``sh -c``, after logging its arguments."""

from __future__ import annotations

import os
from pathlib import Path

FAKE_SSH = r"""#!/bin/sh
# a stand-in for ssh: -G prints options; -O check fails; else the words after the host run here
case " $* " in *" -G "*)
  for a; do last=$a; done
  printf 'hostname %s\nport 22\nbatchmode no\ncontrolmaster false\n' "$last"
  printf 'connecttimeout none\ncontrolpersist no\n'; exit 0;; esac
case " $* " in *" -O "*) exit 255;; esac
printf '%s\n' "$*" >> "$FAKE_SSH_LOG"
if [ -n "$FAKE_SSH_FAIL" ]; then echo "$FAKE_SSH_FAIL" >&2; exit 255; fi
if [ -n "$FAKE_SSH_SLEEP" ]; then exec sleep "$FAKE_SSH_SLEEP"; fi
while [ $# -gt 0 ]; do
  case "$1" in -o|-F) shift 2;; --) shift;; -*) shift;; *) break;; esac
done
shift  # the host
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
