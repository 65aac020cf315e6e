#!/usr/bin/env python3
"""The scale table of README ("How a node's cost grows with the run"): open
file descriptors, resident memory, time to start and steps per second of a
`slowmo-testnet local` run of N nodes on this machine, with the default
join and peer timeouts and transport.

    python3 tools/scale/measure.py [--bin target/release] [--nodes 16 32 64 96]
        [--steps 200] [--out scale-runs]

While the run goes on, every half second the script reads each `slowmo
node` process's /proc/PID/fd and VmRSS and keeps the largest of each. The
time to start is, over the nodes, the latest moment training began
(the harness's end time of a node minus its training wall time): every
process started, met the others and agreed on the first view. Steps per
second is the median over the nodes. Linux only.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def node_processes():
    """(pid, argv) of every running `slowmo node` process."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and argv[0].endswith(b"slowmo") and argv[1] == b"node":
            found.append((entry, argv))
    return found


def node_pids():
    return [pid for pid, _ in node_processes()]


def sample(pid):
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
        return fds, rss * 1024
    except (OSError, StopIteration):
        return None


def measure(opts, nodes):
    out = os.path.join(opts.out, f"nodes-{nodes}")
    cmd = [
        os.path.join(opts.bin, "slowmo-testnet"), "local", "--nodes", str(nodes),
        "--steps", str(opts.steps), "--eval-every", "0", "--quiet", "--no-report",
        "--slowmo-bin", os.path.join(opts.bin, "slowmo"), "--out", out, "--force",
    ]
    started = time.time()
    # The harness's output goes to a file: a pipe read only at the end
    # would fill and stop it.
    log_path = os.path.join(opts.out, f"nodes-{nodes}.log")
    os.makedirs(opts.out, exist_ok=True)
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    most_fds, most_rss = 0, 0
    while proc.poll() is None:
        for pid in node_pids():
            s = sample(pid)
            if s:
                most_fds, most_rss = max(most_fds, s[0]), max(most_rss, s[1])
        time.sleep(0.5)
    log.close()
    with open(log_path, errors="replace") as f:
        text = f.read()
    row = {"nodes": nodes, "ok": proc.returncode == 0, "fds": most_fds,
           "rss_mb": most_rss / 1e6, "seconds": time.time() - started}
    try:
        with open(os.path.join(out, "fates.json")) as f:
            fates = {x["node"]: x for x in json.load(f)}
        rates, begins = [], []
        for name, fate in fates.items():
            path = os.path.join(out, name, "summary.json")
            if not os.path.exists(path):
                continue
            with open(path) as f:
                s = json.load(f)
            rates.append(s["steps_per_second"])
            begins.append(fate["ended_at_s"] - s["wall_seconds"])
        row["finished"] = sum(1 for x in fates.values() if x.get("completed"))
        row["steps_per_s"] = statistics.median(rates) if rates else None
        row["start_s"] = max(begins) if begins else None
    except OSError as e:
        row["error"] = str(e)
    if not row["ok"]:
        row["tail"] = text.strip().splitlines()[-3:]
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", default="target/release")
    p.add_argument("--nodes", type=int, nargs="+", default=[16, 32, 64, 96])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--out", default="scale-runs")
    opts = p.parse_args()
    rows = []
    for n in opts.nodes:
        row = measure(opts, n)
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    print("| nodes | finished | fds per node (max) | RSS per node (max) | time to start | steps/s (median) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        start = f"{r['start_s']:.1f} s" if r.get("start_s") is not None else "-"
        rate = f"{r['steps_per_s']:.1f}" if r.get("steps_per_s") is not None else "-"
        print(f"| {r['nodes']} | {r.get('finished', 0)} of {r['nodes']} | {r['fds']} "
              f"| {r['rss_mb']:.0f} MB | {start} | {rate} |")


if __name__ == "__main__":
    main()
