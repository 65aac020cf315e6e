#!/usr/bin/env python3
"""The crash table of README ("What a crash costs the survivors"): how long
the survivors of a `slowmo-testnet local` run stop when nodes are killed
with SIGKILL mid-run, by transport and by who is killed.

    python3 tools/scale/crash_stall.py [--bin target/release] [--nodes 8]
        [--steps 1500] [--at 500] [--transports quic tcp] [--out crash-runs]

Each case is one run of N nodes with the defaults (SlowMo over Local SGD,
the MLP, `--peer-timeout 60`). The script kills the node(s) itself, with
SIGKILL, once the first node's metrics pass step `--at`: a member that is
not the coordinator (rank 3), the coordinator of the view change (rank 0,
the lowest rank; the next one coordinates), or two members at once (ranks
2 and 5). Ranks are read from each node's log line "run started rank=R",
which is why the harness's own fault script is not used (it names nodes,
and a node's rank follows its peer id). For every survivor the script reads
the largest time between two consecutive step records of its metrics and
reports the largest over the survivors, and whether all of them finished.
Linux only.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

from measure import node_processes

CASES = {
    "one member": [3],
    "the coordinator": [0],
    "two members at once": [2, 5],
}


def node_pid(out, name):
    """The pid of the `slowmo node` process whose folder is out/name."""
    folder = os.path.abspath(os.path.join(out, name)).encode() + b"/"
    for pid, argv in node_processes():
        if any(a.startswith(folder) for a in argv):
            return int(pid)
    return None


def ranks(out, nodes):
    """node name -> rank, from the logs (None while not all started)."""
    found = {}
    for i in range(nodes):
        name = f"node-{i}"
        try:
            with open(os.path.join(out, name, "node.log"), errors="replace") as f:
                m = re.search(r"run started rank=(\d+)", f.read())
        except OSError:
            return None
        if not m:
            return None
        found[name] = int(m.group(1))
    return found


def last_step(path):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4096))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return -1
    for line in reversed(lines):
        try:
            return json.loads(line)["step"]
        except (ValueError, KeyError):
            continue
    return -1


def largest_pause(path):
    times = []
    with open(path, errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if "step" in rec and "time" in rec:
                times.append(rec["time"])
    return max((b - a for a, b in zip(times, times[1:])), default=None)


def run_case(opts, transport, case, victims_ranks):
    out = os.path.join(opts.out, f"{transport}-{case.replace(' ', '-')}")
    cmd = [
        os.path.join(opts.bin, "slowmo-testnet"), "local", "--nodes", str(opts.nodes),
        "--steps", str(opts.steps), "--eval-every", "0", "--quiet", "--no-report",
        "--transport", transport, "--slowmo-bin", os.path.join(opts.bin, "slowmo"),
        "--out", out, "--force",
    ]
    os.makedirs(opts.out, exist_ok=True)
    log = open(out + ".log", "w")
    started = time.time()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    victims = None
    while proc.poll() is None:
        if victims is None:
            r = ranks(out, opts.nodes)
            if r is not None:
                steps = [last_step(os.path.join(out, n, "metrics.jsonl")) for n in r]
                if max(steps) >= opts.at:
                    victims = [n for n, k in r.items() if k in victims_ranks]
                    for n in victims:
                        pid = node_pid(out, n)
                        if pid:
                            os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    log.close()
    row = {"transport": transport, "case": case, "seconds": time.time() - started,
           "killed": victims or []}
    survivors = [f"node-{i}" for i in range(opts.nodes) if f"node-{i}" not in (victims or [])]
    pauses, finished = [], 0
    for n in survivors:
        p = largest_pause(os.path.join(out, n, "metrics.jsonl"))
        if p is not None:
            pauses.append(p)
        try:
            with open(os.path.join(out, n, "summary.json")) as f:
                finished += 1 if json.load(f).get("completed") else 0
        except (OSError, ValueError):
            pass
    row["largest_pause_s"] = max(pauses) if pauses else None
    row["finished"] = f"{finished} of {len(survivors)}"
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default="target/release")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--at", type=int, default=500)
    p.add_argument("--transports", nargs="+", default=["quic", "tcp"])
    p.add_argument("--out", default="crash-runs")
    opts = p.parse_args()
    rows = []
    for transport in opts.transports:
        for case, victims in CASES.items():
            row = run_case(opts, transport, case, victims)
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    print("| transport | killed | survivors finished | largest pause of a survivor | run took |")
    print("|---|---|---|---|---|")
    for r in rows:
        pause = "-" if r["largest_pause_s"] is None else f"{r['largest_pause_s']:.2f} s"
        print(f"| {r['transport']} | {r['case']} | {r['finished']} | {pause} | {r['seconds']:.1f} s |")


if __name__ == "__main__":
    main()
