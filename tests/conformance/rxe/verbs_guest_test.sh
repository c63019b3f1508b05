#!/usr/bin/env bash
# Our `verbs` provider against real rdma-core devices: the reference-peer guest (make_guest.sh:
# Debian's kernel with rdma_rxe and siw, rdma-core) gets our own binaries on top (a second cpio
# appended to its initramfs: the provider conformance suite and vrdma-perf with every library
# they load), boots on a bridge in a network namespace, and runs
#   1. the provider conformance suite over verbs:rxe0 (A and B on the same device: rxe loops
#      back to its own GID),
#   2. the same over verbs:siw0 (iWARP: RC only, connections through librdmacm), when the
#      guest has siw; rxe0 is removed first so the connection manager binds to siw0,
#   3. vrdma-perf over verbs:rxe0 in the guest against vrdma-perf on our soft engine on the host
#      side of the bridge: every test with --verify, the guest as client and as server,
#   4. the virtio RDMA device on a NIC: vrdmad --engine verbs:rxe0 in the guest (rxe stands in
#      for the host's NIC or VF), the provider conformance suite over pv through two of them,
#      and vrdma-perf over pv (libpvverbs -> vrdmad -> rxe0) against the soft engine on the host,
#   5. moving that device between vrdmad processes on rxe0 (nic_migration_test: QPs drained,
#      stopped and re-created, the guest's QPNs and keys kept by translation; a peer outside
#      the guest sees its retries run out).
# Every guest command runs under `timeout`, every host command too.
#   verbs_guest_test.sh PROVIDER_SUITE VRDMA_PERF VRDMAD NIC_MIGRATION_TEST
#     exits 77 when root, QEMU or the guest is missing
#   ONLY=<regex> runs only the matching parts (suite_rxe, suite_siw, perf_<test>_<role>,
#   suite_pv_rxe, pv_perf_<test>_<role>, nic_migration);
#   KEEP_WORK=1 keeps the logs; SUITE_ARGS="--run_test=..." narrows the suite.
set -euo pipefail
SUITE=$(readlink -f "$1")
PERF=$(readlink -f "$2")
VRDMAD=$(readlink -f "$3")
NICMIG=$(readlink -f "$4")
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../serial_lib.sh"  # skip, rig_start, wait_serial, vm_rig_cleanup
rig_start "$HERE/make_guest.sh"

