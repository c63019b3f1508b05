#!/usr/bin/env bash
# Unmodified RDMA software in a libvirt guest through the guest kernel driver (issue 25): a plain
# domain XML of the kernel-driver guest (Debian's 6.1 kernel; virtio_rdma.ko from its DKMS
# package; the rdma-core provider with Debian's libibverbs and perftest), `vrdmactl domain
# attach` adds the device, `virsh create` starts it on a real libvirtd whose QEMU hook (vrdmactl
# hook qemu) starts vrdmad on the soft engine. Inside, on its own (kmod_guest_init.sh
# vrdma.cases=), the guest loads the module, waits for vrdma0's port and runs Debian's
# unmodified ib_write_bw, ib_read_bw, ib_send_bw and ib_write_lat as an unprivileged user against
# vrdma-perf on the host's soft engine. Checked: each tool exited 0 with its result line, and the
# host's vrdma-perf counted the packets the data needs (a SEND server every message); the hook
# starts vrdmad at prepare and stops it at release. The four peers run at once, each on an address
# of its own (its engine counts only its own case's packets).
#   vm_libvirt_kmod_test.sh SOURCE_DIR VRDMACTL VRDMAD VRDMA_PERF   exits 77 (skip) without root, libvirt, QEMU,
#   the guest kernel, its headers or rdma-core's source; KEEP_WORK=1 keeps the logs.
set -uo pipefail
[ "$#" = 4 ] || { echo "usage: $0 SOURCE_DIR VRDMACTL VRDMAD VRDMA_PERF" >&2; exit 2; }
SRC=$(readlink -f "$1")
export SRC VRDMACTL=$(readlink -f "$2") VRDMAD=$(readlink -f "$3") PERF=$(readlink -f "$4")
HERE=$SRC/tests/integration/integration
VM=$SRC/tests/conformance/vm
skip() { echo "vm_libvirt_kmod: SKIP: $*" >&2; exit 77; }
. "$SRC/tests/conformance/serial_lib.sh"  # rig_tools
. "$VM/kmod_lib.sh"                        # kmod_build, kmod_tree
rig_tools libvirtd virsh virt-xml-validate qemu-system-x86_64

export W=$(mktemp -d /tmp/lvkvm.XXXXXX)
trap '[ -n "${KEEP_WORK:-}" ] && echo "kept $W" || rm -rf "$W"' EXIT

# The guest: the kernel-driver guest of kmod_test.sh with perftest's tools.
kmod_guest "$W" "ib_write_bw ib_read_bw ib_send_bw ib_write_lat"
export KERNEL INITRD

. "$HERE/vm_domain.sh"
vm_hook VRDMA_VRDMAD=$VRDMAD
export -f vm_domain_xml
export LV_PREFIX=lvk LV_NET=10.98.11

