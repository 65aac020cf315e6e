#!/usr/bin/env python3
"""Hole-punch trials behind two NATs, on one machine (as root).

Builds the namespaces of tools/nat/netns.sh (a public relay, two private
segments each behind its own NAT router), then for each trial starts a fresh
relay and two fresh nodes (new identities), one behind each NAT, given the
relay's address over TCP or QUIC. A trial succeeds when both nodes log a
direct connection by hole punching; the time to it is counted from the
relayed connection (the punch itself) and from the nodes' start. Prints a
table per transport.

usage: sudo tools/nat/punch_trials.py [--trials 20] [--slowmo target/release/slowmo]
"""
import argparse
import datetime as dt
import os
import re
import statistics
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PREFIX = "spt"


def ns(name):
    return ["ip", "netns", "exec", f"{PREFIX}-{name}"]


def stamp(line):
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z", line)
    return dt.datetime.fromisoformat(m.group(1)) if m else None


def first(log, needle):
    for line in log.splitlines():
        if needle in line:
            return stamp(line)
    return None


def trial(slowmo, proto, work):
    key = os.path.join(work, "relay.key")
    if os.path.exists(key):
        os.remove(key)
    peer = subprocess.run([slowmo, "run", "peer-id", "--identity", key],
                          capture_output=True, text=True, check=True).stdout.split()[-1]
    env = dict(os.environ, RUST_LOG="info,libp2p=warn", RAYON_NUM_THREADS="1")
    relay = subprocess.Popen(ns("inet") + [slowmo, "relay", "--identity", key,
                             "--listen", "/ip4/10.200.0.1/udp/4001/quic-v1",
                             "--listen", "/ip4/10.200.0.1/tcp/4001", "--seconds", "60"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    addr = {"tcp": f"/ip4/10.200.0.1/tcp/4001/p2p/{peer}",
            "quic": f"/ip4/10.200.0.1/udp/4001/quic-v1/p2p/{peer}"}[proto]
    nodes, logs = [], []
    start = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    for k in (1, 2):
        log = os.path.join(work, f"n{k}.log")
        logs.append(log)
        ip = f"192.168.{k}.2"
        nodes.append(subprocess.Popen(
            ns(f"h{k}-1") + [slowmo, "node", "--nodes", "2", "--bootstrap", addr,
                             "--listen", f"/ip4/{ip}/udp/4001/quic-v1",
                             "--listen", f"/ip4/{ip}/tcp/4001", "--threads", "1",
                             "--steps", "12", "--hidden", "32", "--eval-every", "0",
                             "--join-timeout", "30", "--peer-timeout", "10"],
            env=env, stdout=subprocess.DEVNULL, stderr=open(log, "w")))
    for n in nodes:
        try:
            n.wait(timeout=60)
        except subprocess.TimeoutExpired:
            n.kill()
    relay.kill()
    relay.wait()
    texts = [open(l).read() for l in logs]
    punched = [first(t, "by hole punching") for t in texts]
    relayed = [first(t, "through a relay; trying a direct connection") for t in texts]
    if not all(punched):
        return None
    done = max(punched)
    return ((done - min(r for r in relayed if r)).total_seconds(),
            (done - start).total_seconds())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--slowmo", default="target/release/slowmo")
    a = ap.parse_args()
    slowmo = os.path.abspath(a.slowmo)
    script = os.path.join(HERE, "netns.sh")
    env = dict(os.environ, PREFIX=PREFIX, NAT_KIND="cone")
    subprocess.run(["bash", script, "down"], env=env, check=True)
    subprocess.run(["bash", script, "up", "2", "1"], env=env, check=True)
    try:
        with tempfile.TemporaryDirectory() as work:
            print("| transport | punched | time to direct from the relayed connection (s) | from start (s) |")
            print("|---|---|---|---|")
            for proto in ("tcp", "quic"):
                res = [trial(slowmo, proto, work) for _ in range(a.trials)]
                ok = [r for r in res if r]
                def fmt(xs):
                    if not xs:
                        return "-"
                    return (f"median {statistics.median(xs):.3f}, max {max(xs):.3f}")
                print(f"| {proto} | {len(ok)}/{a.trials} | {fmt([r[0] for r in ok])} | "
                      f"{fmt([r[1] for r in ok])} |", flush=True)
    finally:
        subprocess.run(["bash", script, "down"], env=env)


if __name__ == "__main__":
    main()
