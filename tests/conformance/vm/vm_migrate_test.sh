#!/usr/bin/env bash
# Live migration of a real QEMU 7.2 VM with an open RDMA connection, the peer unmodified
# (issue 6 with a real guest): the guest (Debian kernel, busybox initramfs, TCG) runs
# vrdma-stream over pv:pci (the device rides vhost-user-blk-pci) against vrdma-stream on a plain
# soft engine on a third "host"; every message each way is checked (once, in order, right bytes)
# and every work request must complete once. While it streams, QEMU's own `migrate` moves the
# VM host A -> host B -> host A, each host with its own vrdmad: the destination runs with
# `--incoming guest` and nobody tells the source anything (the device state travels in the
# guest's memory, docs/virtio-rdma.md "State in guest memory"). The switch between the hosts
# drops 1% of RoCE packets throughout.
#
# Namespaces: a switch (bridge), hosts A and B (the guest's RDMA address on an interface with
# the guest's MAC, silent on the host the guest is not on; a bridge for the guest's virtio-net
# tap; a management link A-B for QEMU's migration stream), and the peer.
#   vm_migrate_test.sh VRDMA_PERF VRDMAD PVVERBS_BIND VRDMA_STREAM
# Exits 77 (skip) without root, QEMU or the guest kernel. KEEP_WORK=1 keeps the logs.
set -euo pipefail
PERF=$(readlink -f "$1"); VRDMAD=$(readlink -f "$2"); BIND=$(readlink -f "$3"); STREAM=$(readlink -f "$4")
HERE=$(cd "$(dirname "$0")" && pwd)
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] && ip netns list >/dev/null 2>&1 || skip "needs root to create network namespaces"
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)"
command -v nft >/dev/null || skip "nft is not installed (apt-get install nftables)"
rc=0; out=$("$HERE/make_guest.sh" "$PERF" "$BIND" "$STREAM" 2>&1) || rc=$?
if [ $rc -eq 3 ]; then skip "guest unavailable: $out"; elif [ $rc -ne 0 ]; then echo "$out"; exit 1; fi
KERNEL=$(echo "$out" | sed -n 's/.*KERNEL=\([^ ]*\).*/\1/p')
INITRD=$(echo "$out" | sed -n 's/.*INITRD=\([^ ]*\).*/\1/p')

MSGS=${VM_MIGRATE_MESSAGES:-150000}
SW=vmsw$$ A=vma$$ B=vmb$$ P=vmp$$
GIP=10.78.0.12 GMAC=52:54:00:78:00:0c   # the guest's RDMA identity (vrdmad's engine)
GUEST=10.78.0.2 NICMAC=52:54:00:78:00:02 PEER=10.78.0.3
MA=10.79.0.1 MB=10.79.0.2
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for ns in $A $B $P $SW; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
  done
  sleep 0.3
  for ns in $A $B $P $SW; do ip netns del "$ns" 2>/dev/null || true; done
  if [ -n "${KEEP_WORK:-}" ]; then echo "work dir kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
