#!/usr/bin/env bash
# The guest kernel driver and the rdma-core provider over a vrdmad whose engine is a verbs
# device (issue 25). This host has no RDMA device; Linux rxe stands in for the hypervisor's NIC,
# so the "hypervisor" is the reference-peer guest and the kernel-driver guest runs nested in it,
# QEMU TCG inside QEMU TCG (about 25 times slower than one level: ~150 s to boot):
#   this host        one vrdma-perf per case on our soft engine, each on its own address
#                    (10.77.0.11 + i) on the rig's bridge, serving case i's unmodified tool
#                    (--peer-format pingpong or perftest) on TCP port 18600 + i
#   the rxe guest    tests/conformance/rxe/make_guest.sh's (Debian's kernel, rdma_rxe as rxe0 on
#                    eth0 at 10.77.0.2), with ours on top (a second cpio): vrdmad --engine
#                    verbs:rxe0 serving the device, and this host's QEMU 7.2 (its TCG module and
#                    firmware) running
#   the vrdma guest  kmod_lib.sh's kernel-driver guest: virtio_rdma.ko from its DKMS package, the
#                    provider, Debian's ibverbs-utils and perftest. Its device's address is
#                    rxe0's (10.77.0.2, vrdma.ip): the GID the guest sends from is the NIC's.
#                    Its NIC is QEMU's user network, which carries only the tools' own TCP
#                    exchange (to 10.77.0.1, through the rxe guest's sockets); the RDMA traffic
#                    goes vrdma0 -> vrdmad -> rxe0 -> the bridge -> our soft engine.
# The vrdma guest runs the cases itself (kmod_guest_init.sh vrdma.cases=), one after another, as
# the unprivileged user vrdma. Checked: each tool exits 0 with its result line (pingpong: the
# bytes it checked); vrdma-perf on the host verified every echoed byte (pingpong) or counted the
# packets the messages take (perftest, kmod_lib.sh pt_moved); vrdmad made the guest's objects on
# rxe0 (its counters), and rxe0 counted the packets.
# Not in CI (~8 minutes, nested TCG); label matrix:
#   ctest --test-dir build -R vm_kmod_verbs_test
#   kmod_verbs_test.sh SOURCE_DIR VRDMAD VRDMA-PERF   exits 77 (skip) without root, QEMU, the
#   guests' parts or the tools; KEEP_WORK=1 keeps the logs; KMOD_VERBS_CASES=... replaces the
#   cases (TOOL/SIZE/ITERS,...).
set -uo pipefail
[ "$#" = 3 ] || { echo "usage: $0 SOURCE_DIR VRDMAD VRDMA-PERF" >&2; exit 2; }
SRC=$(readlink -f "$1") VRDMAD=$(readlink -f "$2") PERF=$(readlink -f "$3")
HERE=$SRC/tests/conformance/rxe
. "$SRC/tests/conformance/serial_lib.sh"  # skip, rig_require, guest_build, wait_serial
. "$SRC/tests/conformance/vm/kmod_lib.sh"  # kmod_guest, pt_moved
. "$SRC/tests/conformance/vm/nested_lib.sh"  # nested_build, nested_qemu
rig_require
T0=$(date +%s)
work=$(mktemp -d)
NS=vkvb$$
HOST=10.77.0.1 GUEST=10.77.0.2 GUEST_MAC=52:54:00:77:00:02
GUEST_MEM_MB=3072  # the nested guest's 768 MiB, QEMU, and the initramfs with both guests' parts
perf_pids=""
. "$HERE/peer_rig.sh"
cleanup() {
  for p in $perf_pids; do kill "$p" 2>/dev/null; done
  rig_cleanup
  if [ -n "${KEEP_WORK:-}" ]; then echo "work dir kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# The cases: TOOL/SIZE/ITERS (kmod_guest_init.sh), case i against vrdma-perf at 10.77.0.(11+i).
CASES=${KMOD_VERBS_CASES:-"ibv_rc_pingpong/4096/100,ibv_srq_pingpong/4096/100,ibv_ud_pingpong/1024/100,ib_write_bw/65536/100,ib_read_bw/65536/50,ib_send_bw/4096/100,ib_atomic_bw/8/100,ib_send_lat/64/100"}
MTU=1024
# vrdma-perf's arguments for a case (its peer format and test).
perf_args() {  # TOOL SIZE ITERS
  case $1 in
    ibv_rc_pingpong) echo "--peer-format pingpong --size $2 --iters $3 --mtu $MTU" ;;
    ibv_srq_pingpong) echo "--peer-format pingpong --srq --size $2 --iters $3 --mtu $MTU" ;;
    ibv_ud_pingpong) echo "--peer-format pingpong --connection UD --size $2 --iters $3 --mtu $MTU" ;;
    ib_*) local t=${1#ib_}; echo "--peer-format perftest --test $t --size $2 --mtu $MTU" ;;
  esac
}
tools=""
for c in ${CASES//,/ }; do tools="$tools ${c%%/*}"; done
tools=$(echo "$tools" | tr ' ' '\n' | sort -u | tr '\n' ' ')

# ---- The guests: the rxe guest (cached), and the kernel-driver guest packed into it --------
nested_build "$tools"

after_boot() { :; }
rig_net
n=0
for c in ${CASES//,/ }; do n=$((n + 1)); ip -n "$NS" addr add "10.77.0.$((11 + n))/24" dev br0; done
guest_boot || exit 1
echo "rxe guest ready after $(($(date +%s) - T0)) s"

# ---- The host's peers: one vrdma-perf per case, all serving at once --------------------------
n=0
for c in ${CASES//,/ }; do
  n=$((n + 1))
  IFS=/ read -r tool size iters <<< "$c"
  # shellcheck disable=SC2046
  timeout 1500 ip netns exec "$NS" "$PERF" --device "soft:10.77.0.$((11 + n))" --port $((18600 + n)) \
    $(perf_args "$tool" "$size" "$iters") >"$work/perf.$n.log" 2>&1 &
  perf_pids="$perf_pids $!"
done
for _ in $(seq 100); do
  [ "$(ip netns exec "$NS" ss -ltn 2>/dev/null | grep -c ':186[0-9][0-9] ')" -ge "$n" ] && break
  sleep 0.1
done

# ---- The vrdma guest, nested: vrdmad on rxe0, QEMU on its socket ----------------------------
peers=$(seq -s+ -f "10.77.0.%g" 12 $((11 + n)))
append="console=ttyS0 quiet panic=-1 no_timer_check vrdma.ip=$GUEST vrdma.tcp=10.0.2.15/24 vrdma.tcp_via=10.0.2.2"
append+=" vrdma.peer=$HOST vrdma.rdma_peer=$peers vrdma.rdma_mac=52:54:00:77:00:01 vrdma.timeout=300 vrdma.mtu=$MTU vrdma.cases=$CASES"
guest_start "rm -f /tmp/k.sock /tmp/k.ctl; VRDMA_LOG=info /opt/vrdma/vrdmad --socket /tmp/k.sock --engine verbs:rxe0 --control /tmp/k.ctl 2>/tmp/vrdmad.log & V=\$!;" \
  "i=0; while [ ! -S /tmp/k.sock ] && [ \$i -lt 100 ]; do sleep 0.1; i=\$((i+1)); done;" \
  "S0=\$(cat /sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts) R0=\$(cat /sys/class/infiniband/rxe0/ports/1/hw_counters/rcvd_pkts);" \
  "timeout 1300 $(nested_qemu 768) -append '$append' -serial file:/tmp/kcon.log -chardev socket,id=vr,path=/tmp/k.sock,reconnect=1 > /tmp/kqemu.log 2>&1;" \
  "echo qemu-rc=\$?; echo COUNTERS \$((\$(cat /sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts) - S0)) \$((\$(cat /sys/class/infiniband/rxe0/ports/1/hw_counters/rcvd_pkts) - R0));" \
  "kill \$V; wait \$V; echo vrdmad-rc=\$?; tr -d '\\r' < /tmp/kcon.log | grep -a -E '^VRDMA-|^guest:|rc=|bytes in|iters in|^ *[0-9]+ +[0-9]+ ' | cut -c1-300; cat /tmp/kqemu.log; echo '--- vrdmad:'; grep -v 'vhost-user\\|vring' /tmp/vrdmad.log | tail -40"
guest_wait "$work/nested.out" 1400 || true
echo "the nested guest ended after $(($(date +%s) - T0)) s"
for p in $perf_pids; do wait "$p" 2>/dev/null; done
perf_pids=""

# ---- Verdicts ----------------------------------------------------------------------------------
passed=0 failed=0
check() {  # NAME COMMAND...
  if "${@:2}"; then echo "PASS $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi
}
sed 's/^/  /' "$work/nested.out" | grep -v "^  ===" | head -150
check "the vrdma guest booted nested in the rxe guest and ran its cases (vrdma0's port ACTIVE on the device's address $GUEST)" \
  bash -c "grep -q '^VRDMA-PORT .*ACTIVE' '$work/nested.out' && grep -q '^VRDMA-GUEST-DONE' '$work/nested.out'"
pp_verified() {  # HOSTLOG ITERS: vrdma-perf checked every byte of ITERS exchanges
  python3 - "$@" <<'PY'
import json, sys
lines = [l for l in open(sys.argv[1]) if l.lstrip().startswith("{")]
if not lines: sys.exit(1)
j = json.loads(lines[-1])
sys.exit(0 if j.get("verified") is True and j.get("ops", 0) >= int(sys.argv[2]) else 1)
PY
}
export -f pt_moved pp_verified  # for check's bash -c
n=0
for c in ${CASES//,/ }; do
  n=$((n + 1))
  IFS=/ read -r tool size iters <<< "$c"
  line=$(grep -a "^VRDMA-CASE $n " "$work/nested.out" || true)
  sed 's/^/  host: /' "$work/perf.$n.log" | tail -3 | cut -c1-400
  case $tool in
    ibv_*_pingpong)
      bytes=$((2 * size * iters))
      check "$tool -s $size -n $iters (uid 1000, vrdma0 over vrdmad on verbs:rxe0) against vrdma-perf: $bytes bytes, every one checked on both sides" \
        bash -c "echo '$line' | grep -q 'rc=0 $bytes bytes in' && pp_verified '$work/perf.$n.log' $iters" ;;
    *)
      t=${tool#ib_}
      [ "$t" = atomic_bw ] || [ "$t" = read_bw ] || [ "$t" = write_bw ] || [ "$t" = send_bw ] || [ "$t" = send_lat ] || continue
      check "$tool -s $size -n $iters -m $MTU (uid 1000, vrdma0 over vrdmad on verbs:rxe0) against vrdma-perf: both exit 0, the data moved" \
        bash -c "echo '$line' | grep -qE 'rc=0 +$size +$iters ' && pt_moved server $t $iters $size '$work/perf.$n.log' $MTU" ;;
  esac
done
# vrdmad served the device on rxe0 and rxe0 carried the packets.
cnt=$(sed -n 's/^COUNTERS //p' "$work/nested.out")
check "rxe0 carried the cases' packets (sent, received: ${cnt:-none}) and vrdmad exited cleanly" \
  bash -c "[ -n '$cnt' ] && [ \$(echo '$cnt' | cut -d' ' -f1) -gt 1000 ] && [ \$(echo '$cnt' | cut -d' ' -f2) -gt 1000 ] && grep -q '^vrdmad-rc=0' '$work/nested.out'"
echo QUIT >&3
echo "kernel driver over a verbs engine (nested): $passed passed, $failed failed, $(($(date +%s) - T0)) s"
[ $failed -eq 0 ] && [ $passed -gt 0 ]