T0=$(date +%s)
NS=hvb-$$
HOST=10.92.0.1 GUEST=10.92.0.2 GUEST_MAC=52:54:00:92:00:02
# Part 5 runs 27 vrdmads at once (about 90 MB each with ASan): the guest gets 3 GiB.
GUEST_MEM_MB=${GUEST_MEM_MB:-3072}
work=$(mktemp -d)
. "$HERE/peer_rig.sh"
cleanup() {
  rig_cleanup
  if [ -n "${KEEP_WORK:-}" ]; then echo "work dir kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT  # ctest's timeout: clean up on the way out
want() { [[ -z "${ONLY:-}" || "$1" =~ $ONLY ]]; }

# Our binaries for the guest, with every library ldd lists, as a second cpio: the kernel
# unpacks concatenated archives in order, so the base guest stays as make_guest.sh built it.
ov="$work/overlay"
mkdir -p "$ov/opt/vrdma"
# GUEST_TOOLS="strace ..." adds host tools for diagnosis.
EXTRA=$(for t in ${GUEST_TOOLS:-}; do command -v "$t"; done)
for b in "$SUITE" "$PERF" "$VRDMAD" "$NICMIG" $EXTRA; do strip --strip-debug -o "$ov/opt/vrdma/$(basename "$b")" "$b"; done
for f in $(for b in "$SUITE" "$PERF" "$VRDMAD" "$NICMIG" $EXTRA; do ldd "$b" | awk '/=>/ {print $3} /^\t\/lib/ {print $1}'; done | sort -u); do
  [ -e "$f" ] || continue
  mkdir -p "$ov/$(dirname "$f")"
  cp -L "$f" "$ov/$f"
done
(cd "$ov" && find . | cpio -o -H newc --quiet | gzip -1) > "$work/overlay.cpio.gz"
cat "$INITRD" "$work/overlay.cpio.gz" > "$work/initrd"

GUEST_INITRD="$work/initrd"
SIW_ALONE=0
# The guest's address in our subnet (guest_init.sh gives it the rig's default); rxe's GID table
# follows the interface's addresses. In the siw part rxe0 is gone (see there).
after_boot() {
  guest_run "$work/addr.guest" 20 "ip addr flush dev eth0 && ip addr add $GUEST/24 dev eth0 && sleep 1 && rdma link show" ||
    { echo "FAIL: cannot move the guest to $GUEST"; cat "$work/addr.guest"; return 1; }
  [ $SIW_ALONE -eq 0 ] || guest_run "$work/rxe_del.guest" 20 "rdma link delete rxe0 && rdma link show" || true
}
rig_net
guest_boot || exit 1
echo "guest ready after $(($(date +%s) - T0)) s: $(grep "VRDMA-GUEST-READY" "$work/serial.log" | tr -d '\r')"
HAVE_SIW=0
grep "VRDMA-GUEST-READY" "$work/serial.log" | grep -q "link siw0/1 state ACTIVE" && HAVE_SIW=1

# GUEST_DEBUG="<command>" runs a command in the guest first and prints its output (diagnosis).
if [ -n "${GUEST_DEBUG:-}" ]; then guest_run "$work/debug.guest" 60 "timeout 60 sh -c '$GUEST_DEBUG'" || true; cat "$work/debug.guest"; fi

passed=0 failed=0
declare -a summary
record() {  # name, ok(0/1), logs...
  local name=$1 ok=$2; shift 2
  if [ "$ok" -eq 0 ]; then
    passed=$((passed + 1)); summary+=("ok   $name")
  elif rig_should_retry "$name"; then
    return 0
  else
    failed=$((failed + 1)); summary+=("FAIL $name")
    echo "FAIL $name"
    local f
    for f in "$@"; do echo "--- $(basename "$f"):"; tail -80 "$f" 2>/dev/null || true; done
  fi
}

# ---- 1, 2: the provider conformance suite inside the guest ----------------------------------
SUITE_TIMEOUT=${SUITE_TIMEOUT:-240}  # the suite takes 3-30 s in the guest
run_suite() {  # name, device
  local name=$1 dev=$2 ok=1 f="$work/$1.guest"
  want "$name" || return 0
  local t=$(date +%s)
  if guest_run "$f" "$SUITE_TIMEOUT" "VRDMA_SUITE_DEVICES=$dev timeout $SUITE_TIMEOUT /opt/vrdma/provider_suite" \
     "--log_level=message --report_level=short --color_output=no ${SUITE_ARGS:-}"; then ok=0; fi
  echo "$name ($dev, $(($(date +%s) - t)) s):"
  grep -E "SKIP|Leaving test case|failed|passed|error" "$f" | sed 's/^/  /' | head -60 || true
  record "$name" $ok "$f"
}
run_case run_suite suite_rxe verbs:rxe0

# ---- 3: vrdma-perf, guest (verbs:rxe0) against host (soft engine) ---------------------------
# vrdmad_up NAME...: one vrdmad per name on rxe0 (socket /tmp/NAME.sock, log /tmp/NAME.log),
# waiting for its control socket; vrdmad_logs NAME... prints the logs' ends (after vrdmad_down:
# with each vrdmad's exit line, its counters).
# VRDMAD_ARGS (in the guest) adds options, e.g. --incoming guest for a migration destination.
VRDMAD_UP='vrdmad_up() { for n in "$@"; do rm -f /tmp/$n.sock /tmp/$n.ctl; timeout 200 /opt/vrdma/vrdmad --socket /tmp/$n.sock --engine verbs:rxe0 --control /tmp/$n.ctl $VRDMAD_ARGS 2>/tmp/$n.log & PIDS="$PIDS $!"; done; for n in "$@"; do i=0; while [ ! -S /tmp/$n.ctl ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; done; }; vrdmad_logs() { for n in "$@"; do echo "--- vrdmad $n:"; grep -v "vhost-user\|vring" /tmp/$n.log | tail -40; done; }; vrdmad_down() { kill $PIDS 2>/dev/null; wait 2>/dev/null; }'
# Local ACK timeout 0.5 s (4.096 us x 2^17), as in rxe_test.sh: rxe under TCG is slow.
PERF_ARGS="--verify --json --qp-timeout 17"
perf_args() {  # test -> size and iterations
  case $1 in
    *_lat) echo "--size 64 --iters 200" ;;
    atomic_bw) echo "--size 8 --iters 2000" ;;
    *) echo "--size 65536 --iters 200" ;;
  esac
}
perf_ok() { grep -q '"verified":true' "$1" || grep -q '"lat_us"' "$1"; }
# The guest's vrdma-perf command: straight on rxe0, or (pv) through a vrdmad on it (part 4).
guest_perf() {  # mode, vrdma-perf args
  if [ "$1" = pv ]; then
    echo "$VRDMAD_UP; vrdmad_up g; timeout 60 /opt/vrdma/vrdma-perf --device pv:/tmp/g.sock?ram_mib=64 $2; rc=\$?; vrdmad_down; [ \$rc -eq 0 ] || vrdmad_logs g; exit \$rc"
  else
    echo "timeout 60 /opt/vrdma/vrdma-perf --device verbs:rxe0 $2"
  fi
}
perf_guest_client() {  # test [pv]
  local t=$1 mode=${2:-} a name=${2:+$2_}perf_$1_guest_client ok=1 hp
  a="$(perf_args $t) $PERF_ARGS --test $t"
  want "$name" || return 0
  timeout 90 ip netns exec "$NS" "$PERF" --device soft:$HOST $a >"$work/$name.host" 2>&1 &
  hp=$!
  if wait_listen && guest_run "$work/$name.guest" 60 "$(guest_perf "$mode" "--connect $HOST $a")" &&
     wait $hp && perf_ok "$work/$name.guest"; then ok=0; fi
  kill $hp 2>/dev/null || true
  wait $hp 2>/dev/null || true
  echo "$name: $(grep -o '{.*}' "$work/$name.guest" | tail -1)"
  record "$name" $ok "$work/$name.host" "$work/$name.guest"
}
perf_guest_server() {  # test [pv]
  local t=$1 mode=${2:-} a name=${2:+$2_}perf_$1_guest_server ok=1
  a="$(perf_args $t) $PERF_ARGS --test $t"
  want "$name" || return 0
  guest_start "$(guest_perf "$mode" "$a")"
  if timeout 90 ip netns exec "$NS" "$PERF" --device soft:$HOST --connect $GUEST $a >"$work/$name.host" 2>&1 &&
     guest_wait "$work/$name.guest" 90 && perf_ok "$work/$name.host"; then ok=0; fi
  [ $ok -eq 0 ] || guest_wait "$work/$name.guest" 90 || true
  echo "$name: $(grep -o '{.*}' "$work/$name.host" | tail -1)"
  record "$name" $ok "$work/$name.host" "$work/$name.guest"
}
for t in write_bw read_bw send_bw atomic_bw send_lat write_lat; do
  run_case perf_guest_client $t
  run_case perf_guest_server $t
