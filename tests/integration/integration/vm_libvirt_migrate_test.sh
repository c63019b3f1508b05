#!/usr/bin/env bash
# The end-to-end flow operators use (issue 9): a TCG guest with the virtio RDMA device (attached
# by `vrdmactl domain attach`, backends started by the libvirt hook) streams checked RDMA
# traffic (vrdma-stream over pv:pci) to a soft-engine peer while it moves
#   host a -> host b   with plain `virsh migrate --live --p2p`
#   host b -> host a   with `vrdmactl migrate` (progress and the JOB_COMPLETED figures)
#   host a -> host b   again, with b's vrdmad killed (SIGKILL) during the memory copy: its
#                      supervisor starts it again, QEMU reconnects, the new backend takes the
#                      state from guest memory, and the stream carries on
# between two real libvirt instances (two_hosts.sh). The destination's hook starts vrdmad with
# --incoming guest; nobody tells the source anything: the device state travels in the guest's
# memory. At the end both sides must have every message once, in order, with the right bytes.
# Every move leaves the domain paused on the destination (--suspend) until its guest RAM has been
# compared with the source's (memcheck_lib.sh); a page that differs fails the test.
# Usage: vm_libvirt_migrate_test.sh VRDMACTL VRDMAD VRDMA_PERF PVVERBS_BIND VRDMA_STREAM VRDMA_MEMCMP
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../../.." && pwd)
[ "$#" = 6 ] || { echo "usage: $0 VRDMACTL VRDMAD VRDMA_PERF PVVERBS_BIND VRDMA_STREAM VRDMA_MEMCMP" >&2; exit 2; }
export VRDMACTL=$(readlink -f "$1") VRDMAD=$(readlink -f "$2") PERF=$(readlink -f "$3") BIND=$(readlink -f "$4") STREAM=$(readlink -f "$5")
export MEMCMP=$(readlink -f "$6") HERE
skip() { echo "vm_libvirt_migrate: SKIP: $*" >&2; exit 77; }
. "$SRC/tests/conformance/serial_lib.sh"  # rig_tools, guest_build
rig_tools libvirtd virsh qemu-system-x86_64 nft
guest_build "$SRC/tests/conformance/vm/make_guest.sh" "$PERF" "$BIND" "$STREAM"
export KERNEL INITRD

export W=$(mktemp -d /tmp/lv6vm.XXXXXX)
export SWNS=lv6sw$$ PNS=lv6p$$
. "$HERE/fabric_lib.sh"  # fabric_cleanup
cleanup() {
  fabric_cleanup
  [ -n "${KEEP_WORK:-}" ] && echo "kept $W" || rm -rf "$W"
}
trap cleanup EXIT
. "$HERE/vm_domain.sh"
vm_hook VRDMA_WRITE_JOURNAL=$W/journal-%p.bin VRDMA_VRDMAD=$VRDMAD
export -f vm_domain_xml
export LV_PREFIX=lv6 LV_NET=10.98.6

