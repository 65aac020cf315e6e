#!/usr/bin/env python3
"""Compares two folders of parameters saved by `replay.py --save`: the max
relative difference max|a - b| / max|b| after every outer step. Two replays
of the same dump that differ only in rounding (for example `--threads 1`
against `--threads 2`) show how far rounding alone moves a run.

    python tools/reference/compare.py A B
"""

import os
import re
import sys

import torch


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    a_dir, b_dir = sys.argv[1:]
    steps = sorted(
        int(m.group(1)) for f in os.listdir(a_dir) if (m := re.fullmatch(r"step-(\d+)\.pt", f))
    )
    if not steps:
        print(f"{a_dir}: no step-N.pt files", file=sys.stderr)
        return 2
    missing = [s for s in steps if not os.path.exists(os.path.join(b_dir, f"step-{s}.pt"))]
    if missing:
        print(f"{b_dir}: no step-N.pt for steps {missing} that {a_dir} has", file=sys.stderr)
        return 2
    print(f"{'step':>6} {'max rel':>10}")
    for step in steps:
        a = torch.load(os.path.join(a_dir, f"step-{step}.pt"))
        b = torch.load(os.path.join(b_dir, f"step-{step}.pt"))
        print(f"{step:>6} {((a - b).abs().max() / b.abs().max()).item():>10.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
