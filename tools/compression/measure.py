#!/usr/bin/env python3
"""The compression tables of README ("Compressed gossip and averages,
measured"): test accuracy, bytes per step and time to a target accuracy for
each codec against none, in `slowmo simulate --network` over 20 Mbit/s,
50 ms links (thin-link.toml).

    python3 tools/compression/measure.py [--slowmo target/release/slowmo]
        [--model mlp|cnn] [--seeds 3] [--steps 1500] [--out compression-runs]

The push-sum bases (SGP, SlowMo over SGP) compress their gossip
(`--compress`), SlowMo over SGP also with its exact averages
(`--compress-average`); the Local SGD ones, whose only traffic is the exact
average, compress that. The target of a row is its uncompressed run's mean
final accuracy minus 0.5 point; the time to it is the first evaluation at or
above it (evaluations every 100 steps are the workers' mean accuracy, the
final one that of the exact average) times the run's mean virtual step time.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

# (key for --algorithms, name in the table, training flags, codec flags)
ALGORITHMS = [
    ("sgp", "SGP", ["--preset", "sgp"], ["--compress"]),
    ("slowmo-sgp", "SlowMo-SGP", ["--base", "sgp", "--beta", "0.5"], ["--compress"]),
    ("slowmo-sgp-avg", "SlowMo-SGP", ["--base", "sgp", "--beta", "0.5"], ["--compress", "--compress-average"]),
    ("local-sgd", "Local SGD", ["--preset", "local-sgd"], ["--compress-average"]),
    ("slowmo-local-sgd", "SlowMo-Local SGD", ["--base", "local-sgd", "--beta", "0.5"], ["--compress-average"]),
]
CODECS = ["none", "bf16", "int8", "topk:0.01"]


def run(opts, name, flags, codec_flags, codec, seed):
    tag = "".join(f.removeprefix("--compress") or "-gossip" for f in codec_flags)
    model = "" if opts.model == "mlp" else f"{opts.model}-"
    folder = os.path.join(opts.out, f"{model}{name.replace(' ', '_')}{tag}-{codec.replace(':', '')}-{seed}")
    summary = os.path.join(folder, "summary.json")
    if not os.path.exists(summary):
        os.makedirs(folder, exist_ok=True)
        cmd = [
            opts.slowmo, "simulate", "--quiet", "--dataset", "fashion-mnist", "--model", opts.model, "--workers", "8",
            "--tau", "12", "--steps", str(opts.steps), "--lr", "0.01", "--momentum", "0.9",
            "--batch-size", "32", "--eval-every", "100", "--seed", str(seed),
            "--network", opts.network, "--metrics-jsonl", os.path.join(folder, "metrics.jsonl"),
            "--summary-json", summary, *flags, *[a for f in codec_flags for a in (f, codec)],
        ]
        env = dict(os.environ, RAYON_NUM_THREADS="1")
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    with open(summary) as f:
        s = json.load(f)
    evals = {}
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("test_accuracy") is not None:
                evals[r["step"] + 1] = r["test_accuracy"]
    pace = statistics.mean(p["step_seconds"] for p in s["network"]["workers"])
    return dict(
        steps=s["steps"],
        accuracy=100 * s["test_accuracy"],
        bytes_per_step=s["bytes_sent_per_worker"] / opts.steps,
        pace=pace,
        evals=sorted(evals.items()),
    )


def fmt(values):
    return f"{statistics.mean(values):.2f} +- {statistics.stdev(values) if len(values) > 1 else 0:.2f}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--slowmo", default="target/release/slowmo")
    p.add_argument("--network", default=os.path.join(os.path.dirname(__file__), "thin-link.toml"))
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--codecs", default=",".join(CODECS))
    p.add_argument("--algorithms", default=",".join(a[0] for a in ALGORITHMS),
                   help="keys, comma separated: " + ", ".join(a[0] for a in ALGORITHMS))
    p.add_argument("--out", default="compression-runs")
    opts = p.parse_args()
    codecs = opts.codecs.split(",")
    if codecs[0] != "none":
        sys.exit("--codecs must start with none (the baseline of each row)")
    chosen = opts.algorithms.split(",")
    print(f"{opts.steps} steps, seeds 1-{opts.seeds}, 8 workers, Fashion-MNIST {opts.model.upper()}, {opts.network}")
    print()
    print("| algorithm | flag | codec | test accuracy (%) | bytes/step/worker | fewer bytes | time to target (s) | faster |")
    print("|---|---|---|---|---|---|---|---|")
    unknown = set(chosen) - {a[0] for a in ALGORITHMS}
    if unknown:
        sys.exit(f"--algorithms: unknown {', '.join(sorted(unknown))}")
    for key, name, flags, codec_flags in ALGORITHMS:
        if key not in chosen:
            continue
        flag = " ".join(codec_flags)
        results = {
            c: [run(opts, name, flags, codec_flags, c, s) for s in range(1, opts.seeds + 1)] for c in codecs
        }
        base = results["none"]
        target = statistics.mean(r["accuracy"] for r in base) - 0.5
        base_bytes = statistics.mean(r["bytes_per_step"] for r in base)

        def time_to_target(rs):
            times = []
            for r in rs:
                step = next((s for s, a in r["evals"] if 100 * a >= target), None)
                if step is None and r["accuracy"] >= target:
                    # Reached only by the final exact average.
                    step = r["steps"]
                if step is None:
                    return None
                times.append(step * r["pace"])
            return statistics.mean(times)

        base_time = time_to_target(base)
        for c in codecs:
            rs = results[c]
            b = statistics.mean(r["bytes_per_step"] for r in rs)
            t = time_to_target(rs)
            t_text = "not reached" if t is None else f"{t:.0f}"
            faster = "-" if t is None or base_time is None else f"{base_time / t:.1f}x"
            print(
                f"| {name} | `{flag}` | {c} | {fmt([r['accuracy'] for r in rs])} | {b:,.0f} | "
                f"{base_bytes / b:.1f}x | {t_text} | {faster} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
