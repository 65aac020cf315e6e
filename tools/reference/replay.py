#!/usr/bin/env python3
"""Replays a `slowmo simulate --dump-reference DIR` run through fairscale's
SlowMoDistributedDataParallel on CPU (gloo, one process per worker) and
compares the parameters after every outer step with slowmo's.

    python tools/reference/replay.py DIR [--anchor slowmo|fairscale] ...

See tools/reference/README.md for the install steps and what each switch
reproduces. Exit status 0 when every outer step is within --tolerance
(max relative difference, max|a - b| / max|b| over all parameters), 1 when
one is not, 2 on bad input.
"""

import argparse
import gzip
import json
import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file


def cpu_only_patches():
    """fairscale calls torch.cuda.synchronize() after its collectives (a
    no-op for CPU tensors over gloo) and gives SGP's gossip edges a CUDA
    tensor to warm them up. On a machine without CUDA these become no-ops
    or CPU tensors; nothing of the arithmetic changes."""
    if not torch.cuda.is_available():
        torch.cuda.synchronize = lambda *a, **k: None
        torch.Tensor.cuda = lambda self, *a, **k: self
        torch.Tensor.pin_memory = lambda self, *a, **k: self

        class _Stream:
            def wait_stream(self, *a):
                pass

            def synchronize(self):
                pass

        torch.cuda.current_stream = lambda *a, **k: _Stream()
        torch.cuda.Stream = lambda *a, **k: _Stream()

        class _NoStream:
            def __init__(self, *a, **k):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *a):
                return False

        torch.cuda.stream = _NoStream


class Mlp(nn.Module):
    """slowmo's MLP: fc1..fcN, ReLU between, logits out (names as in the
    safetensors files slowmo writes)."""

    def __init__(self, widths):
        super().__init__()
        self.names = []
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            setattr(self, f"fc{i + 1}", nn.Linear(a, b))
            self.names.append(f"fc{i + 1}")

    def forward(self, x):
        for i, name in enumerate(self.names):
            x = getattr(self, name)(x)
            if i + 1 < len(self.names):
                x = F.relu(x)
        return x


def load_dump(folder):
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    problems = []
    if config["model"] != "mlp":
        problems.append(f"model {config['model']} (the harness replays the mlp only)")
    if config["schedule"] != "constant":
        problems.append(f"schedule {config['schedule']} (the harness replays constant only)")
    if config["optimizer"]["kind"] != "sgd":
        problems.append(f"optimizer {config['optimizer']['kind']} (the harness replays sgd only)")
    alg = config["algorithm"]
    if alg["base"] not in ("local-sgd", "ar-sgd", "sgp"):
        problems.append(f"base {alg['base']} (local-sgd, ar-sgd or sgp)")
    if alg["slowmo"]["nesterov"]:
        problems.append("a Nesterov outer step (fairscale has heavy-ball only)")
    if alg["slowmo"]["buffer_policy"] != "maintain":
        problems.append(f"buffer policy {alg['slowmo']['buffer_policy']} (fairscale maintains)")
    if alg["base"] == "sgp" and not str(config["graph"]).startswith("exponential"):
        problems.append(f"graph {config['graph']} (fairscale's default is the exponential graph)")
    for key in ("compress", "compress_average"):
        if config.get(key, "none") != "none":
            problems.append(f"{key} {config[key]} (fairscale sends f32)")
    if problems:
        raise SystemExit("cannot replay " + folder + ": " + "; ".join(problems))
    return config


def load_idx_test(images_path, labels_path, mean, std):
    """A test split in IDX files (gzip or not), standardised as slowmo does."""

    def read(path):
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            return f.read()

    raw_images, raw_labels = read(images_path), read(labels_path)
    n = int.from_bytes(raw_images[4:8], "big")
    pixels = torch.frombuffer(bytearray(raw_images[16:]), dtype=torch.uint8).reshape(n, -1)
    labels = torch.frombuffer(bytearray(raw_labels[8:]), dtype=torch.uint8).long()
    return (pixels.float() / 255.0 - mean) / std, labels


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flat(state, names):
    return torch.cat([state[n].reshape(-1).double() for n in names])


