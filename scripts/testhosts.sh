#!/usr/bin/env bash
# Test hosts on one machine: N network namespaces joined by a Linux bridge, each a "host" with its
# own address, loopback, NIC and work folders. The one definition of the test hosts: the pytest
# fixture (tests/support/testhosts.py) runs this script too. Needs root (CAP_NET_ADMIN).
#
#   scripts/testhosts.sh [-p PREFIX] up N          # make hosts h1..hN, print their table
#   scripts/testhosts.sh [-p PREFIX] exec HOST CMD  # run CMD on HOST (its network, hostname, folders)
#   scripts/testhosts.sh [-p PREFIX] down           # kill everything on the hosts, remove them
#
# PREFIX (default th, at most 8 characters) names everything: namespaces PREFIX-hI, the bridge
# PREFIX-br, the state folder $TESTHOSTS_ROOT/PREFIX (default /tmp/testhosts). Each `up` takes a
# free subnet 10.77.K.0/24: this machine (the root namespace, where a driver runs) is 10.77.K.1 on
# the bridge, host hI is 10.77.K.(10+I) on its eth0. Each host also has eth1, 10.78.K.(10+I)/24,
# a veth whose peer stays inside the host: an interface up, with an address no one else can reach.
# HOST's processes (exec) get a hostname of their own (PREFIX-hI, in /etc/hosts on every host) and
# TMPDIR, SPARK_LOCAL_DIRS, SPARK_WORKER_DIR, SPARK_LOCAL_IP of their own (TMPDIR holds Petastorm's
# default cache): nothing of a host's local state is shared with another.
set -euo pipefail

PREFIX=th
if [ "${1:-}" = -p ]; then PREFIX=$2; shift 2; fi
[[ $PREFIX =~ ^[a-z][a-z0-9]{0,7}$ ]] || { echo "testhosts: PREFIX must be 1-8 of [a-z0-9], starting with a letter: $PREFIX" >&2; exit 2; }
STATE=${TESTHOSTS_ROOT:-/tmp/testhosts}/$PREFIX
BRIDGE=$PREFIX-br

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

free_subnet() {  # the first K with no 10.77.K. address on this machine
  local used
  used=$(ip -o -4 addr show | grep -o ' 10\.77\.[0-9]*\.' || true)
  for k in $(seq 0 254); do
    grep -q " 10\.77\.$k\.$" <<<"$used" || { echo "$k"; return; }
  done
  echo "testhosts: no free subnet 10.77.K.0/24 left" >&2; exit 1
}

add_host() {  # add_host I K: namespace, eth1 (unroutable, made first so it is listed first), eth0 on the bridge
  local i=$1 k=$2 name=$PREFIX-h$1 dir=$STATE/h$1
  ip netns add "$name"
  ip -n "$name" link set lo up
  ip -n "$name" link add eth1 type veth peer name eth1-peer
  ip -n "$name" addr add "10.78.$k.$((10 + i))/24" dev eth1
  ip -n "$name" link set eth1-peer up
  ip -n "$name" link set eth1 up
  ip link add "$name" type veth peer name eth0 netns "$name"
  ip link set "$name" master "$BRIDGE" up
  ip -n "$name" addr add "10.77.$k.$((10 + i))/24" dev eth0
  ip -n "$name" link set eth0 up
  mkdir -p "$dir/tmp" "$dir/spark-local" "$dir/spark-worker" "/etc/netns/$name"
  cat >"$dir/env" <<EOF
export TESTHOST=$name TMPDIR=$dir/tmp SPARK_LOCAL_DIRS=$dir/spark-local SPARK_WORKER_DIR=$dir/spark-worker
export SPARK_LOCAL_IP=10.77.$k.$((10 + i))
EOF
  echo "h$i $name 10.77.$k.$((10 + i)) 10.78.$k.$((10 + i)) $dir" >>"$STATE/hosts"
}

up() {
  local n=${1:?usage: up N}
  [[ $n =~ ^[1-9][0-9]?$ ]] || { echo "testhosts: N must be 1-99, got $n" >&2; exit 2; }
  [ ! -e "$STATE" ] || { echo "testhosts: $STATE exists: hosts $PREFIX are up (run down first)" >&2; exit 1; }
  mkdir -p "$(dirname "$STATE")"
  exec 9>"$(dirname "$STATE")/.lock"
  flock 9  # two `up`s at once would pick the same subnet
  local k
  k=$(free_subnet)
  mkdir -p "$STATE"
  trap 'down >/dev/null 2>&1 || true' ERR
  ip link add "$BRIDGE" type bridge
  ip addr add "10.77.$k.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # Where bridged frames pass iptables (br_netfilter) under a FORWARD policy of DROP (Docker's), let ours through
  if command -v iptables >/dev/null; then iptables -I FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT; fi
  echo "driver - 10.77.$k.1 - -" >"$STATE/hosts"
  for i in $(seq 1 "$n"); do add_host "$i" "$k"; done
  local hosts_file
  hosts_file=$(printf '127.0.0.1 localhost\n'; awk -v p="$PREFIX" '$1 != "driver" {print $3, $2}' "$STATE/hosts")
  for i in $(seq 1 "$n"); do printf '%s\n' "$hosts_file" >"/etc/netns/$PREFIX-h$i/hosts"; done
  trap - ERR
  cat "$STATE/hosts"
}

on_host() {  # exec HOST CMD...: HOST's network (ip netns exec), its own hostname (a UTS namespace), its folders
  local host=${1:?usage: exec HOST CMD...}; shift
  [ -f "$STATE/$host/env" ] || { echo "testhosts: no host $host under $STATE" >&2; exit 2; }
  exec ip netns exec "$PREFIX-$host" env TESTHOST_ENV="$STATE/$host/env" unshare --uts -- sh -c \
    '. "$TESTHOST_ENV" && hostname "$TESTHOST" && exec "$@"' sh "$@"
}

down() {  # everything named PREFIX-*, whatever state is left: processes first (they keep a namespace alive)
  local ns
  for ns in $(ip netns list | awk '{print $1}' | grep "^$PREFIX-h[0-9]*$" || true); do
    ip netns pids "$ns" | xargs -r kill -TERM 2>/dev/null || true
  done
  sleep 0.5
  for ns in $(ip netns list | awk '{print $1}' | grep "^$PREFIX-h[0-9]*$" || true); do
    ip netns pids "$ns" | xargs -r kill -KILL 2>/dev/null || true
    ip netns del "$ns"
    ip link del "$ns" 2>/dev/null || true  # the kernel frees a namespace's links lazily: gone or going
    rm -rf "/etc/netns/$ns"
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  if command -v iptables >/dev/null; then
    while iptables -D FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null; do :; done
  fi
  rm -rf "$STATE"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  exec) shift; on_host "$@" ;;
  down) down ;;
  *) usage ;;
esac
