# Sourced by the QEMU-driven VM migration rigs (vm_migrate_test.sh, memcheck_study.sh): the
# fabric of namespaces, a backend and a QEMU on a host, the monitor, and a move with the guest
# memory check (docs/migration.md "Guest memory after a move").
#
# Namespaces: a switch (bridge), hosts A and B (the guest's RDMA address on an interface with
# the guest's MAC, silent on the host the guest is not on; a bridge for the guest's virtio-net
# tap; a management link A-B for QEMU's migration stream), and the peer.
#
# The caller sets HERE (this folder), calls vm_rig "$@" (below), and sets optionally
#   QEMU         the QEMU binary (default qemu-system-x86_64; debian13.sh qemu gives QEMU 10)
#   DEVICE       vrdma (vhost-user-blk-pci carrier on a vrdmad) or virtio-blk (QEMU's own
#                virtio-blk on a shared disk file: no vhost-user, no vrdma process)
#   BANDWIDTH    the memory copy's limit in MiB/s, 0 for none (default 32, QEMU 7.2's own default)
#   GUEST_ARGS   extra kernel command line words for the guest (its workload)
#   MEMCHECK     fail (default: a page that differs fails the move; when none of them is vrdmad's
#                and vrdmad wrote nothing after the stop, QEMU lost them: the move is abandoned,
#                the source resumes and the move is made again, at most MOVE_TRIES (3) times in
#                all) or record (count, run the destination anyway and go on)
#   MEMCHECK_LOG a file that gets one JSON line per move (configuration, timings, the comparison)
# and calls vm_fabric once. Then vrdmad/qemu/migrate as below; cleanup runs at exit.
# vm_rig ARGS: the rigs' common arguments (VRDMA_PERF VRDMAD PVVERBS_BIND VRDMA_STREAM
# VRDMA_MEMCMP), root and tools checked (exit 77 with the reason), the guest built: sets PERF,
# VRDMAD, BIND, STREAM, MEMCMP, KERNEL and INITRD.
vm_rig() {
  PERF=$(readlink -f "$1"); VRDMAD=$(readlink -f "$2"); BIND=$(readlink -f "$3"); STREAM=$(readlink -f "$4")
  MEMCMP=$(readlink -f "$5")
  rig_require
  command -v nft >/dev/null || skip "nft is not installed (apt-get install nftables)"
  guest_build "$HERE/make_guest.sh" "$PERF" "$BIND" "$STREAM"
}
. "$(dirname "${BASH_SOURCE[0]}")/../serial_lib.sh"  # rig_require, guest_build

SW=vmsw$$ A=vma$$ B=vmb$$ P=vmp$$
GIP=10.78.0.12 GMAC=52:54:00:78:00:0c   # the guest's RDMA identity (vrdmad's engine)
GUEST=10.78.0.2 NICMAC=52:54:00:78:00:02 PEER=10.78.0.3
MA=10.79.0.1 MB=10.79.0.2
QEMU=${QEMU:-qemu-system-x86_64}
DEVICE=${DEVICE:-vrdma}
BANDWIDTH=${BANDWIDTH:-32}
MEMCHECK=${MEMCHECK:-fail}
work=$(mktemp -d)
pids=()
declare -A QEMU_PID VRDMAD_PID
# Every backend records its writes into guest memory (vrdma/vhost/write_journal.hpp).
export VRDMA_WRITE_JOURNAL="$work/journal-%p.bin"
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

vm_fabric() {
  local ns h
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
  # QEMU's own virtio-blk: one disk file both hosts see (shared storage).
  [ "$DEVICE" = vrdma ] || truncate -s 64M "$work/disk.img"
  # VM_CAPTURE=1: the switch's traffic (RoCE headers, ARP) in $work/switch.pcap, for a post mortem.
  if [ -n "${VM_CAPTURE:-}" ]; then
    ip netns exec $SW dumpcap -q -i br0 -s 128 -w "$work/switch.pcap" -f "udp port 4791 or arp" >/dev/null 2>&1 &
    pids+=($!)
  fi
}

