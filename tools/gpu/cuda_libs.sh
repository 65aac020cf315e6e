# Sourced by the GPU scripts: finds the CUDA 13 libraries a CUDA build of
# `slowmo` links (the toolkit's folders first, then wherever a Python
# package put them), exports LD_LIBRARY_PATH, and stops if one is missing.
# $BIN must name the folder holding `slowmo`.
dirs=""
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13; do
    found=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
        [ -e "$d/$lib" ] && found=$d && break
    done
    if [ -z "$found" ]; then
        p=$(find /usr/local /opt /usr/lib -name "$lib" 2>/dev/null | head -n1)
        [ -n "$p" ] && found=$(dirname "$p")
    fi
    echo "$lib: ${found:-NOT FOUND}"
    [ -n "$found" ] && case ":$dirs:" in *":$found:"*) ;; *) dirs="$dirs:$found" ;; esac
done
export LD_LIBRARY_PATH="${dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ldd "$BIN/slowmo" | grep 'not found'; then
    echo "missing libraries; stopping"
    exit 1
fi