done

# ---- 4: the virtio RDMA device on a NIC: vrdmad over verbs:rxe0 ------------------------------
run_suite_pv() {
  local name=suite_pv_rxe ok=1 f="$work/suite_pv_rxe.guest" t=$(date +%s)
  want "$name" || return 0
  if guest_run "$f" "$SUITE_TIMEOUT" "$VRDMAD_UP; VRDMA_LOG=${VRDMAD_LOG:-info} vrdmad_up a b; VRDMA_SUITE_DEVICES=pv:/tmp/a.sock?ram_mib=96,pv:/tmp/b.sock?ram_mib=96 timeout $SUITE_TIMEOUT /opt/vrdma/provider_suite" \
     "--log_level=message --report_level=short --color_output=no ${SUITE_ARGS:-}; rc=\$?; vrdmad_down; [ \$rc -eq 0 ] || vrdmad_logs a b; exit \$rc"; then ok=0; fi
  echo "$name (pv over vrdmad over verbs:rxe0, $(($(date +%s) - t)) s):"
  grep -E "SKIP|Leaving test case|failed|passed|error" "$f" | sed 's/^/  /' | head -60 || true
  record "$name" $ok "$f"
}
run_case run_suite_pv

for t in write_bw read_bw send_bw atomic_bw send_lat; do
  run_case perf_guest_client $t pv
  run_case perf_guest_server $t pv
