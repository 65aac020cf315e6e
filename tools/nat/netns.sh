#!/usr/bin/env bash
# Builds (up) or removes (down) a small internet in network namespaces:
#   inet  the public segment 10.200.0.0/24 (bridge, 10.200.0.1: the relay)
#   rK    a NAT router per private segment K (WAN 10.200.0.1K, LAN 192.168.K.1)
#   hK-J  host J behind router K (192.168.K.(J+1)), default route via rK
# Routers masquerade what leaves their WAN: endpoint-independent mapping,
# as common home routers do; with NAT_KIND=symmetric a random port per
# connection (symmetric NAT; NAT_KIND="cone symmetric" sets each router's
# kind in turn); unasked packets on the WAN are dropped.
# Namespaces are prefixed with $PREFIX.
# usage: netns.sh up NATS HOSTS_PER_NAT | netns.sh down
set -euo pipefail
PREFIX=${PREFIX:-smn}
cmd=${1:?up or down}
if [ "$cmd" = down ]; then
  for ns in $(ip netns list | awk '{print $1}' | grep "^$PREFIX-" || true); do
    ip netns del "$ns"
  done
  exit 0
fi
nats=${2:?number of NATs}
hosts=${3:?hosts per NAT}
ex() { ip netns exec "$PREFIX-$1" "${@:2}"; }
ip netns add "$PREFIX-inet"
ex inet ip link set lo up
ex inet ip link add br0 type bridge
ex inet ip addr add 10.200.0.1/24 dev br0
ex inet ip link set br0 up
for k in $(seq 1 "$nats"); do
  r="r$k"
  ip netns add "$PREFIX-$r"
  ex $r ip link set lo up
  ex $r sysctl -qw net.ipv4.ip_forward=1
  ip link add "$PREFIX-w$k" type veth peer name wan netns "$PREFIX-$r"
  ip link set "$PREFIX-w$k" netns "$PREFIX-inet"
  ex inet ip link set "$PREFIX-w$k" master br0 up
  ex $r ip addr add "10.200.0.1$k/24" dev wan
  ex $r ip link set wan up
  ex $r ip link add lan type bridge
  ex $r ip addr add "192.168.$k.1/24" dev lan
  ex $r ip link set lan up
  # NAT_KIND: one kind for every router, or one per router ("cone symmetric")
  kinds=(${NAT_KIND:-cone})
  kind=${kinds[$(( (k - 1) % ${#kinds[@]} ))]}
  random=""
  [ "$kind" = symmetric ] && random="random"
  # Like a home router: what comes in on the WAN unasked (no mapping yet)
  # is dropped without an answer (a reset would end a hole punch whose
  # first packet arrives before the router's own one left).
  ex $r nft -f - <<NFT
table ip nat {
  chain post { type nat hook postrouting priority 100; oifname "wan" masquerade $random; }
}
table inet filter {
  chain input { type filter hook input priority 0; iifname "wan" ct state new drop; }
}
NFT
  for j in $(seq 1 "$hosts"); do
    h="h$k-$j"
    ip netns add "$PREFIX-$h"
    ex $h ip link set lo up
    ip link add "$PREFIX-l$k$j" type veth peer name eth0 netns "$PREFIX-$h"
    ip link set "$PREFIX-l$k$j" netns "$PREFIX-$r"
    ex $r ip link set "$PREFIX-l$k$j" master lan up
    ex $h ip addr add "192.168.$k.$((j + 1))/24" dev eth0
    ex $h ip link set eth0 up
    ex $h ip route add default via "192.168.$k.1"
  done
done
