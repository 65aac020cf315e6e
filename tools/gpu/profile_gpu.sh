#!/usr/bin/env bash
# Where a CUDA step's time goes, run on the GPU machine from the repository
# root:
#
#   tools/gpu/profile_gpu.sh BIN_DIR OUT
#
# 1. `slowmo bench step --phases` on cuda:0: each phase of the forward and
#    backward pass (batch in, parameters in, forward, backward, gradient out)
#    for the built-in models, the default transformer at batch 16 and 64,
#    and a larger one (8 x 512, context 256);
# 2. Nsight Compute's duration of every kernel of one step of the larger
#    transformer, summed by kernel name (ncu reads one counter per kernel,
#    clocks left alone); NCU_KERNELS=0 skips it.
set -u
BIN=${1:?BIN_DIR}
OUT=${2:?OUT}
mkdir -p "$OUT"
. "$(dirname "$0")/cuda_libs.sh"
big=(--models transformer --layers 8 --heads 8 --width 512 --context 256)
export RAYON_NUM_THREADS=1
"$BIN/slowmo" bench step --device cuda:0 --phases --warmup 5 --steps 20 | tee "$OUT/phases.md"
"$BIN/slowmo" bench step --device cuda:0 --phases --warmup 3 --steps 10 --models transformer \
    --batch 64 | tee -a "$OUT/phases.md"
"$BIN/slowmo" bench step --device cuda:0 --phases --warmup 3 --steps 10 "${big[@]}" \
    | tee -a "$OUT/phases.md"

if [ "${NCU_KERNELS:-1}" = 0 ]; then
    exit 0
fi
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n1)
if [ -z "$NCU" ]; then
    echo "no ncu here"
    exit 0
fi
# one warm-up step and one timed step; the second step's kernels are read
timeout 200 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --page raw --print-units base \
    --launch-skip 1500 --launch-count 2500 \
    "$BIN/slowmo" bench step --device cuda:0 "${big[@]}" --warmup 1 --steps 2 \
    >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
echo "ncu exit $?"
python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
reader = csv.DictReader(rows)
total = collections.Counter(); count = collections.Counter()
for r in reader:
    try:
        t = float(r["gpu__time_duration.sum"].replace(",", ""))
    except (KeyError, ValueError):
        continue
    name = r.get("Kernel Name", "?").split("(")[0][:70]
    total[name] += t; count[name] += 1
unit = "ns"
all_t = sum(total.values())
print(f"{sum(count.values())} kernels, {all_t/1e6:.2f} ms of kernel time")
print("| kernel | launches | total ms | share |")
print("|---|---|---|---|")
for name, t in total.most_common(25):
    print(f"| {name} | {count[name]} | {t/1e6:.2f} | {100*t/all_t:.1f}% |")
PY
