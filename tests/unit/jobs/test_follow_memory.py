"""``logs -f`` follows a log in bounded memory (issue 29: 1 GiB of new log held 3 GB).

A child ``python -m jobs logs -f`` follows a finished local run whose rank-0 log is 256 MiB:
8 MiB of ordinary lines (160,000 of them), then a sparse hole (one line of 248 MiB of NUL bytes,
no disk used), then a last line. It must print all of it, in order, to the end, and its peak
resident memory (the kernel's high-water mark of the child's own memory, VmHWM, read as it
exits: ``wait4``'s maxrss would count the pages of the pytest process it was forked from) must
stay under 100 MiB. A follower that held a whole line, or what it had not yet written out,
would need more than twice that (a right one peaks near 28 MiB); a GiB (what issue 29 saw)
proves no more and cost the unit suite 10 s more of CPU. A bound on memory is behaviour, not a
timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from jobs.records import RunRecord, TaskRecord, append_index, save_record

REPO = Path(__file__).resolve().parents[3]
SIZE = 256 << 20
LIMIT_KIB = 100 * 1024
# python -m jobs, saying its own peak resident memory on stderr as it exits.
MEASURED = """
import atexit, runpy, sys
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            sys.stderr.write("VmHWM " + line.split()[1] + "\\n")
atexit.register(peak)
sys.argv = ["jobs", *sys.argv[1:]]
runpy.run_module("jobs", run_name="__main__", alter_sys=True)
"""


def test_logs_follow_of_a_quarter_gib_of_log_stays_under_100_mib(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "big"
    (run_dir / "slurm").mkdir(parents=True)
    record = RunRecord(
        "big", "demo", str(run_dir), "local", job_id="local-1", submitted_at=1.0,
        tasks=[TaskRecord(0, str(run_dir))],
    )  # fmt: skip
    save_record(record)
    append_index(record)
    # Over (the supervisor is gone, its last word COMPLETED): the follower reads to the end.
    state = {"job_id": "local-1", "tasks": {"local-1": {"state": "COMPLETED", "exit_codes": [0]}}}
    (run_dir / "local_state.json").write_text(json.dumps(state))
    log = record.log_file("local-1", 0)
    lines = 0
    with log.open("wb") as f:
        block = b"".join(b"%08d step of a long training run, loss 0.123\n" % i for i in range(1000))
        while f.tell() < 8 << 20:
            f.write(block)
            lines += 1000
        f.truncate(SIZE)  # the hole: 248 MiB of NUL bytes, no newline
        f.seek(SIZE)
        f.write(b"the last line\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", MEASURED, "logs", "-f", "big"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    total = newlines = 0
    tail = b""
    for piece in iter(lambda: proc.stdout.read(1 << 20), b""):  # type: ignore[union-attr]
        total += len(piece)
        newlines += piece.count(b"\n")
        tail = (tail + piece)[-64:]
    err = proc.stderr.read().decode()
    assert proc.wait() == 0, err
    peak_kib = int(err.splitlines()[-1].removeprefix("VmHWM "))
    assert tail.endswith(b"the last line\n")
    assert total >= log.stat().st_size  # every byte came out (long lines in pieces: + "\n"s)
    assert newlines > lines
    assert peak_kib < LIMIT_KIB, f"peak RSS {peak_kib // 1024} MiB"