failed=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
die() {
  echo "FAIL: $*"
  for f in "$work"/*.log; do echo "--- $f"; tail -15 "$f"; done
  exit 1
}

# ---- the fabric ----
for ns in $SW $A $B $P; do
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
done
ip -n $SW link add br0 type bridge
ip -n $SW link set br0 up
leg() {  # leg NS IFNAME: a veth from NS to the switch
  ip -n "$1" link add "$2" type veth peer name "s$2" netns $SW
  ip -n $SW link set "s$2" master br0 up
}
for h in A B; do
  ns=${!h}
  leg "$ns" "g$h"      # the guest's RDMA address (same MAC and address on both hosts)
  ip -n "$ns" link set "g$h" address $GMAC
  ip -n "$ns" addr add $GIP/24 dev "g$h"
  ip -n "$ns" link set "g$h" up
  leg "$ns" "u$h"      # the uplink of the bridge carrying the guest's virtio-net
  ip -n "$ns" link add hbr type bridge
  ip -n "$ns" link set "u$h" master hbr up
  ip -n "$ns" tuntap add tap0 mode tap
  ip -n "$ns" link set tap0 master hbr up
  ip -n "$ns" link set hbr up
done
ip -n $B link set gB arp off   # host B stays silent for the guest until the guest runs there
# A host answers ARP for the guest's address only on the guest's interface (not on the bridge
# carrying the guest's virtio-net: Linux would answer there for any local address, arp_ignore=0).
for ns in $A $B; do ip netns exec "$ns" sysctl -qw net.ipv4.conf.all.arp_ignore=1; done
leg $P gP
ip -n $P addr add $PEER/24 dev gP
ip -n $P link set gP up
ip -n $A link add mA type veth peer name mB netns $B
ip -n $A addr add $MA/24 dev mA && ip -n $A link set mA up
ip -n $B addr add $MB/24 dev mB && ip -n $B link set mB up
# A lossy fabric: the switch drops 1% of RoCE packets, both ways, all the time.
ip netns exec $SW nft add table bridge loss
ip netns exec $SW nft add chain bridge loss lossy '{ type filter hook forward priority 0; }'
ip netns exec $SW nft add rule bridge loss lossy udp dport 4791 numgen random mod 100 '<' 1 counter drop

# ---- a backend and a QEMU on a host ----
vrdmad() {  # vrdmad HOST NAME [ARGS...]: starts a vrdmad in HOST's namespace for the guest
  local h=$1 name=$2; shift 2
  local ns=${!h}
  ip netns exec "$ns" "$VRDMAD" --socket "$work/$name.sock" --control "$work/$name.ctl" --engine soft:$GIP \
    --mac $GMAC --announce "g$h" "$@" >"$work/vrdmad-$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [ -S "$work/$name.sock" ] && return 0; sleep 0.05; done
  die "vrdmad $name did not start"
}
qemu() {  # qemu HOST NAME [ARGS...]: the guest's VMM on HOST, with the device on vrdmad NAME
  local h=$1 name=$2; shift 2
  ip netns exec "${!h}" qemu-system-x86_64 -accel tcg -cpu max,la57=off -m 512M -smp 1 -display none -no-reboot \
    -object memory-backend-memfd,id=mem,size=512M,share=on -numa node,memdev=mem \
    -kernel "$KERNEL" -initrd "$INITRD" \
    -append "console=ttyS0 quiet panic=-1 no_timer_check vrdma.ip=$GUEST vrdma.peer=$PEER vrdma.stream=$MSGS" \
    -chardev file,id=con,path="$work/serial-$name.log" -serial chardev:con \
    -chardev socket,id=vr,path="$work/$name.sock" -device vhost-user-blk-pci,chardev=vr,num-queues=4,queue-size=256 \
    -netdev tap,id=n0,ifname=tap0,script=no,downscript=no -device virtio-net-pci,netdev=n0,mac=$NICMAC \
    -monitor unix:"$work/mon-$name.sock",server=on,wait=off "$@" >"$work/qemu-$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [ -S "$work/mon-$name.sock" ] && return 0; sleep 0.05; done
  die "QEMU $name did not start"
}
hmp() {  # hmp NAME COMMAND: one human-monitor command, its output
  timeout 20 python3 - "$work/mon-$1.sock" "$2" <<'PY'
import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(10)
buf = b""
while b"(qemu)" not in buf: buf += s.recv(4096)
s.sendall(sys.argv[2].encode() + b"\n")
buf = b""
while buf.count(b"(qemu)") < 1: buf += s.recv(65536)
print(buf.decode(errors="replace").replace("\r", "").split("\n", 1)[-1].rsplit("(qemu)", 1)[0])
PY
}
ctl() {  # ctl NAME: vrdmad's status
  timeout 5 python3 -c 'import socket,sys
s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b"{\"cmd\":\"status\"}\n")
print(s.makefile().readline().strip())' "$work/$1.ctl" 2>/dev/null || true
}
progress() { cat "$work"/serial-*.log 2>/dev/null | tr -d '\r' | sed -n 's/^VRDMA-STREAM progress \([0-9]*\)/\1/p' | sort -n | tail -1; }
wait_progress() {  # wait_progress N SECONDS
  for _ in $(seq $(($2 * 10))); do
    [ "$(progress || echo 0)" -ge "$1" ] 2>/dev/null && return 0
    grep -q "VRDMA-GUEST-DONE" "$work"/serial-*.log 2>/dev/null && return 1
    sleep 0.1
  done
  return 1
}

migrate() {  # migrate FROM_HOST FROM_NAME TO_HOST TO_NAME TO_IP
  local fh=$1 fn=$2 th=$3 tn=$4 tip=$5 port=$((4440 + RANDOM % 50))
  vrdmad "$th" "$tn" --incoming guest
  qemu "$th" "$tn" -incoming tcp:$tip:$port
  sleep 0.5
  local before t0 t1 st
  before=$(progress)
  t0=$(date +%s%N)
  hmp "$fn" "migrate -d tcp:$tip:$port" >/dev/null
  st=""
  for _ in $(seq 1200); do
    st=$(hmp "$fn" "info migrate" | sed -n 's/^Migration status: //p')
    case "$st" in completed|failed|cancelled) break ;; esac
    sleep 0.1
  done
  t1=$(date +%s%N)
  [ "$st" = completed ] || die "QEMU's migration $fn -> $tn ended '$st'"
  local info
  info=$(hmp "$fn" "info migrate")
  local downtime total
  downtime=$(echo "$info" | sed -n 's/^downtime: \([0-9]*\) ms/\1/p')
  total=$(echo "$info" | sed -n 's/^total time: \([0-9]*\) ms/\1/p')
  # The source VMM quits after the switchover (libvirt does the same): its vrdmad lets go.
  hmp "$fn" "quit" >/dev/null 2>&1 || true
  local src dst
  for _ in $(seq 150); do
    src=$(ctl "$fn")
    echo "$src" | grep -q '"phase":"migrated"' && break
    sleep 0.1
  done
  dst=$(ctl "$tn")
  echo "migrate $fn -> $tn: QEMU total ${total:-?} ms, downtime ${downtime:-?} ms ($(( (t1 - t0) / 1000000 )) ms wall); stream at $before messages"
  echo "$src" | grep -q '"phase":"migrated"' || fail "the source vrdmad $fn did not let go: $src"
  echo "$src" | grep -q '"qp":0' || fail "the source vrdmad $fn still holds QPs: $src"
  grep -q "written into guest memory" "$work/vrdmad-$fn.log" ||
    fail "the source vrdmad $fn did not write the device state into guest memory"
  echo "$dst" | grep -q '"phase":"running"' || fail "the destination vrdmad $tn does not run the guest: $dst"
  echo "$dst" | grep -q '"qp":1' || fail "the destination vrdmad $tn does not hold the guest's QP: $dst"
  grep -o "loaded the device state ([0-9]* bytes) from guest memory in [0-9.]* ms" "$work/vrdmad-$tn.log" | sed 's/^/  /' || true
}

# ---- run ----
T0=$(date +%s)
ip netns exec $P timeout 900 "$STREAM" -d soft:$PEER -n "$MSGS" --limit 800 >"$work/peer.log" 2>&1 &
peer_pid=$!
pids+=($peer_pid)
vrdmad A a1
qemu A a1
wait_progress 1000 240 || die "the guest's stream did not reach 1000 messages"
echo "guest streaming ($(progress) messages after $(( $(date +%s) - T0 )) s)"
migrate A a1 B b1 $MB
p1=$(progress)
wait_progress $((p1 + 1500)) 240 || die "the stream made no progress on host B (at $(progress))"
migrate B b1 A a2 $MA
p2=$(progress)
wait_progress $((p2 + 1500)) 240 || die "the stream made no progress back on host A (at $(progress))"

# ---- the end: both sides checked every message ----
for _ in $(seq 3000); do grep -q "VRDMA-GUEST-DONE" "$work"/serial-a2.log 2>/dev/null && break; sleep 0.1; done
guest_result=$(tr -d '\r' < "$work/serial-a2.log" | grep "^VRDMA-STREAM {" | tail -1 || true)
wait $peer_pid || true
peer_result=$(tail -1 "$work/peer.log")
echo "guest: ${guest_result#VRDMA-STREAM }"
echo "peer:  $peer_result"
echo "$guest_result" | grep -q '"ok":true' || fail "the guest's stream failed"
echo "$peer_result" | grep -q '"ok":true' || fail "the peer's stream failed"
echo "$peer_result" | grep -q "\"received\":$MSGS" || fail "the peer did not receive every message"
dropped=$(ip netns exec $SW nft list chain bridge loss lossy | sed -n 's/.*counter packets \([0-9]*\).*/\1/p')
echo "the switch dropped ${dropped:-?} RoCE packets; whole test $(( $(date +%s) - T0 )) s"
[ "${dropped:-0}" -gt 0 ] || fail "the switch dropped no packets (is the loss rule in place?)"
[ $failed -eq 0 ] || { for f in "$work"/vrdmad-*.log; do echo "--- $f"; tail -8 "$f"; done; exit 1; }
echo "vm migration: ok"
