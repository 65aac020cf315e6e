#!/usr/bin/env bash
# Builds (up) or removes (down) machines on one LAN in network namespaces,
# each behind a host firewall that admits new connections only to the ports
# named, as a cloud machine's security group does:
#   lan  a bridge 10.201.0.0/24
#   mK   machine K at 10.201.0.(10+K)
# The firewall (nftables, per machine): loopback, established and related
# traffic, ICMP, and new connections to TCP_PORTS (TCP) and UDP_PORTS (UDP);
# everything else that arrives is dropped without an answer.
# Namespaces are prefixed with $PREFIX.
# usage: TCP_PORTS="7000 7001" UDP_PORTS="" netns.sh up MACHINES | netns.sh down
set -euo pipefail
PREFIX=${PREFIX:-smf}
cmd=${1:?up or down}
if [ "$cmd" = down ]; then
  for ns in $(ip netns list | awk '{print $1}' | grep "^$PREFIX-" || true); do
    ip netns del "$ns"
  done
  exit 0
fi
machines=${2:?number of machines}
ex() { ip netns exec "$PREFIX-$1" "${@:2}"; }
set_of() { local s; s=$(echo "$*" | xargs | tr ' ' ','); echo "$s"; }
tcp=$(set_of "${TCP_PORTS:-}")
udp=$(set_of "${UDP_PORTS:-}")
ip netns add "$PREFIX-lan"
ex lan ip link set lo up
ex lan ip link add br0 type bridge
ex lan ip link set br0 up
for k in $(seq 1 "$machines"); do
  m="m$k"
  ip netns add "$PREFIX-$m"
  ex $m ip link set lo up
  ip link add "$PREFIX-v$k" type veth peer name eth0 netns "$PREFIX-$m"
  ip link set "$PREFIX-v$k" netns "$PREFIX-lan"
  ex lan ip link set "$PREFIX-v$k" master br0 up
  ex $m ip addr add "10.201.0.$((10 + k))/24" dev eth0
  ex $m ip link set eth0 up
  rules=""
  [ -n "$tcp" ] && rules="$rules tcp dport { $tcp } accept;"
  [ -n "$udp" ] && rules="$rules udp dport { $udp } accept;"
  ex $m nft -f - <<NFT
table inet firewall {
  chain input {
    type filter hook input priority 0; policy drop;
    iif "lo" accept;
    ct state established,related accept;
    meta l4proto { icmp, ipv6-icmp } accept;
    $rules
  }
}
NFT
done
