#!/usr/bin/env bash
# Unmodified RDMA applications in a guest that moves (issue 31): the kernel-driver guest (Debian's
# 6.1 kernel, virtio_rdma.ko from its DKMS package, the rdma-core provider, Debian's unmodified
# rping, ib_write_bw and ibv_srq_pingpong) under libvirt on host a of two real libvirt hosts
# (two_hosts.sh), its device added by `vrdmactl domain attach`, its backends started by the hook.
# Inside, at once: `rping -c -C N -S 4096 -V` through the guest kernel's RDMA-CM (ib_cm on the
# device's QP1), `ib_write_bw -D` (64 KiB WRITEs for 90 s) and `ibv_srq_pingpong` (16 RC QPs whose
# receives all come from one SRQ, which moves with the guest: 4 KiB messages at the peer's pace, 50
# a second), as an unprivileged user against vrdma-perf on a soft engine
# across a switch that drops ${LOSS_PERCENT:-1} % of RoCE packets (fabric_lib.sh), and NVMe over
# Fabrics: Debian's nvme-cli connected over vrdma0 to the guest's own nvmet-rdma target (every
# I/O fast-registered), 4 MiB rounds written and read back with O_DIRECT for a minute. While both run the
# domain moves a -> b with plain `virsh migrate --live --p2p` (the hook starts vrdmad --incoming on
# b; the device state travels in guest memory; the guest's RDMA address is announced from b),
# then b -> a with `vrdmactl migrate`; each move leaves the domain paused until its guest RAM
# equals the source's (memcheck_lib.sh). Checked: all four were running across both moves and
# exit 0, rping verified every ping on both sides (its own -V and the peer's), the peer's engine
# received every WRITE's packets (as many as ib_write_bw says it wrote), ibv_srq_pingpong moved
# every message each way (the peer checked each one's bytes), every NVMe round read back what it
# wrote and the initiator disconnected cleanly; none of them was told anything.
#   vm_libvirt_kmod_migrate_test.sh SOURCE_DIR VRDMACTL VRDMAD VRDMA_PERF VRDMA_MEMCMP
# exits 77 (skip) without root, libvirt, QEMU, the guest kernel, its headers or rdma-core's
# source; KEEP_WORK=1 keeps the logs. KMOD_MIGRATE_PINGS (default 6000: ~65 s, inside ib_write_bw's 90),
# KMOD_MIGRATE_WRITE_SECONDS (90), KMOD_MIGRATE_NVME_SECONDS (70) and KMOD_MIGRATE_SRQ_MESSAGES
# (3000: 60 s at 50 a second) size the runs: all must outlast the two moves.
set -uo pipefail
[ "$#" = 5 ] || { echo "usage: $0 SOURCE_DIR VRDMACTL VRDMAD VRDMA_PERF VRDMA_MEMCMP" >&2; exit 2; }
SRC=$(readlink -f "$1")
export SRC VRDMACTL=$(readlink -f "$2") VRDMAD=$(readlink -f "$3") PERF=$(readlink -f "$4") MEMCMP=$(readlink -f "$5")
export HERE=$SRC/tests/integration/integration
skip() { echo "vm_libvirt_kmod_migrate: SKIP: $*" >&2; exit 77; }
. "$SRC/tests/conformance/serial_lib.sh"  # rig_tools
. "$SRC/tests/conformance/vm/kmod_lib.sh" # kmod_guest, pt_moved
rig_tools libvirtd virsh qemu-system-x86_64 nft

export W=$(mktemp -d /tmp/lvkmig.XXXXXX)
# The guest's build lives apart from $W: a second run of the scenario (memcheck_scenario, after
# QEMU lost guest memory) moves $W's files away, and boots the same guest again.
GW=$(mktemp -d /tmp/lvkmigg.XXXXXX)
export SWNS=lkmsw$$ PNS=lkmp$$
. "$HERE/fabric_lib.sh"  # fabric_cleanup
cleanup() {
  fabric_cleanup
  [ -n "${KEEP_WORK:-}" ] && echo "kept $W $GW" || rm -rf "$W" "$GW"
}
trap cleanup EXIT

