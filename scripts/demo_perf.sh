#!/usr/bin/env bash
# `scripts/demo.sh --perf`: two "hosts" (network namespaces joined by a veth pair), each running vrdma's soft
# RoCEv2 engine; vrdma-perf moves data between them with RDMA WRITE, READ, SEND and atomics,
# verifies it end to end, and measures bandwidth and latency. Then the same over paravirtual
# verbs: a guest device served by vrdmad on host A, vrdma-perf as its libpvverbs application.
# Needs root (namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh build >/dev/null
PERF=$PWD/build/nicdrv/vrdma-perf
if [ "$(id -u)" -ne 0 ]; then echo "demo: run as root (it creates network namespaces)"; exit 1; fi
A=vrdma-demo-a B=vrdma-demo-b IPA=10.232.0.1 IPB=10.232.0.2
TMP=
cleanup() {
  for ns in $A $B; do ip netns pids $ns 2>/dev/null | xargs -r kill 2>/dev/null || true; ip netns del $ns 2>/dev/null || true; done
  [ -n "$TMP" ] && rm -rf "$TMP"
  return 0
}
trap cleanup EXIT
cleanup
TMP=$(mktemp -d)
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
echo "== paravirtual verbs: vrdmad serves a virtio RDMA device on host A; vrdma-perf drives it through libpvverbs"
ip netns exec $A "$PWD/build/daemon/vrdmad" --socket "$TMP/guest.sock" --engine soft:$IPA --control "$TMP/guest.ctl" \
  2>"$TMP/vrdmad.log" &
for _ in $(seq 100); do [ -S "$TMP/guest.ctl" ] && break; sleep 0.05; done
runpv() {
  ip netns exec $B timeout 60 "$PERF" --device soft:$IPB "$@" >/dev/null &
  local server=$!
  sleep 0.3
  ip netns exec $A timeout 60 "$PERF" --device "pv:$TMP/guest.sock?ram_mib=64" --connect $IPB "$@"
  wait $server
}
echo "== pv RDMA WRITE, 64 KiB messages, data verified"
runpv --test write_bw --size 65536 --duration 3 --depth 64 --mtu 4096 --verify
echo "== pv SEND ping-pong latency, 64 B"
runpv --test send_lat --size 64 --iters 5000
echo "== vrdmad's own account (its JSON control socket)"
python3 - "$TMP/guest.ctl" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b'{"cmd":"status"}')
st = json.loads(s.makefile().readline())
print(f"  commands {st['commands']}, doorbells {st['doorbells']}, send WQEs {st['send_wqes']}, completions {st['cqes']}, "
      f"refused {st['command_errors']}, vhost-user connections {st['vhost']['connections']}")
PY
echo "demo: done"