inner() {
  set -u
  # The device's address is the guest's (vrdma.ip on eth0: its RoCEv2 GID), vrdmad's soft engine
  # sends from it on vmbr, where the peer vrdma-perf is; the guest's NIC (vmtap0) carries only
  # the tools' TCP exchange, on a subnet of its own, as in kmod_test.sh.
  DEVIP=10.88.11.12 TCPHOST=10.88.21.1 TCPGUEST=10.88.21.2 GMAC=52:54:00:88:0b:0c
  CASES="ib_write_bw/65536/400,ib_read_bw/65536/200,ib_send_bw/4096/400,ib_write_lat/64/300"
  fail() {
    echo "FAIL: $*" >&2
    echo "--- hook log"; cat "$W/hook.log" 2>/dev/null
    echo "--- console"; tr -d '\r' < "$W/console.log" 2>/dev/null | tail -40
    echo "--- vrdmad"; tail -20 "$W"/gk.sock.log 2>/dev/null
    echo "--- qemu"; tail -15 "$LV_A_DIR/var/log/libvirt/qemu/lvkg1.log" 2>/dev/null
    for f in "$W"/peer*.log; do echo "--- $f"; tail -3 "$f"; done
    kill $(jobs -p) 2>/dev/null
    exit 1
  } >&2
  inA() { nsenter -t "$LV_A_PID" -n "$@"; }
  inA ip link add vmbr type bridge  # MTU 1500: the engines' active MTU 1024, perftest's default here
  inA ip addr add $DEVIP/24 dev vmbr
  inA ip link set vmbr up
  inA ip tuntap add vmtap0 mode tap
  inA ip addr add $TCPHOST/24 dev vmtap0
  inA ip link set vmtap0 up

  # One vrdma-perf per case, case i at 10.88.11.(20+i) and on TCP port 18600+i: perftest's exchange,
  # the test by the tool's name.
  local i=0 c tool size iters pids=() peers=""
  for c in ${CASES//,/ }; do
    i=$((i + 1))
    IFS=/ read -r tool size iters <<< "$c"
    inA ip addr add 10.88.11.$((20 + i))/24 dev vmbr
    peers+=${peers:++}10.88.11.$((20 + i))
    inA timeout 400 "$PERF" --device soft:10.88.11.$((20 + i)) --peer-format perftest --test "${tool#ib_}" --size "$size" \
      --iters "$iters" --mtu 1024 --port $((18600 + i)) > "$W/peer$i.log" 2>&1 &
    pids+=($!)
  done

  vm_domain_xml lvkg1 1024 "vrdma.ip=$DEVIP vrdma.tcp=$TCPGUEST/24 vrdma.rdma_peer=$peers vrdma.rdma_mac=02:00:0a:58:0b:01 vrdma.peer=$TCPHOST vrdma.cases=$CASES" \
    "$GMAC" vmtap0 "$W/console.log" > "$W/base.xml"
  "$VRDMACTL" domain attach --xml "$W/base.xml" --socket "$W/gk.sock" --engine soft:$DEVIP --mac $GMAC > "$W/dom.xml" ||
    fail "vrdmactl domain attach failed"
  virt-xml-validate "$W/dom.xml" domain || fail "virt-xml-validate rejects the attached XML"
  virsh -q -c "$LV_A_URI" create "$W/dom.xml" > /dev/null || fail "virsh create failed"
  for _ in $(seq 2400); do grep -q "VRDMA-GUEST-DONE" "$W/console.log" 2>/dev/null && break; sleep 0.1; done
  grep -q "VRDMA-GUEST-DONE" "$W/console.log" || fail "the guest did not finish its cases within 240 s"
  tr -d '\r' < "$W/console.log" | grep -a "^VRDMA-PORT"
  i=0
  for c in ${CASES//,/ }; do
    i=$((i + 1))
    IFS=/ read -r tool size iters <<< "$c"
    local line
    line=$(tr -d '\r' < "$W/console.log" | grep -a "^VRDMA-CASE $i ")
    echo "$line" | cut -c1-200
    wait "${pids[$((i - 1))]}" || fail "vrdma-perf, the peer of $tool, failed: $(tail -2 "$W/peer$i.log")"
    echo "  host: $(tail -1 "$W/peer$i.log" | cut -c1-300)"
    echo "$line" | grep -qE "^VRDMA-CASE $i $tool rc=0  ?$size $iters " || fail "$tool ($c) failed in the guest"
    # The packets the data needs, at MTU 1024, counted by the case's own peer engine (pt_moved).
    pt_moved server "${tool#ib_}" "$iters" "$size" "$W/peer$i.log" || fail "$tool ($c): the data did not move"
  done
  grep -q "lvk-a lvkg1 prepare begin: started backend on $W/gk.sock" "$W/hook.log" ||
    fail "the hook did not start vrdmad at prepare"
  for _ in $(seq 100); do grep -q "lvk-a lvkg1 release end" "$W/hook.log" && break; sleep 0.1; done
  grep -q "lvk-a lvkg1 release end" "$W/hook.log" || fail "the hook was not called to release the device"
  [ ! -e "$W/gk.sock.pid" ] || fail "vrdmad still has a pid file after release"
  echo "libvirt guest with the kernel driver: $i unmodified perftest runs over vrdma0, data counted on the peer"
}
export -f inner pt_moved
"$SRC/tests/integration/integration/two_hosts.sh" bash -c inner