def worker(rank, world, folder, opts, port, out_path):
    cpu_only_patches()
    torch.set_num_threads(opts.threads)
    from fairscale.experimental.nn.data_parallel import SlowMoBaseAlgorithm, SlowMoDistributedDataParallel

    config = load_dump(folder)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    alg, opt_cfg = config["algorithm"], config["optimizer"]
    tau = alg["slowmo"]["tau"]
    data = load_file(os.path.join(folder, "data.safetensors"))
    index, images, labels = data["index"], data["images"], data["labels"]
    batches = data["batches"][rank]
    init = load_file(os.path.join(folder, "init.safetensors"))

    widths = [images.shape[1]] + list(config["hidden"]) + [int(labels.max()) + 1]
    widths[-1] = init[f"fc{len(widths) - 1}.weight"].shape[0]
    module = Mlp(widths)
    module.load_state_dict(init)
    names = list(init.keys())
    names = [n for n, _ in module.named_parameters()]

    base = alg["base"]
    ar_sgd = base == "ar-sgd"
    nprocs = world if ar_sgd else opts.nprocs_per_node
    if nprocs > 1 and rank == 0:
        print(f"nprocs_per_node {nprocs}: fairscale all-reduces gradients within a node every step", flush=True)
    kwargs = dict(
        nprocs_per_node=nprocs,
        slowmo_base_algorithm=SlowMoBaseAlgorithm.SGP if base == "sgp" else SlowMoBaseAlgorithm.LOCALSGD,
        slowmo_momentum=alg["slowmo"]["beta"],
        slowmo_lr=alg["slowmo"]["alpha"],
        slowmo_frequency=tau,
        localsgd_frequency=opts.localsgd_frequency or tau,
        slowmo_memory_efficient=opts.memory_efficient,
    )
    model = SlowMoDistributedDataParallel(module, **kwargs)
    optimizer = torch.optim.SGD(
        module.parameters(),
        lr=config["lr"],
        momentum=opt_cfg["momentum"],
        nesterov=opt_cfg["nesterov"],
        weight_decay=opt_cfg["weight_decay"],
    )
    if opts.anchor == "slowmo":
        # slowmo's order: the anchor x_{0,0} captured before the first step.
        model._init_global_momentum_buffers(optimizer)

    rows = torch.searchsorted(index, batches.reshape(-1)).reshape(batches.shape)
    results = []
    for step in range(config["steps"]):
        x, y = images[rows[step]], labels[rows[step]]
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        slow_step = model._should_perform_slowmo() and model.slowmo_memory_efficient
        model.perform_slowmo(optimizer)
        if base == "sgp" and slow_step and opts.sgp_rounds == "slowmo":
            # slowmo gossips at every step (the exact average after it makes
            # that round's mixing moot), so its graph moves on one hop at a
            # slow step too; fairscale skips the round and stays on the hop.
            for gossiper in model.dist_config["gossipers"].values():
                gossiper.refresh_peers_()
        if (step + 1) % tau == 0 and rank == 0:
            path = os.path.join(folder, "outer", f"step-{step + 1}.safetensors")
            if not os.path.exists(path):
                continue
            ours = flat(load_file(path), names)
            theirs = flat({n: p.detach() for n, p in module.named_parameters()}, names)
            if opts.save:
                os.makedirs(opts.save, exist_ok=True)
                torch.save(theirs, os.path.join(opts.save, f"step-{step + 1}.pt"))
            diff = (ours - theirs).abs()
            results.append(
                dict(
                    step=step + 1,
                    outer=(step + 1) // tau,
                    max_abs=diff.max().item(),
                    max_rel=(diff.max() / theirs.abs().max()).item(),
                    worst_elementwise=(diff / theirs.abs().clamp_min(1e-3)).max().item(),
                )
            )
    if rank == 0:
        accuracy = None
        if opts.evaluate:
            images_t, labels_t = load_idx_test(opts.test_images, opts.test_labels, opts.mean, opts.std)
            with torch.no_grad():
                accuracy = (module(images_t).argmax(1) == labels_t).float().mean().item()
        with open(out_path, "w") as f:
            json.dump(dict(outer_steps=results, test_accuracy=accuracy), f)
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dump", help="the folder `slowmo simulate --dump-reference` wrote")
    p.add_argument(
        "--anchor",
        choices=["slowmo", "fairscale"],
        default="slowmo",
        help="slowmo: capture the anchor before the first base step, as slowmo does (the harness "
        "initialises fairscale's buffers first); fairscale: leave fairscale's own order (after the "
        "first base step), a known deliberate difference",
    )
    p.add_argument(
        "--localsgd-frequency",
        type=int,
        default=0,
        help="fairscale's localsgd_frequency (default: tau, as slowmo averages; fairscale's own default is 3)",
    )
    p.add_argument(
        "--nprocs-per-node",
        type=int,
        default=1,
        help="fairscale's nprocs_per_node (1: every process is a node; the world size turns the base "
        "into all-reduce SGD within one node)",
    )
    p.add_argument(
        "--memory-efficient",
        type=lambda s: s.lower() in ("1", "true", "yes"),
        default=True,
        help="fairscale's slowmo_memory_efficient (default true, fairscale's default: an exact average at "
        "every slow step; false: each worker steps its own parameters)",
    )
    p.add_argument(
        "--sgp-rounds",
        choices=["slowmo", "fairscale"],
        default="slowmo",
        help="SGP with a slow step: slowmo (the graph's hop advances at every base step, as in slowmo) or "
        "fairscale (the slow-step iteration skips its gossip round and the hop with it), a known "
        "deliberate difference",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per worker process (another count changes matmul rounding: a way to measure "
        "how far rounding alone moves this run)",
    )
    p.add_argument(
        "--evaluate",
        action="store_true",
        help="measure rank 0's final parameters on the test split (--test-images, --test-labels)",
    )
    p.add_argument("--test-images", default="/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")
    p.add_argument("--test-labels", default="/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz")
    p.add_argument("--mean", type=float, default=0.2860, help="standardisation (slowmo's Fashion-MNIST constants)")
    p.add_argument("--std", type=float, default=0.3530)
    p.add_argument("--tolerance", type=float, default=1e-5)
    p.add_argument(
        "--save",
        help="also write rank 0's parameters after every outer step (step-N.pt, float64) into this "
        "folder, to compare two replays with each other (compare.py)",
    )
    p.add_argument("--json", help="also write the per-outer-step figures to this file")
    opts = p.parse_args()
    if not os.path.isdir(opts.dump):
        print(f"{opts.dump}: not a folder (write one with `slowmo simulate --dump-reference DIR`)", file=sys.stderr)
        return 2
    config = load_dump(opts.dump)
    world = config["workers"]
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "results.json")
        mp.spawn(worker, args=(world, opts.dump, opts, free_port(), out_path), nprocs=world, join=True)
        with open(out_path) as f:
            outcome = json.load(f)
    results = outcome["outer_steps"]
    alg = config["algorithm"]
    print(
        f"{config['preset']} over {alg['base']}, beta {alg['slowmo']['beta']}, tau {alg['slowmo']['tau']}, "
        f"{world} workers, anchor {opts.anchor}"
    )
    print(f"{'outer':>5} {'step':>6} {'max abs':>10} {'max rel':>10} {'elementwise':>11}")
    for r in results:
        print(f"{r['outer']:>5} {r['step']:>6} {r['max_abs']:>10.3e} {r['max_rel']:>10.3e} {r['worst_elementwise']:>11.3e}")
    if outcome["test_accuracy"] is not None:
        print(f"test accuracy (rank 0, fairscale) {outcome['test_accuracy']:.4f}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(
                dict(config=config, options=vars(opts), outer_steps=results, test_accuracy=outcome["test_accuracy"]),
                f,
                indent=1,
            )
    worst = max((r["max_rel"] for r in results), default=float("nan"))
    if not results or not worst <= opts.tolerance:
        first = next((r for r in results if not r["max_rel"] <= opts.tolerance), None)
        where = f"first at outer step {first['outer']} (base step {first['step']})" if first else "no outer step compared"
        print(f"PARTED: max relative difference {worst:.3e} > {opts.tolerance:g}, {where}")
        return 1
    print(f"MATCH: max relative difference {worst:.3e} <= {opts.tolerance:g} over {len(results)} outer steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