done

# ---- 5: moving the device between vrdmad processes on the NIC ---------------------------------
run_nic_migration() {
  local name=nic_migration ok=1 f="$work/nic_migration.guest" t=$(date +%s)
  want "$name" || return 0
  # u1 refuses the state: a vrdmad on our soft engine cannot take a NIC's re-creation records.
  # Peer notices: the moving device's backends w0 -> w1 -> w2 on the guest's address
  # (w1 and w2 find w0 holding the notice port there: they send notices but take none), the
  # peer guest's backend pn on a second address of eth0 (PEER_IP: a GID of its own on rxe0).
  # The peer moves too (pn -> pn1); the refusal test has a peer of its own, pq, on PEER2_IP.
  local peer_ip=${GUEST%.*}.3 peer2_ip=${GUEST%.*}.4 peer_gid host_half=""
  peer_gid=$(printf '%02x%02x:%02x%02x' ${peer2_ip//./ })
  # A peer on our soft engine, on the host side (sp0, then sp1 it moves to): the host's half of
  # that test case serves the guest's half over TCP; both take notices on port 4793 (the guest's
  # backends y0 -> y1 -> y2 with it; w2 keeps 4792 on the guest's address).
  local sp n sp_pids=""
  if [ -z "${NICMIG_ARGS:-}" ] || [[ "$NICMIG_ARGS" == *soft* ]]; then
    for sp in sp0 sp1; do
      rm -f "$work/$sp.sock" "$work/$sp.ctl"
      n=""; [ $sp = sp1 ] && n="--incoming guest"
      timeout 260 ip netns exec "$NS" "$VRDMAD" --socket "$work/$sp.sock" --control "$work/$sp.ctl" --engine soft:$HOST \
        --notices $HOST --notice-port 4793 $n 2>"$work/$sp.log" &
      sp_pids="$sp_pids $!"
    done
    for sp in sp0 sp1; do for ((n = 0; n < 100; n++)); do [ -S "$work/$sp.ctl" ] && break; sleep 0.1; done; done
    VRDMA_NIC_SOFT_PEER_SERVE="$work/sp0.sock,$work/sp1.sock" VRDMA_NIC_SOFT_PEER_IP=$HOST VRDMA_NIC_SOFT_PEER_PORT=18516 \
      timeout 250 ip netns exec "$NS" "$NICMIG" --run_test=soft_engine_peer_host_half --log_level=message \
      --report_level=short --color_output=no >"$work/nic_migration.host" 2>&1 &
    host_half=$!
  fi
  # Notices over IPv6: the guest's device z0 -> z1 -> z2 on fd92::2, its peer pz on fd92::3 (GIDs
  # of global IPv6 addresses of eth0; no duplicate address detection: usable at once).
  if guest_run "$f" 240 "ip addr add $peer_ip/24 dev eth0; ip addr add $peer2_ip/24 dev eth0; echo 0 > /proc/sys/net/ipv6/conf/eth0/accept_dad; ip -6 addr add fd92::2/64 dev eth0; ip -6 addr add fd92::3/64 dev eth0;" \
     "i=0; until grep -qs $peer_gid /sys/class/infiniband/rxe0/ports/1/gids/* && grep -qs fd92:0000:0000:0000:0000:0000:0000:0003 /sys/class/infiniband/rxe0/ports/1/gids/*; do [ \$i -lt 50 ] || break; sleep 0.1; i=\$((i+1)); done;" \
     "$VRDMAD_UP; export VRDMA_LOG=${VRDMAD_LOG:-info}; vrdmad_up s0 t0 u0 r0; VRDMAD_ARGS='--incoming guest' vrdmad_up s1 s2 t1 r1 r2;" \
     "VRDMAD_ARGS='--notices $GUEST' vrdmad_up w0; VRDMAD_ARGS='--incoming guest --notices $GUEST' vrdmad_up w1 w2;" \
     "VRDMAD_ARGS='--notices $peer_ip --notice-hold-ms 2000' vrdmad_up pn; VRDMAD_ARGS='--incoming guest --notices $peer_ip --notice-hold-ms 2000' vrdmad_up pn1;" \
     "VRDMAD_ARGS='--notices $peer2_ip --notice-hold-ms 2000' vrdmad_up pq;" \
     "VRDMAD_ARGS='--notices $GUEST --notice-port 4793' vrdmad_up y0; VRDMAD_ARGS='--incoming guest --notices $GUEST --notice-port 4793' vrdmad_up y1 y2;" \
     "VRDMAD_ARGS='--notices fd92::2' vrdmad_up z0; VRDMAD_ARGS='--incoming guest --notices fd92::2' vrdmad_up z1 z2; VRDMAD_ARGS='--notices fd92::3' vrdmad_up pz;" \
     "VRDMAD_ARGS='--migration-engine verbs:rxe0' vrdmad_up v0; VRDMAD_ARGS='--incoming tcp:127.0.0.1:7861 --migration-engine verbs:rxe0' vrdmad_up v1;" \
     "VRDMAD_ARGS='--incoming tcp:127.0.0.1:7862' vrdmad_up v2;" \
     "rm -f /tmp/u1.sock /tmp/u1.ctl; timeout 200 /opt/vrdma/vrdmad --socket /tmp/u1.sock --engine 'soft:127.0.0.1?port=47951' --incoming guest --control /tmp/u1.ctl 2>/tmp/u1.log & PIDS=\"\$PIDS \$!\";" \
     "rm -f /tmp/x1.sock /tmp/x1.ctl; timeout 200 /opt/vrdma/vrdmad --socket /tmp/x1.sock --engine 'soft:127.0.0.1?port=47952' --incoming guest --control /tmp/x1.ctl 2>/tmp/x1.log & PIDS=\"\$PIDS \$!\";" \
     "i=0; while [ ! -S /tmp/u1.ctl ] || [ ! -S /tmp/x1.ctl ]; do [ \$i -lt 100 ] || break; sleep 0.1; i=\$((i+1)); done;" \
     "VRDMA_NIC_MOVE=/tmp/s0.sock,/tmp/s1.sock,/tmp/s2.sock VRDMA_NIC_PEER_MOVE=/tmp/t0.sock,/tmp/t1.sock VRDMA_NIC_PEER=verbs:rxe0" \
     "VRDMA_NIC_REFUSED_MOVE=/tmp/u0.sock,/tmp/u1.sock VRDMA_NIC_SRQ_MOVE=/tmp/r0.sock,/tmp/r1.sock,/tmp/r2.sock" \
     "VRDMA_NIC_STREAM_MOVE=/tmp/v0.sock,/tmp/v1.sock,/tmp/v2.sock VRDMA_NIC_STREAM_TO=tcp:127.0.0.1:7861,tcp:127.0.0.1:7862" \
     "VRDMA_NIC_NOTICE_MOVE=/tmp/w0.sock,/tmp/w1.sock,/tmp/w2.sock VRDMA_NIC_NOTICE_PEER=/tmp/pn.sock VRDMA_NIC_PEER_IP=$peer_ip VRDMA_NIC_NOTICE_HOLD_MS=2000 VRDMA_NIC_NOTICE_REFUSED=/tmp/x1.sock" \
     "VRDMA_NIC_NOTICE_PEER_MOVE=/tmp/pn1.sock VRDMA_NIC_NOTICE_PEER2=/tmp/pq.sock VRDMA_NIC_PEER2_IP=$peer2_ip" \
     "VRDMA_NIC_SOFT_MOVE=/tmp/y0.sock,/tmp/y1.sock,/tmp/y2.sock ${host_half:+VRDMA_NIC_SOFT_PEER=$HOST:18516}" \
     "VRDMA_NIC_V6_MOVE=/tmp/z0.sock,/tmp/z1.sock,/tmp/z2.sock VRDMA_NIC_V6_PEER=/tmp/pz.sock VRDMA_NIC_V6_IP=fd92::2 VRDMA_NIC_V6_PEER_IP=fd92::3" \
     "timeout 240 /opt/vrdma/nic_migration_test --log_level=message --report_level=short --color_output=no ${NICMIG_ARGS:-};" \
     "rc=\$?; grep -h 'stopped on\\|held posted again\\|re-created\\|over RDMA\\|over TCP\\|paused\\|refused\\|said nothing\\|while not paused\\|peer notices' /tmp/s0.log /tmp/s1.log /tmp/s2.log /tmp/r0.log /tmp/r1.log /tmp/r2.log /tmp/u0.log /tmp/v0.log /tmp/v1.log /tmp/v2.log /tmp/w0.log /tmp/w1.log /tmp/w2.log /tmp/pn.log /tmp/pn1.log /tmp/pq.log /tmp/y0.log /tmp/y1.log /tmp/y2.log /tmp/z0.log /tmp/z1.log /tmp/z2.log /tmp/pz.log;" \
     "[ \$rc -eq 0 ] || vrdmad_logs s0 s1 s2 r0 r1 r2 t0 t1 u0 u1 v0 v1 v2 w0 w1 w2 pn pn1 pq x1 y0 y1 y2 z0 z1 z2 pz; vrdmad_down; exit \$rc"; then ok=0; fi
  if [ -n "$host_half" ]; then
    wait "$host_half" || { ok=1; echo "the host's half (soft-engine peer) failed:"; cat "$work/nic_migration.host"; }
    grep -h "paused\|re-connected\|refused\|state saved\|state loaded" "$work/sp0.log" "$work/sp1.log" | sed 's/^/  host /' || true
    [ $ok -eq 0 ] || { for sp in sp0 sp1; do echo "--- host vrdmad $sp:"; grep -v "vhost-user\|vring" "$work/$sp.log" | tail -40; done; }
    kill $sp_pids 2>/dev/null || true
    wait $sp_pids 2>/dev/null || true
  fi
  echo "$name ($(($(date +%s) - t)) s):"
  grep -E "SKIP|moved to|streamed to|refused as|re-created|held posted again|over RDMA|over TCP|paused|ended by itself|error|failed|passed" "$f" | sed 's/^/  /' | head -60 || true
  record "$name" $ok "$f" "$work/nic_migration.host"
}
run_case run_nic_migration

# ---- 2: siw, alone (with rxe0 on the same netdev the connection manager would pick rxe0) -----
if want suite_siw; then
  if [ $HAVE_SIW -eq 1 ]; then
    guest_run "$work/rxe_del.guest" 20 "rdma link delete rxe0 && rdma link show" || true
    SIW_ALONE=1
    run_case run_suite suite_siw verbs:siw0
  else
    echo "suite_siw: not run, the guest has no siw (make_guest.sh could not build it: see its messages)"
  fi
fi

echo QUIT >&3
wait "$qemu_pid" 2>/dev/null || true
qemu_pid=""
printf '%s\n' "${summary[@]}"
echo "verbs guest conformance: $passed passed, $failed failed, $(($(date +%s) - T0)) s$([ $boots -le 1 ] || echo ", the guest rebooted $((boots - 1)) time(s) after its NIC stalled")"
[ $failed -eq 0 ] && [ $passed -gt 0 ]