vrdmad() {  # vrdmad HOST NAME [ARGS...]: starts a vrdmad in HOST's namespace for the guest
  local h=$1 name=$2; shift 2
  [ "$DEVICE" = vrdma ] || return 0
  local ns=${!h}
  ip netns exec "$ns" "$VRDMAD" --socket "$work/$name.sock" --control "$work/$name.ctl" --engine soft:$GIP \
    --mac $GMAC --announce "g$h" "$@" >"$work/vrdmad-$name.log" 2>&1 &
  pids+=($!)
  VRDMAD_PID[$name]=$!
  for _ in $(seq 100); do [ -S "$work/$name.sock" ] && return 0; sleep 0.05; done
  die "vrdmad $name did not start"
}

# maxcpus=2 with one vCPU: QEMU's TCG drops a guest's memory barriers when the machine can
# have only one vCPU (they order nothing between vCPUs), but the backend shares the guest's
# rings: a driver's "publish the index, fence, read the device's event index" then loses a
# kick now and then, and the queue stalls for good (seen under load: docs/migration.md "Guest
# memory after a move"). With maxcpus=2 TCG keeps the barriers, as KVM always does.
qemu() {  # qemu HOST NAME [ARGS...]: the guest's VMM on HOST, with the device on vrdmad NAME
  local h=$1 name=$2; shift 2
  local dev=(-chardev socket,id=vr,path="$work/$name.sock" -device vhost-user-blk-pci,chardev=vr,num-queues=4,queue-size=256)
  [ "$DEVICE" = vrdma ] || dev=(-drive file="$work/disk.img",if=none,id=d0,format=raw,cache=none -device virtio-blk-pci,drive=d0)
  ip netns exec "${!h}" "$QEMU" -accel tcg -cpu max,la57=off -m 512M -smp 1,maxcpus=2 -display none -no-reboot \
    -object memory-backend-memfd,id=mem,size=512M,share=on -numa node,memdev=mem \
    -kernel "$KERNEL" -initrd "$INITRD" \
    -append "console=ttyS0 loglevel=5 panic=-1 no_timer_check vrdma.ip=$GUEST vrdma.peer=$PEER ${GUEST_ARGS:-}" \
    -chardev file,id=con,path="$work/serial-$name.log" -serial chardev:con "${dev[@]}" \
    -netdev tap,id=n0,ifname=tap0,script=no,downscript=no -device virtio-net-pci,netdev=n0,mac=$NICMAC \
    -monitor unix:"$work/mon-$name.sock",server=on,wait=off "$@" >"$work/qemu-$name.log" 2>&1 &
  pids+=($!)
  QEMU_PID[$name]=$!
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
while buf.count(b"(qemu)") < 1:
    chunk = s.recv(65536)
    if not chunk: break  # QEMU closed the monitor (quit)
    buf += chunk
print(buf.decode(errors="replace").replace("\r", "").split("\n", 1)[-1].rsplit("(qemu)", 1)[0])
PY
}

ctl() {  # ctl NAME: vrdmad's status
  timeout 5 python3 -c 'import socket,sys
s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b"{\"cmd\":\"status\"}\n")
print(s.makefile().readline().strip())' "$work/$1.ctl" 2>/dev/null || true
}

# The guest's progress: vrdma-stream's messages, or the disk loop's rounds.
progress() {
  cat "$work"/serial-*.log 2>/dev/null | tr -d '\r' |
    sed -n 's/^VRDMA-STREAM progress \([0-9]*\)/\1/p; s/^VRDMA-BLK iter \([0-9]*\) ok/\1/p' | sort -n | tail -1
}
wait_progress() {  # wait_progress N SECONDS
  for _ in $(seq $(($2 * 10))); do
    [ "$(progress || echo 0)" -ge "$1" ] 2>/dev/null && return 0
    grep -q "VRDMA-GUEST-DONE" "$work"/serial-*.log 2>/dev/null && return 1
    sleep 0.1
  done
  return 1
}
# A guest kernel that died prints this on its console.
crashed() { grep -l -E "Kernel panic|BUG:|Oops|general protection|stack guard page|list_del corruption" \
  "$work"/serial-*.log 2>/dev/null | xargs -r -n1 basename | tr '\n' ' '; }

