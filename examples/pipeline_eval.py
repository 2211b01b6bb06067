"""The second stage of examples/pipeline.yaml: reads the first stage's final checkpoint (its
manifest: step and parameter digest, no torch needed) and writes RUN_DIR/eval.json.

    python examples/pipeline_eval.py --checkpoint RUN_DIR_OF_TRAIN/checkpoints/step-N
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--checkpoint", type=Path, required=True)
    args = p.parse_args()
    manifest_path = args.checkpoint / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        print(f"pipeline_eval: cannot read {manifest_path}: {exc}", file=sys.stderr)
        return 2
    out = {"checkpoint": str(args.checkpoint), "step": manifest.get("step"),
           "digest": manifest.get("digest")}  # fmt: skip
    if os.environ.get("RANK", "0") == "0":
        run_dir = Path(os.environ.get("RUN_DIR", "."))
        (run_dir / "eval.json").write_text(json.dumps(out) + "\n")
        print(f"evaluated the checkpoint of step {out['step']}: {out['digest']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
