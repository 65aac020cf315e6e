#!/bin/sh
# Entry point of the slowmo image: applies this node's link emulation, writes
# the run config handed over in the environment, then exec's `slowmo "$@"`.
#
# POSIX sh using shell builtins only (besides tc and nft), so it runs on
# busybox as well as on a bare dash copied into the FROM-scratch image.
#
# Environment (all optional; unset, empty or 0 means "leave alone"):
#   SLOWMO_IFACE           interface to shape                         [eth0]
#   SLOWMO_DELAY_MS        one-way egress delay in ms (netem)
#   SLOWMO_JITTER_MS       delay jitter in ms (netem)
#   SLOWMO_LOSS_PERCENT    egress packet loss in % (netem, else nftables)
#   SLOWMO_RATE_MBIT       egress bandwidth cap in Mbit/s (tbf)
#   SLOWMO_SHAPING_STRICT  1: exit 78 when a setting cannot be applied
#                          (default: warn, record it in the report, go on)
#   SLOWMO_RUN_CONFIG      TOML text of the run config, written to ...
#   SLOWMO_RUN_CONFIG_PATH ... this file                    [/data/run.toml]
#   SLOWMO_SHAPING_REPORT  what was applied, for the results [/data/shaping.txt]
#
# Shaping needs CAP_NET_ADMIN (compose: cap_add: [NET_ADMIN]). Only egress is
# shaped, so a node's delay applies to what it sends: the round trip between
# two nodes is the sum of their delays, and a rate cap is the node's uplink.
set -eu

iface="${SLOWMO_IFACE:-eth0}"
delay="${SLOWMO_DELAY_MS:-}"
jitter="${SLOWMO_JITTER_MS:-}"
loss="${SLOWMO_LOSS_PERCENT:-}"
rate="${SLOWMO_RATE_MBIT:-}"
strict="${SLOWMO_SHAPING_STRICT:-0}"
report="${SLOWMO_SHAPING_REPORT:-/data/shaping.txt}"

say() { echo "slowmo-entrypoint: $*" >&2; }

# Thousandths of a non-negative decimal ("12.5" -> 12500), builtins only.
milli() {
    whole="${1%%.*}"
    frac=""
    case "$1" in *.*) frac="${1#*.}" ;; esac
    frac="${frac}000"
    rest="${frac#???}"
    frac="${frac%"$rest"}"
    v="${whole:-0}$frac"
    # No leading zeros: sh arithmetic would read them as octal.
    while [ "${#v}" -gt 1 ] && [ "${v#0}" != "$v" ]; do v="${v#0}"; done
    case "$v" in
        *[!0-9]*)
            say "not a non-negative number: '$1'"
            exit 64
            ;;
    esac
    echo "$v"
}

nonzero() { [ -n "$1" ] && [ "$(milli "$1")" -gt 0 ]; }

problems=""
fail_or_warn() {
    say "WARNING: $*"
    problems="$problems
WARNING: $*"
    if [ "$strict" = 1 ]; then
        say "SLOWMO_SHAPING_STRICT=1: giving up"
        exit 78
    fi
}

# The real tool on PATH, by absolute path: busybox's ash would otherwise run
# its own (much smaller) `tc` applet in preference to /usr/sbin/tc.
find_tool() {
    old_ifs="$IFS"
    IFS=:
    found=""
    for dir in $PATH; do
        if [ -x "$dir/$1" ] && [ ! -d "$dir/$1" ]; then
            # Applet links point at busybox; a real file wins over any link.
            if [ ! -L "$dir/$1" ]; then
                found="$dir/$1"
                break
            fi
            found="${found:-$dir/$1}"
        fi
    done
    IFS="$old_ifs"
    [ -n "$found" ] && echo "$found"
}
tc="$(find_tool tc || true)"
nft="$(find_tool nft || true)"
have() { [ -n "$1" ]; }

want_netem=0
if nonzero "$delay" || nonzero "$jitter" || nonzero "$loss"; then want_netem=1; fi
want_rate=0
if nonzero "$rate"; then want_rate=1; fi
if [ "$want_netem$want_rate" != 00 ] && ! have "$tc"; then
    fail_or_warn "tc is not in the image: no link emulation"
