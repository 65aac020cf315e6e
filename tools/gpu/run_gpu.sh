#!/usr/bin/env bash
# The GPU check, run on a machine with an NVIDIA GPU and CUDA 13 libraries
# but no Rust toolchain, from the repository root:
#
#   tools/gpu/run_gpu.sh BIN_DIR CORPUS OUT
#
# BIN_DIR holds `slowmo` built by tools/gpu/build_cuda.sh and
# `slowmo-testnet`; CORPUS is a text file or folder; OUT receives the logs.
# It prints:
#   1. the step time of each built-in model on cuda:0 and on one CPU core
#      (`slowmo bench step`), and of a larger transformer on cuda:0, then
#      the same in PyTorch (tools/bench/torch_step.py);
#   2. a 2-node testnet (real processes over QUIC) training the default
#      transformer on cuda:0, then the same on one CPU core per node:
#      tokens/s per node and held-out perplexity from each node's summary.
set -u
BIN=${1:?BIN_DIR}
CORPUS=${2:?CORPUS}
OUT=${3:?OUT}
STEPS_GPU=${STEPS_GPU:-300}
STEPS_CPU=${STEPS_CPU:-60}
RUNS=$(mktemp -d)
mkdir -p "$OUT"
chmod +x "$BIN"/* 2>/dev/null

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nproc; grep -m1 'model name' /proc/cpuinfo; ldd --version | head -n1

. "$(dirname "$0")/cuda_libs.sh"

echo "== 1. step times (bench step)"
RAYON_NUM_THREADS=1 "$BIN/slowmo" bench step --device cuda:0 --warmup 5 --steps 30 \
    | tee "$OUT/bench-cuda.md"
RAYON_NUM_THREADS=1 "$BIN/slowmo" bench step --device cuda:0 --models transformer \
    --layers 8 --heads 8 --width 512 --context 256 --warmup 3 --steps 20 \
    | tee -a "$OUT/bench-cuda.md"
RAYON_NUM_THREADS=1 "$BIN/slowmo" bench step --device cpu --warmup 3 --steps 15 \
    | tee "$OUT/bench-cpu.md"
echo "== 1b. the same models in PyTorch"
python3 tools/bench/torch_step.py --device cuda:0 --warmup 5 --steps 30 | tee "$OUT/torch.md"
python3 tools/bench/torch_step.py --device cuda:0 --models transformer \
    --layers 8 --heads 8 --width 512 --context 256 --warmup 3 --steps 20 | tee -a "$OUT/torch.md"
python3 tools/bench/torch_step.py --device cpu --threads 1 --warmup 3 --steps 15 | tee -a "$OUT/torch.md"

train=(--model transformer --dataset "text:$CORPUS" --optimizer adam --lr 0.001
    --batch-size 16 --eval-every 0)
summarise() {
    python3 - "$1" <<'PY'
import json, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/*/summary.json")):
    s = json.load(open(f))
    print(f"{f.split('/')[-2]}: steps {s.get('steps')} wall {s.get('wall_seconds', 0):.1f} s "
          f"tokens/s {s.get('tokens_per_second') or 0:.0f} test loss {s.get('test_loss')} "
          f"perplexity {s.get('test_perplexity')}")
PY
}
echo "== 2a. 2-node testnet, transformer, cuda:0, $STEPS_GPU steps"
"$BIN/slowmo-testnet" local --nodes 2 --slowmo-bin "$BIN/slowmo" --out "$RUNS/net-cuda" \
    --no-report --quiet --steps "$STEPS_GPU" "${train[@]}" \
    --node-arg=--device --node-arg=cuda:0 >"$OUT/net-cuda.log" 2>&1
echo "exit $?"; tail -n 8 "$OUT/net-cuda.log"; summarise "$RUNS/net-cuda"
echo "== 2b. the same on one CPU core per node, $STEPS_CPU steps"
"$BIN/slowmo-testnet" local --nodes 2 --slowmo-bin "$BIN/slowmo" --out "$RUNS/net-cpu" \
    --no-report --quiet --steps "$STEPS_CPU" "${train[@]}" >"$OUT/net-cpu.log" 2>&1
echo "exit $?"; tail -n 8 "$OUT/net-cpu.log"; summarise "$RUNS/net-cpu"