kmod_guest "$GW" "rping ib_write_bw ibv_srq_pingpong nvme" rdma_ucm nvme-rdma nvmet-rdma
export KERNEL INITRD
. "$HERE/vm_domain.sh"
vm_hook VRDMA_WRITE_JOURNAL=$W/journal-%p.bin VRDMA_VRDMAD=$VRDMAD
export -f vm_domain_xml pt_moved
export LV_PREFIX=lkm LV_NET=10.98.12

inner() {
  set -u
  . "$HERE/memcheck_lib.sh"
  . "$HERE/fabric_lib.sh"
  # The device's address GIP is the guest's (its RoCEv2 GID, on eth0) and vrdmad's soft engine's,
  # on "vg" of the host the guest runs on. The guest's NIC (eth0, on each host's hbr) reaches the
  # switch too, so the peer's neighbour entry for GIP names vg's MAC for good (the guest's eth0
  # would answer ARP for it as well). The tools' TCP exchange runs on a subnet of its own.
  GIP=10.88.12.12 GMAC=52:54:00:88:0c:0c NICMAC=52:54:00:88:0c:02
  PEER=10.88.12.3 PEER2=10.88.12.4 PEER3=10.88.12.5 PEERMAC=02:00:0a:58:0c:03 TCPHOST=10.88.22.1 TCPGUEST=10.88.22.2
  PINGS=${KMOD_MIGRATE_PINGS:-6000} WRITE_S=${KMOD_MIGRATE_WRITE_SECONDS:-90} NVME_S=${KMOD_MIGRATE_NVME_SECONDS:-70}
  SRQ_N=${KMOD_MIGRATE_SRQ_MESSAGES:-3000}
  A="virsh -q -c $LV_A_URI" B="virsh -q -c $LV_B_URI"
  fail() {
    echo "FAIL: $*" >&2
    echo "--- hook log"; cat "$W/hook.log" 2>/dev/null
    echo "--- console"; tr -d '\r' < "$W/console.log" 2>/dev/null | tail -40
    for f in "$W"/*.sock.log; do echo "--- $f"; grep -v "ring .* stopped" "$f" | tail -12; done
    for h in a b; do d=LV_${h^^}_DIR; echo "--- qemu log on $h"; tail -8 "${!d}/var/log/libvirt/qemu/lkmg1.log" 2>/dev/null; done
    for f in "$W"/peer*.log; do echo "--- $f"; tail -3 "$f"; done
    ip netns pids $PNS 2>/dev/null | xargs -r kill 2>/dev/null
    exit 1
  } >&2
  guest_fabric || fail "cannot build the fabric"
  ip -n $PNS link set gP address $PEERMAC && ip -n $PNS addr add $PEER2/24 dev gP && ip -n $PNS addr add $PEER3/24 dev gP &&
    ip -n $PNS addr add $TCPHOST/24 dev gP &&
    ip -n $PNS neigh replace $GIP lladdr $GMAC dev gP nud permanent || fail "cannot set up the peer's addresses"

  # The peers: rping's server (it verifies every ping) and perftest's write_bw server, each on an
  # engine of its own address (one engine's CM must not answer the other's QP1).
  ip netns exec $PNS timeout 900 "$PERF" --device soft:$PEER --peer-format rping --size 4096 --port 18601 > "$W/peer1.log" 2>&1 &
  p1=$!
  ip netns exec $PNS timeout 900 "$PERF" --device soft:$PEER2 --peer-format perftest --test write_bw --size 65536 \
    --mtu 1024 --port 18602 > "$W/peer2.log" 2>&1 &
  p2=$!
  # ibv_srq_pingpong answers as fast as it is sent to: the peer sends 50 a second. The peer sends
  # too, so its QPs must wait out a move's downtime (~2 s here: the stop, the last memory pass and
  # the destination's load) before their retries run out: a 1 s ACK timeout (18), 7 retries. The
  # tool's own QPs (timeout 14: 67 ms) move with the guest and their timers with them.
  ip netns exec $PNS timeout 900 "$PERF" --device soft:$PEER3 --peer-format pingpong --srq --size 4096 --iters $SRQ_N \
    --mtu 1024 --rate 50 --qp-timeout 18 --port 18604 > "$W/peer3.log" 2>&1 &
  p3=$!

  vm_domain_xml lkmg1 1024 "vrdma.ip=$GIP vrdma.tcp=$TCPGUEST/24 vrdma.rdma_peer=$PEER vrdma.rdma_mac=$PEERMAC vrdma.peer=$TCPHOST vrdma.timeout=600 vrdma.parallel=1 vrdma.cases=rping/4096/$PINGS,ib_write_bw+D/65536/$WRITE_S,nvme/4/$NVME_S,ibv_srq_pingpong/4096/$SRQ_N" \
    "$NICMAC" vmtap0 "$W/console.log" > "$W/base.xml"
  "$VRDMACTL" domain attach --xml "$W/base.xml" --socket "$W/gk.sock" --engine soft:$GIP --mac $GMAC --announce vg \
    > "$W/dom.xml" || fail "vrdmactl domain attach failed"
  $A create "$W/dom.xml" > /dev/null || fail "virsh create on host a failed"
  con() { tr -d '\r' < "$W/console.log" 2>/dev/null; }
  ended() { con | grep -a -c "^VRDMA-CASE "; }
  for _ in $(seq 2400); do con | grep -q -a "^VRDMA-CASES-STARTED" && break; sleep 0.1; done
  con | grep -q -a "^VRDMA-CASES-STARTED 4" || fail "the guest did not start its tools within 240 s"
  con | grep -a "^VRDMA-PORT"
  sleep 5  # all connected by then (rping and nvme through RDMA-CM, ib_write_bw and ibv_srq_pingpong through TCP)
  [ "$(ended)" = 0 ] || fail "a tool ended before the first move: $(con | grep -a '^VRDMA-CASE ')"
  echo "rping, ib_write_bw, ibv_srq_pingpong and NVMe over Fabrics running in the guest on host a"

  # 1. a -> b, plain virsh: nothing but the hook knows about vrdma.
  t0=$(date +%s%N)
  virsh_move_a_to_b lkmg1 "$W/gk.sock.pid"  # sets t1; the memory compared
  dt=$($B domjobinfo --completed lkmg1 2>/dev/null | awk '/^Total downtime:/ {print $3}')
  echo "virsh migrate a -> b: $(( (t1 - t0) / 1000000 )) ms wall, downtime ${dt:-?} ms; tools ended so far: $(ended)"
  [ "$(ended)" = 0 ] || fail "a tool ended before the move a -> b completed: raise KMOD_MIGRATE_PINGS/WRITE_SECONDS/NVME_SECONDS"
  grep -q "lkm-b lkmg1 migrate begin: started vrdmad --incoming on $W/lkmg1.lkm-b.sock" "$W/hook.log" ||
    fail "the hook on host b did not start vrdmad --incoming"
  grep -q "written into guest memory" "$W/gk.sock.log" || fail "vrdmad on host a wrote no state into guest memory"
  for _ in $(seq 300); do grep -q "from guest memory in" "$W/lkmg1.lkm-b.sock.log" && break; sleep 0.1; done
  grep -q "from guest memory in" "$W/lkmg1.lkm-b.sock.log" || fail "vrdmad on host b did not load the state from guest memory"
  sleep 3

  # 2. b -> a, vrdmactl migrate.
  vrdmactl_move_b_to_a lkmg1 "$W/lkmg1.lkm-b.sock.pid"
  echo "vrdmactl migrate b -> a done; tools ended so far: $(ended)"
  [ "$(ended)" = 0 ] || fail "a tool ended before the move b -> a completed: raise KMOD_MIGRATE_PINGS/WRITE_SECONDS/NVME_SECONDS"

  # 3. Both tools finish on host a, every byte checked.
  for _ in $(seq 6000); do con | grep -q -a "^VRDMA-GUEST-DONE" && break; sleep 0.1; done
  con | grep -q -a "^VRDMA-GUEST-DONE" || fail "the guest's tools did not end within 600 s of the moves"
  con | grep -a "^VRDMA-CASE " | cut -c1-200
  wait $p1 || fail "vrdma-perf, rping's peer, failed: $(tail -2 "$W/peer1.log")"
  wait $p2 || fail "vrdma-perf, ib_write_bw's peer, failed: $(tail -2 "$W/peer2.log")"
  wait $p3 || fail "vrdma-perf, ibv_srq_pingpong's peer, failed: $(tail -2 "$W/peer3.log")"
  echo "  rping's peer: $(tail -1 "$W/peer1.log" | cut -c1-300)"
  echo "  ib_write_bw's peer: $(tail -1 "$W/peer2.log" | cut -c1-300)"
  echo "  ibv_srq_pingpong's peer: $(tail -1 "$W/peer3.log" | cut -c1-300)"
  con | grep -q -a "^VRDMA-CASE 1 rping rc=0 4096 $PINGS verified" || fail "rping did not end with every ping verified"
  grep -q '"verified":true' "$W/peer1.log" && grep -q "\"pings\":$PINGS," "$W/peer1.log" ||
    fail "rping's peer did not verify $PINGS pings"
  writes=$(con | sed -n -E 's/^VRDMA-CASE 2 ib_write_bw\+D rc=0  ?65536 ([0-9]+) .*/\1/p')
  [ -n "$writes" ] || fail "ib_write_bw -D failed in the guest"
  echo "  ib_write_bw -D $WRITE_S: $writes WRITEs of 64 KiB"
  pt_moved server write_bw "$writes" 65536 "$W/peer2.log" || fail "ib_write_bw: the data did not move"
  con | grep -q -a -E "^VRDMA-CASE 3 nvme rc=0 4 [1-9][0-9]* verified" || fail "NVMe over Fabrics failed in the guest"
  # ibv_srq_pingpong counts bytes both ways: SRQ_N messages of 4 KiB each way; the peer checked
  # every message it received and counts them (ops): at least SRQ_N, and up to 15 more (the
  # tool's QPs each send again while fewer than -n sends have completed: 3,003 in one run).
  con | grep -q -a "^VRDMA-CASE 4 ibv_srq_pingpong rc=0 $((SRQ_N * 4096 * 2)) bytes in" ||
    fail "ibv_srq_pingpong did not move $SRQ_N messages each way in the guest"
  got=$(grep -o '"ops":[0-9]*' "$W/peer3.log" | tail -1 | cut -d: -f2)
  grep -q '"verified":true' "$W/peer3.log" && [ "${got:-0}" -ge "$SRQ_N" ] && [ "${got:-0}" -le $((SRQ_N + 15)) ] ||
    fail "ibv_srq_pingpong's peer did not receive and check $SRQ_N messages (it counted ${got:-none})"
  # The NVMe I/O went through fast registration on the device (the last vrdmad's engine counts).
  for _ in $(seq 100); do grep -q "vrdmad: exiting" "$W/lkmg1.lkm-a.sock.log" && break; sleep 0.1; done
  fr=$(sed -n 's/.*vrdmad: exiting: .*"fast_registrations":\([0-9]*\).*/\1/p' "$W/lkmg1.lkm-a.sock.log")
  echo "  vrdmad on host a after the second move: ${fr:-?} fast registrations"
  [ "${fr:-0}" -gt 0 ] || fail "vrdmad on host a counted no fast registration after the second move"
  echo "the switch dropped $(fabric_dropped) RoCE packets"
  echo "unmodified rping, ib_write_bw, ibv_srq_pingpong (its SRQ moving) and NVMe over Fabrics carried on across virsh migrate a -> b and vrdmactl migrate b -> a"
}
export -f inner
. "$HERE/memcheck_lib.sh"
memcheck_scenario "$HERE/two_hosts.sh" bash -c inner