fi

netem_ok=0
if [ "$want_netem" = 1 ] && have "$tc"; then
    args=""
    if nonzero "$delay" || nonzero "$jitter"; then
        args="delay ${delay:-0}ms"
        if nonzero "$jitter"; then args="$args ${jitter}ms"; fi
    fi
    if nonzero "$loss"; then args="$args loss ${loss}%"; fi
    # shellcheck disable=SC2086 # args is a word list on purpose
    if err="$("$tc" qdisc replace dev "$iface" root handle 1: netem $args 2>&1)"; then
        netem_ok=1
        say "netem on $iface: $args"
    elif nonzero "$delay" || nonzero "$jitter"; then
        fail_or_warn "netem failed on $iface ($err): this kernel may lack sch_netem; delay/jitter are NOT emulated"
    fi
fi

if [ "$want_rate" = 1 ] && have "$tc"; then
    # Thousandths of Mbit/s are kbit/s. burst: 10 ms at the rate, >= 32 KiB.
    kbit="$(milli "$rate")"
    burst=$((kbit * 10 / 8))
    if [ "$burst" -lt 32768 ]; then burst=32768; fi
    if [ "$netem_ok" = 1 ]; then
        where="parent 1:1 handle 10:"
    else
        where="root handle 10:"
    fi
    # shellcheck disable=SC2086
    if err="$("$tc" qdisc replace dev "$iface" $where tbf rate "${kbit}kbit" burst "$burst" latency 200ms 2>&1)"; then
        say "tbf on $iface: ${kbit} kbit/s, burst $burst bytes"
    else
        fail_or_warn "tbf failed on $iface ($err): bandwidth NOT capped"
    fi
fi

# Loss without netem: drop a random share of outgoing packets with nftables.
if nonzero "$loss" && [ "$netem_ok" = 0 ]; then
    per10k=$(($(milli "$loss") / 10))
    rules="table inet slowmo_shaping
delete table inet slowmo_shaping
table inet slowmo_shaping {
    chain output {
        type filter hook output priority 0; policy accept;
        oifname \"$iface\" numgen random mod 10000 < $per10k drop
    }
}"
    if ! have "$nft"; then
        fail_or_warn "no netem and no nft in the image: ${loss}% loss NOT emulated"
    elif err="$(printf '%s\n' "$rules" | "$nft" -f - 2>&1)"; then
        say "nftables on $iface: dropping ${loss}% of outgoing packets"
    else
        fail_or_warn "nft failed on $iface ($err): ${loss}% loss NOT emulated"
    fi
fi

if [ -n "${SLOWMO_RUN_CONFIG:-}" ]; then
    config_path="${SLOWMO_RUN_CONFIG_PATH:-/data/run.toml}"
    printf '%s\n' "$SLOWMO_RUN_CONFIG" >"$config_path"
fi

# Record what this node runs under, for the results folder.
if [ -d "${report%/*}" ]; then
    {
        echo "requested: delay_ms=$delay jitter_ms=$jitter loss_percent=$loss rate_mbit=$rate"
        echo "netem_applied=$netem_ok"
        if [ -n "$problems" ]; then echo "$problems"; fi
        if have "$tc"; then "$tc" qdisc show dev "$iface" 2>&1 || true; fi
        if have "$nft"; then "$nft" list table inet slowmo_shaping 2>/dev/null || true; fi
        if [ -r /sys/fs/cgroup/cpu.max ]; then
            read -r quota </sys/fs/cgroup/cpu.max && echo "cpu.max: $quota"
        elif [ -r /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
            read -r quota </sys/fs/cgroup/cpu/cpu.cfs_quota_us
            read -r period </sys/fs/cgroup/cpu/cpu.cfs_period_us
            echo "cfs_quota_us: $quota period_us: $period"
        fi
    } >"$report" 2>/dev/null || true
fi

exec slowmo "$@"
