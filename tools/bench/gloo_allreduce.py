#!/usr/bin/env python3
"""The baseline of `slowmo bench allreduce`: torch.distributed's gloo
all-reduce of the same buffer over the same number of processes on this
machine, timed the same way (one warm-up, then the median over repeats of
the slowest rank's time, each repeat after a barrier).

Not run by CI. Needs PyTorch (CPU is enough), from PyPI:

    python3 -m venv /tmp/gloo && /tmp/gloo/bin/pip install torch numpy
    /tmp/gloo/bin/python tools/bench/gloo_allreduce.py --nodes 4 --floats 10000000

Prints one line per size: floats, median seconds, min seconds.
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, nodes, sizes, repeats, port, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=nodes)
    out = {}
    for floats in sizes:
        buf = torch.arange(floats, dtype=torch.float32).remainder_(100).mul_(0.01)
        times = []
        for k in range(repeats + 1):
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(buf)
            buf.div_(nodes)
            if k > 0:
                times.append(time.perf_counter() - t)
        out[floats] = times
    queue.put((rank, out))
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--floats", default="10000000", help="comma-separated sizes")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--port", type=int, default=29517)
    a = ap.parse_args()
    sizes = [int(s) for s in a.floats.split(",")]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(r, a.nodes, sizes, a.repeats, a.port, queue))
        for r in range(a.nodes)
    ]
    for p in procs:
        p.start()
    per_rank = dict(queue.get() for _ in procs)
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"a gloo process ended with {p.exitcode}")
    print(f"gloo all-reduce over {a.nodes} processes, median of {a.repeats}")
    print(f"{'floats':>10} {'median s':>10} {'min s':>10}")
    for floats in sizes:
        slowest = [max(per_rank[r][floats][k] for r in per_rank) for k in range(a.repeats)]
        print(f"{floats:>10} {statistics.median(slowest):>10.4f} {min(slowest):>10.4f}")


if __name__ == "__main__":
    main()
