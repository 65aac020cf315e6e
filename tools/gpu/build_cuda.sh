#!/usr/bin/env bash
# Builds `slowmo` with CUDA support on a machine without a GPU or a CUDA
# install, from NVIDIA's PyPI wheels (CUDA 13.0), for a Hopper GPU (sm_90).
#
#   tools/gpu/build_cuda.sh [CUDA_DIR] [TARGET_DIR]
#
# CUDA_DIR (default /opt/cuda13) is made from the wheels if it is missing.
# The binary links libcuda.so.1, libcudart, libcublas, libcublasLt, libcurand
# and libnvrtc dynamically; the GPU machine supplies them (driver and CUDA
# 13 libraries). The driver library is not in any wheel, so the link uses a
# stub with the driver API's names, generated from cudarc's bindings.
set -euo pipefail
CUDA_DIR=${1:-/opt/cuda13}
TARGET_DIR=${2:-target-cuda}
COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}

if [ ! -x "$CUDA_DIR/bin/nvcc" ]; then
    wheels=$(mktemp -d)
    python3 -m pip download --no-deps --only-binary=:all: \
        --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --python-version 3.11 -d "$wheels" \
        'nvidia-cuda-nvcc==13.0.*' 'nvidia-cuda-crt==13.0.*' 'nvidia-nvvm==13.0.*' \
        'nvidia-cuda-runtime==13.0.*' 'nvidia-cublas==13.0.*' 'nvidia-curand' \
        'nvidia-cuda-nvrtc==13.0.*' 'nvidia-cuda-cccl==13.0.*'
    mkdir -p "$wheels/x"
    for w in "$wheels"/*.whl; do python3 -m zipfile -e "$w" "$wheels/x"; done
    mkdir -p "$(dirname "$CUDA_DIR")"
    mv "$wheels/x/nvidia/cu13" "$CUDA_DIR"
    chmod +x "$CUDA_DIR"/bin/* "$CUDA_DIR"/nvvm/bin/*
    rm -rf "$wheels"
fi
for lib in cublas cublasLt curand nvrtc cudart; do
    [ -e "$CUDA_DIR/lib/lib$lib.so" ] ||
        ln -s "$(cd "$CUDA_DIR/lib" && ls "lib$lib.so."* | head -n1)" "$CUDA_DIR/lib/lib$lib.so"
done
if [ ! -e "$CUDA_DIR/lib/stubs/libcuda.so" ]; then
    sys=$(cargo metadata --format-version 1 |
        python3 -c 'import json,sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"]=="cudarc"))')
    sys=$(dirname "$sys")/src/driver/sys/mod.rs
    mkdir -p "$CUDA_DIR/lib/stubs"
    grep -o 'fn cu[A-Z][A-Za-z0-9_]*' "$sys" | sort -u |
        sed 's/fn \(.*\)/int \1(void) { return 999; }/' >"$CUDA_DIR/lib/stubs/libcuda.c"
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$CUDA_DIR/lib/stubs/libcuda.so" \
        "$CUDA_DIR/lib/stubs/libcuda.c"
fi

export PATH="$CUDA_DIR/bin:$PATH" CUDA_ROOT="$CUDA_DIR" CUDARC_CUDA_VERSION=13000 \
    CUDA_COMPUTE_CAP="$COMPUTE_CAP" CARGO_TARGET_DIR="$TARGET_DIR"
cargo build --release -p slowmo-node --features cuda
cargo build --release -p slowmo-testnet
echo "built $TARGET_DIR/release/slowmo (CUDA, sm_$COMPUTE_CAP) and $TARGET_DIR/release/slowmo-testnet"
