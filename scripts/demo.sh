#!/usr/bin/env bash
# The demo: two "hosts" (network namespaces joined by a veth pair), each running vrdma's soft
# RoCEv2 engine; vrdma-perf moves data between them with RDMA WRITE, READ, SEND and atomics,
# verifies it end to end, and measures bandwidth and latency. Needs root (namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh build >/dev/null
PERF=$PWD/build/nicdrv/vrdma-perf
if [ "$(id -u)" -ne 0 ]; then echo "demo: run as root (it creates network namespaces)"; exit 1; fi
A=vrdma-demo-a B=vrdma-demo-b IPA=10.232.0.1 IPB=10.232.0.2
cleanup() { ip netns del $A 2>/dev/null || true; ip netns del $B 2>/dev/null || true; }
trap cleanup EXIT
cleanup
ip netns add $A; ip netns add $B
ip link add demo-a netns $A mtu 9000 type veth peer name demo-b netns $B mtu 9000
ip -n $A addr add $IPA/24 dev demo-a; ip -n $B addr add $IPB/24 dev demo-b
ip -n $A link set demo-a up; ip -n $B link set demo-b up
echo "host A: namespace $A, soft:$IPA    host B: namespace $B, soft:$IPB (veth, MTU 9000)"
run() {
  ip netns exec $A timeout 60 "$PERF" --device soft:$IPA "$@" >/dev/null &
  sleep 0.3
  ip netns exec $B timeout 60 "$PERF" --device soft:$IPB --connect $IPA "$@"
  wait
}
echo "== RDMA WRITE, 64 KiB messages, path MTU 4096, data verified"
run --test write_bw --size 65536 --duration 3 --depth 64 --mtu 4096 --verify
echo "== RDMA READ, 1 MiB messages"
run --test read_bw --size 1048576 --iters 200 --depth 8 --mtu 4096 --verify
echo "== SEND/RECV, 4 KiB messages"
run --test send_bw --size 4096 --iters 20000 --depth 64 --mtu 4096 --verify
echo "== ATOMIC FETCH_AND_ADD"
run --test atomic_bw --iters 20000 --depth 16 --verify
echo "== SEND ping-pong latency, 64 B"
run --test send_lat --size 64 --iters 5000
echo "demo: done"
