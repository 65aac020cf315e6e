#!/usr/bin/env bash
# Builds the slowmo container image.
#
#   docker/build-image.sh [--local | --dockerfile] [--bin PATH] [--tag TAG] [--no-strip]
#
# --local (default): a FROM-scratch image made from files already on this
#   machine, for Docker Engines that cannot pull images. It holds the slowmo
#   binary given by --bin (default: target/release/slowmo, or target/debug/slowmo
#   when there is no release build), the shared libraries it links to (ldd),
#   tc and ip (iproute2) and nft for link emulation and partitions, a shell
#   (busybox-static when installed, else the host's dash), CA certificates,
#   the UTC zone file and docker/entrypoint.sh. Nothing is downloaded; the
#   root filesystem goes in through `docker import`, so no builder is needed.
# --dockerfile: the multi-stage docker/Dockerfile (builds slowmo in a Rust
#   image, runs it on debian:bookworm-slim); needs a registry to pull from.
#
# The image's entrypoint applies the node's shaping, then runs `slowmo "$@"`.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
mode=local
bin=""
tag="slowmo:local"
strip=1

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "build-image: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case "$1" in
        --local) mode=local ;;
        --dockerfile) mode=dockerfile ;;
        --bin) bin="${2:?--bin needs a path}"; shift ;;
        --bin=*) bin="${1#--bin=}" ;;
        --tag) tag="${2:?--tag needs a name}"; shift ;;
        --tag=*) tag="${1#--tag=}" ;;
        --no-strip) strip=0 ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
    shift
done

command -v docker >/dev/null || die "docker is not installed"

if [ "$mode" = dockerfile ]; then
    [ -z "$bin" ] || die "--bin applies to --local only (the Dockerfile builds its own binary)"
    exec docker build -f "$here/Dockerfile" -t "$tag" "$root"
fi

if [ -z "$bin" ]; then
    for candidate in "$root/target/release/slowmo" "$root/target/debug/slowmo"; do
        if [ -x "$candidate" ]; then bin="$candidate"; break; fi
    done
    [ -n "$bin" ] || die "no slowmo binary: build one (cargo build --release -p slowmo-node) or pass --bin PATH"
fi
[ -f "$bin" ] && [ -x "$bin" ] || die "--bin $bin: not an executable file"
[ "$(uname -m)" = x86_64 ] || [ "$(uname -m)" = aarch64 ] || die "unsupported machine $(uname -m)"

stage="$(mktemp -d "${TMPDIR:-/tmp}/slowmo-image.XXXXXX")"
if [ -z "${SLOWMO_IMAGE_KEEP:-}" ]; then trap 'rm -rf "$stage"' EXIT; else echo "build-image: keeping $stage" >&2; fi
fs="$stage/rootfs"
mkdir -p "$fs"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,etc/ssl/certs,usr/share/zoneinfo,data,tmp}
chmod 1777 "$fs/tmp"

# Copies a file to the same path inside the image, following symlinks.
put() {
    local src="$1" dst="$fs$1"
    mkdir -p "$(dirname "$dst")"
    cp -L "$src" "$dst"
}

# Copies the shared libraries an ELF file needs (and the loader).
put_libs() {
    local lib
    if ! ldd "$1" >/dev/null 2>&1; then return 0; fi # static
    for lib in $(ldd "$1" | awk '/=> \// { print $3 } /^\t\// { print $1 }'); do
        [ -e "$fs$lib" ] || put "$lib"
    done
}

install -m 0755 "$bin" "$fs/usr/local/bin/slowmo"
if [ "$strip" = 1 ] && command -v strip >/dev/null; then
    strip --strip-debug "$fs/usr/local/bin/slowmo"
fi
put_libs "$bin"
install -m 0755 "$here/entrypoint.sh" "$fs/usr/local/bin/slowmo-entrypoint"

# Link emulation and partitions: tc and ip (iproute2), nft (nftables).
for tool in tc ip nft; do
    path="$(command -v "$tool" || true)"
    if [ -z "$path" ]; then
        echo "build-image: WARNING: $tool is not installed here; the image has no $tool" \
            "(apt-get install iproute2 nftables)" >&2
        continue
    fi
    put "$path"
    put_libs "$path"
done
# netem's delay distribution tables, where iproute2 keeps them.
for dir in /usr/lib/tc /usr/lib/x86_64-linux-gnu/tc /usr/lib/aarch64-linux-gnu/tc; do
    if [ -d "$dir" ]; then
        mkdir -p "$fs$dir"
        cp -L "$dir"/*.dist "$fs$dir/" 2>/dev/null || true
    fi
done

# A shell for the entrypoint (and for `docker exec -it NODE sh`).
busybox="$(command -v busybox || true)"
if [ -n "$busybox" ] && ! ldd "$busybox" >/dev/null 2>&1; then
    cp -L "$busybox" "$fs/bin/busybox"
    for applet in $("$busybox" --list); do
        # Never shadow the real tools copied above.
        case "$applet" in tc | ip | nft | busybox) continue ;; esac
        [ -e "$fs/bin/$applet" ] || ln -s busybox "$fs/bin/$applet"
    done
else
    dash="$(command -v dash || true)"
    [ -n "$dash" ] || die "no shell to put in the image: apt-get install busybox-static"
    echo "build-image: busybox-static is not installed; using dash as /bin/sh" \
        "(the image then has no cat/ls/tail: apt-get install busybox-static)" >&2
    put "$dash"
    put_libs "$dash"
    [ -e "$fs/bin/sh" ] || ln -s "$dash" "$fs/bin/sh"
fi

# Certificates, time zone, users, name service.
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp -L /etc/ssl/certs/ca-certificates.crt "$fs/etc/ssl/certs/"
fi
if [ -f /usr/share/zoneinfo/UTC ]; then
    cp -L /usr/share/zoneinfo/UTC "$fs/usr/share/zoneinfo/UTC"
    ln -s /usr/share/zoneinfo/UTC "$fs/etc/localtime"
fi
printf 'root:x:0:0:root:/data:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$fs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$fs/etc/group"
printf 'hosts: files dns\n' >"$fs/etc/nsswitch.conf"

# The loader must run the binary inside the image: check before importing.
"$fs/usr/local/bin/slowmo" --version >/dev/null 2>&1 ||
    echo "build-image: WARNING: $bin --version failed on the host" >&2

tar --numeric-owner --owner=0 --group=0 -C "$fs" -cf "$stage/rootfs.tar" .
size="$(du -h "$stage/rootfs.tar" | cut -f1)"
docker import \
    --change 'ENTRYPOINT ["/usr/local/bin/slowmo-entrypoint"]' \
    --change 'CMD ["--help"]' \
    --change 'ENV PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV TZ=UTC' \
    --change 'WORKDIR /data' \
    --change 'LABEL org.opencontainers.image.title=slowmo' \
    --message "slowmo local image from $bin" \
    "$stage/rootfs.tar" "$tag" >/dev/null
echo "build-image: built $tag ($size root filesystem) from $bin" >&2