# move_once FROM_NAME TO_HOST TO_NAME TO_IP: one move with the memory check (hmp_move.py); sets
# before, mv, check and MOVE_RESULT, and logs to MEMCHECK_LOG.
move_once() {
  local fn=$1 th=$2 tn=$3 tip=$4 port=$((4440 + RANDOM % 50)) limit=$((BANDWIDTH * 1048576)) journals=() anyway=() rc=0
  vrdmad "$th" "$tn" --incoming guest
  # -S: the destination stays paused once the memory is in, so that both sides can be compared.
  qemu "$th" "$tn" -S -incoming tcp:$tip:$port
  sleep 0.5
  before=$(progress)
  [ "$BANDWIDTH" -ne 0 ] || limit=1099511627776
  if [ "$MEMCHECK" = fail ]; then anyway=(--abandon-if-vmm "$work/memcmp.json"); else anyway=(--cont-anyway); fi
  # The source vrdmad's journal tells whose a differing page is.
  [ -n "${VRDMAD_PID[$fn]:-}" ] && [ -f "$work/journal-${VRDMAD_PID[$fn]}.bin" ] &&
    journals=(--journal "$work/journal-${VRDMAD_PID[$fn]}.bin")
  rm -f "$work/memcmp.json"
  local check_cmd=("$MEMCMP" "pid:${QEMU_PID[$fn]}" "pid:${QEMU_PID[$tn]}" "${journals[@]}" --report "$work/memcmp.json")
  injected=0
  if [ -n "${VM_MEMCHECK_LOSE_ONCE:-}" ]; then
    # Rehearses the retry: the first destination "loses" 8 bytes of a page at 255 MiB, as QEMU
    # 7.2 sometimes does, after the memory came in and before the comparison.
    VM_MEMCHECK_LOSE_ONCE= injected=1
    check_cmd=(bash -c 'f=$(ls -l /proc/$1/fd | sed -n "s/.* \([0-9]*\) -> \/memfd:memory-backend-memfd.*/\1/p");
      printf LOSTPAGE | dd of=/proc/$1/fd/$f bs=1 seek=$((255 << 20)) conv=notrunc status=none; shift; exec "$@"' \
      _ "${QEMU_PID[$tn]}" "${check_cmd[@]}")
  fi
  mv=$(python3 "$HERE/hmp_move.py" "${anyway[@]}" "$work/mon-$fn.sock" "$work/mon-$tn.sock" "tcp:$tip:$port" "$limit" -- \
       "${check_cmd[@]}" 2>"$work/memcmp.txt") || rc=$?
  sed "s/^/  $fn -> $tn: /" "$work/memcmp.txt"
  [ $rc -eq 0 ] || die "QEMU's migration $fn -> $tn did not complete: $mv"
  check=$(json_field "$mv" check_status)
  [ "$check" -le 1 ] && [ -s "$work/memcmp.json" ] || die "the memory comparison of $fn -> $tn could not run (status $check)"
  MOVE_RESULT=$(cat "$work/memcmp.json")
  if [ -n "${MEMCHECK_LOG:-}" ]; then
    printf '{"qemu":"%s","device":"%s","bandwidth":%s,"move":"%s->%s","progress":%s,"move_figures":%s,"memcmp":%s}\n' \
      "$("$QEMU" --version | head -1 | sed 's/.*version \([0-9.]*\).*/\1/')" "$DEVICE" "$BANDWIDTH" "$fn" "$tn" \
      "${before:-0}" "$mv" "$MOVE_RESULT" >> "$MEMCHECK_LOG"
  fi
}

MOVE_RESULT=""  # the last move's comparison, as a JSON object
MOVED_TO=""     # the name the guest runs under after the last move (a retried move adds -rN)
QEMU_LOST=0     # moves made again because QEMU lost pages
LOST_ON_PURPOSE=0  # moves made again after VM_MEMCHECK_LOSE_ONCE
json_field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
migrate() {  # migrate FROM_HOST FROM_NAME TO_HOST TO_NAME TO_IP
  local fh=$1 fn=$2 th=$3 tn=$4 tip=$5 try name before check mv rc injected
  for ((try = 1; ; try++)); do
    name=$tn; [ $try -eq 1 ] || name=$tn-r$((try - 1))
    move_once "$fn" "$th" "$name" "$tip"
    [ "$check" -ne 0 ] || break
    if [ "$MEMCHECK" != fail ]; then break; fi
    # hmp_move.py already let the source run on when QEMU alone lost the pages.
    if [ "$(json_field "$mv" abandoned)" != True ] || [ "$try" -ge "${MOVE_TRIES:-3}" ]; then
      die "after the move $fn -> $name the destination's guest memory differs from the source's (above)"
    fi
    if [ "$injected" -eq 1 ]; then
      LOST_ON_PURPOSE=$((LOST_ON_PURPOSE + 1))
      echo "The destination's memory was changed on purpose (VM_MEMCHECK_LOSE_ONCE): the destination was dropped, the guest runs on at the source, and the move is made again"
    else
      QEMU_LOST=$((QEMU_LOST + 1))
      echo "QEMU lost $(json_field "$MOVE_RESULT" differing) pages of guest memory in the move $fn -> $name, none of them written by vrdmad: the destination was dropped, the guest runs on at the source, and the move is made again"
    fi
    [ -z "${VRDMAD_PID[$name]:-}" ] || kill "${VRDMAD_PID[$name]}" 2>/dev/null || true
    # The next destination needs the host's tap: the dropped QEMU must be gone first.
    for _ in $(seq 100); do kill -0 "${QEMU_PID[$name]}" 2>/dev/null || break; sleep 0.1; done
    kill -9 "${QEMU_PID[$name]}" 2>/dev/null || true
    before=$(progress)
    wait_progress $((before + 200)) 120 || die "the guest made no progress at the source $fn after the abandoned move"
  done
  MOVED_TO=$name
  tn=$name
  # The source VMM quits after the switchover (libvirt does the same): its vrdmad lets go.
  hmp "$fn" "quit" >/dev/null 2>&1 || true
  echo "migrate $fn -> $tn at progress $before: $mv"
  [ "$DEVICE" = vrdma ] || return 0
  local src dst
  for _ in $(seq 150); do
    src=$(ctl "$fn")
    echo "$src" | grep -q '"phase":"migrated"' && break
    sleep 0.1
  done
  dst=$(ctl "$tn")
  echo "$src" | grep -q '"phase":"migrated"' || fail "the source vrdmad $fn did not let go: $src"
  echo "$src" | grep -q '"qp":0' || fail "the source vrdmad $fn still holds QPs: $src"
  grep -q "written into guest memory" "$work/vrdmad-$fn.log" ||
    fail "the source vrdmad $fn did not write the device state into guest memory"
  for _ in $(seq 50); do echo "$dst" | grep -q '"phase":"running"' && break; sleep 0.1; dst=$(ctl "$tn"); done
  echo "$dst" | grep -q '"phase":"running"' || fail "the destination vrdmad $tn does not run the guest: $dst"
  echo "$dst" | grep -q '"qp":1' || fail "the destination vrdmad $tn does not hold the guest's QP: $dst"
  grep -o "loaded the device state ([0-9]* bytes) from guest memory in [0-9.]* ms" "$work/vrdmad-$tn.log" | sed 's/^/  /' || true
}