inner() {
  set -u
  . "$HERE/memcheck_lib.sh"
  . "$HERE/fabric_lib.sh"
  . "$HERE/../../conformance/serial_lib.sh"  # stream_verdict
  GIP=10.88.6.12 GMAC=52:54:00:88:06:0c GUEST=10.88.6.2 NICMAC=52:54:00:88:06:02 PEER=10.88.6.3
  MSGS=${VM_MIGRATE_MESSAGES:-1000000}
  fail() {
    echo "FAIL: $*" >&2
    echo "--- hook log"; cat "$W/hook.log" 2>/dev/null
    echo "--- console"; tr -d '\r' < "$W/console.log" 2>/dev/null | grep -v "progress" | tail -15
    for f in "$W"/*.sock.log; do echo "--- $f"; grep -v "ring .* stopped" "$f" | tail -12; done
    for h in a b; do d=LV_${h^^}_DIR; echo "--- qemu log on $h"; tail -8 "${!d}/var/log/libvirt/qemu/lv6g1.log" 2>/dev/null; done
    echo "--- peer"; cat "$W/peer.log"
    ip netns pids $PNS 2>/dev/null | xargs -r kill 2>/dev/null
    exit 1
  } >&2
  # The fabric: a switch, the two libvirt hosts and the peer (fabric_lib.sh), 1 % RoCE loss.
  guest_fabric || fail "cannot build the fabric"

  # The peer ends the stream 1000 messages after end-stream appears (after the last move); MSGS
  # only bounds it.
  ip netns exec $PNS timeout 900 "$STREAM" -d soft:$PEER -n "$MSGS" --limit 800 --end-file "$W/end-stream" > "$W/peer.log" 2>&1 &
  peer_pid=$!

  vm_domain_xml lv6g1 512 "vrdma.ip=$GUEST vrdma.peer=$PEER vrdma.stream=$MSGS" "$NICMAC" vmtap0 "$W/console.log" > "$W/base.xml"
  "$VRDMACTL" domain attach --xml "$W/base.xml" --socket "$W/g6.sock" --engine soft:$GIP --mac $GMAC --announce vg \
    > "$W/dom.xml" || fail "vrdmactl domain attach failed"
  A="virsh -q -c $LV_A_URI" B="virsh -q -c $LV_B_URI"
  $A create "$W/dom.xml" > /dev/null || fail "virsh create on host a failed"
  progress() { tr -d '\r' < "$W/console.log" 2>/dev/null | sed -n 's/^VRDMA-STREAM progress \([0-9]*\)/\1/p' | tail -1; }
  wait_progress() {  # N SECONDS
    for _ in $(seq $(($2 * 10))); do
      [ "$(progress)" -ge "$1" ] 2>/dev/null && return 0
      grep -q "VRDMA-GUEST-DONE" "$W/console.log" 2>/dev/null && return 1
      sleep 0.1
    done
    return 1
  }
  wait_progress 1000 240 || fail "the guest's stream did not reach 1000 messages on host a"
  echo "guest streaming on host a ($(progress) messages)"

  # 1. a -> b, plain virsh: nothing but the hook knows about vrdma.
  p0=$(progress); t0=$(date +%s%N)
  virsh_move_a_to_b lv6g1 "$W/g6.sock.pid"  # sets t1
  dt=$($B domjobinfo --completed lv6g1 2>/dev/null | awk '/^Total downtime:/ {print $3}')
  echo "virsh migrate a -> b: $(( (t1 - t0) / 1000000 )) ms wall, downtime ${dt:-?} ms, stream at $p0 messages"
  grep -q "lv6-b lv6g1 migrate begin: started vrdmad --incoming on $W/lv6g1.lv6-b.sock" "$W/hook.log" ||
    fail "the hook on host b did not start vrdmad --incoming"
  wait_progress $((p0 + 1500)) 240 || fail "the stream made no progress on host b (at $(progress))"
  grep -q "from guest memory in" "$W/lv6g1.lv6-b.sock.log" ||
    fail "vrdmad on host b did not load the state from guest memory"
  grep -q "written into guest memory" "$W/g6.sock.log" || fail "vrdmad on host a wrote no state into guest memory"

  # 2. b -> a, vrdmactl migrate (progress and figures).
  p1=$(progress)
  vrdmactl_move_b_to_a lv6g1 "$W/lv6g1.lv6-b.sock.pid"
  echo "stream at $p1 messages when it left host b"
  wait_progress $((p1 + 1500)) 240 || fail "the stream made no progress back on host a (at $(progress))"

  # 3. a -> b with the destination's backend killed during the memory copy. The hook runs vrdmad
  # under its own supervisor (--supervise); the one serving is the supervisor's child.
  p2=$(progress)
  stops=$(grep -c "written into guest memory" "$W/lv6g1.lv6-a.sock.log")
  mem_hold "$LV_A_DIR" lv6g1 "$W/lv6g1.lv6-a.sock.pid" || fail "cannot hold the source's guest memory"
  ( $A migrate --live --p2p --suspend --bandwidth 32 lv6g1 "$LV_B_TCP" --migrateuri "tcp://$LV_B_IP" > "$W/m3.out" 2>&1
    echo "rc=$?" >> "$W/m3.out" ) &
  mpid=$!
  sup= worker=
  for _ in $(seq 200); do
    sup=$(cat "$W/lv6g1.lv6-b.sock.pid" 2>/dev/null) && worker=$(pgrep -P "$sup" 2>/dev/null | head -1)
    [ -n "$worker" ] && break
    sleep 0.05
  done
  [ -n "$worker" ] || fail "no supervised vrdmad on host b (pid file: ${sup:-none})"
  sleep 2
  [ "$(grep -c "written into guest memory" "$W/lv6g1.lv6-a.sock.log")" = "$stops" ] ||
    fail "the switchover came before the kill (the memory copy took less than 2 s)"
  kill -9 "$worker"
  t2=$(date +%s%N)
  echo "killed vrdmad $worker on host b during the memory copy (its supervisor is $sup)"
  wait $mpid
  grep -q "rc=0" "$W/m3.out" || fail "virsh migrate a -> b with the backend killed failed: $(cat "$W/m3.out")"
  mem_check_or_rerun "$LV_B_DIR" lv6g1 "a -> b (backend killed)"
  [ "$($B domstate lv6g1 2>/dev/null)" = running ] || fail "the guest does not run on host b after the second move"
  grep -q "the backend $worker was killed by signal 9 (SIGKILL); starting it again" "$W/lv6g1.lv6-b.sock.log" ||
    fail "the supervisor on host b did not start vrdmad again"
  wait_progress $((p2 + 1500)) 240 || fail "the stream made no progress on host b after its backend was killed"
  touch "$W/end-stream"
  grep -q "from guest memory in" <(sed -n '/starting it again/,$p' "$W/lv6g1.lv6-b.sock.log") ||
    fail "the restarted vrdmad on host b did not load the state from guest memory"
  echo "virsh migrate a -> b with b's backend killed: $(( ($(date +%s%N) - t2) / 1000000 )) ms from the kill to $((p2 + 1500)) messages"

  # 4. The end: both sides checked every message.
  stream_verdict "$W/console.log" "$W/peer.log" "$peer_pid" $((p2 + 1500))
  echo "the switch dropped $(fabric_dropped) RoCE packets"
  for _ in $(seq 100); do [ -z "$($A list --name)" ] && break; sleep 0.1; done
  echo "hook calls:"; sed 's/^/  /' "$W/hook.log"
}
export -f inner
. "$HERE/memcheck_lib.sh"
memcheck_scenario "$SRC/tests/integration/integration/two_hosts.sh" bash -c inner
