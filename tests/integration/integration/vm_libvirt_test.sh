#!/usr/bin/env bash
# The virtio RDMA device in a libvirt guest (issue 7's libvirt form): `vrdmactl domain attach`
# adds the device to a plain domain XML (a <disk type='vhostuser'> carrier, shared memfd
# memory, the vrdma:device metadata), virt-xml-validate accepts it, `virsh create` starts it on
# a real libvirtd whose QEMU hook (vrdmactl hook qemu) starts vrdmad; inside the TCG guest
# (tests/conformance/vm's kernel and initramfs, running on its own: vrdma.cases=) pvverbs-bind
# takes the carrier function and vrdma-perf over pv:pci moves data to a soft-engine peer on the
# host, every case data-checked (--verify); when the guest powers off, the hook's release stops
# vrdmad. Then hot-plug: a second guest gets the device from `vrdmactl domain attach --live`
# while it runs, moves checked data over it, and loses it with `vrdmactl domain detach --live`.
# Usage: vm_libvirt_test.sh VRDMACTL VRDMAD VRDMA_PERF PVVERBS_BIND VRDMA_STREAM
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../../.." && pwd)
[ "$#" = 5 ] || { echo "usage: $0 VRDMACTL VRDMAD VRDMA_PERF PVVERBS_BIND VRDMA_STREAM" >&2; exit 2; }
export VRDMACTL=$(readlink -f "$1") VRDMAD=$(readlink -f "$2") PERF=$(readlink -f "$3") BIND=$(readlink -f "$4") STREAM=$(readlink -f "$5")
skip() { echo "vm_libvirt: SKIP: $*" >&2; exit 77; }
. "$SRC/tests/conformance/serial_lib.sh"  # rig_tools, guest_build
rig_tools libvirtd virsh virt-xml-validate qemu-system-x86_64
guest_build "$SRC/tests/conformance/vm/make_guest.sh" "$PERF" "$BIND" "$STREAM"
export KERNEL INITRD

export W=$(mktemp -d /tmp/lv7vm.XXXXXX)
trap '[ -n "${KEEP_WORK:-}" ] && echo "kept $W" || rm -rf "$W"' EXIT
. "$HERE/vm_domain.sh"
vm_hook VRDMA_VRDMAD=$VRDMAD
export -f vm_domain_xml
export LV_PREFIX=lv7 LV_NET=10.98.7

inner() {
  set -u
  NET=10.88.7 GUEST=10.88.7.2 PEER=10.88.7.3 DEVIP=10.88.7.12
  CASES="write_bw/65536/400/16,send_bw/4096/400/16,read_bw/65536/200/8,atomic_bw/8/200/8,send_lat/64/300/1,write_lat/64/300/1"
  fail() {
    echo "FAIL: $*" >&2
    echo "--- hook log"; cat "$W/hook.log" 2>/dev/null
    echo "--- console"; tail -30 "$W/console.log" 2>/dev/null
    echo "--- vrdmad"; tail -20 "$W"/g7.sock.log 2>/dev/null
    echo "--- qemu"; tail -15 "$LV_A_DIR/var/log/libvirt/qemu/lv7g1.log" 2>/dev/null
    for f in "$W"/console2.log "$W"/g7h.sock.log "$LV_A_DIR/var/log/libvirt/qemu/lv7g2.log"; do
      [ -f "$f" ] && { echo "--- $f"; tr -d '\r' < "$f" | tail -15; }
    done
    for f in "$W"/peer*.log "$W"/hpeer*.log; do echo "--- $f"; tail -5 "$f"; done
    kill $(jobs -p) 2>/dev/null
    exit 1
  } >&2
  inA() { nsenter -t "$LV_A_PID" -n "$@"; }
  # One soft-engine server per case of CASES, case i on port BASE+i (the guest's vrdma.port),
  # its output in $W/<PREFIX>i.log.
  start_servers() {  # CASES BASE PREFIX
    local i=0 c t s n q
    for c in ${1//,/ }; do
      i=$((i + 1))
      IFS=/ read -r t s n q <<< "$c"
      inA timeout 400 "$PERF" -d soft:$PEER -p $(($2 + i)) -t "$t" -s "$s" -q "$q" -n "$n" --json > "$W/$3$i.log" 2>&1 &
    done
  }
  # The guest's VRDMA-CASE lines on CONSOLE for the comma-separated CASES: each ran over pv:pci,
  # exited 0 and verified its data.
  check_cases() {  # CONSOLE CASES LABEL
    local i=0 c line
    for c in ${2//,/ }; do
      i=$((i + 1))
      line=$(grep -a "^VRDMA-CASE $i " "$1" | tr -d '\r')
      echo "$line" | cut -c1-300
      echo "$line" | grep -q " rc=0 " || fail "${3}case $i ($c) failed in the guest"
      echo "$line" | grep -q '"verified":true' || fail "${3}case $i ($c) was not verified"
      echo "$line" | grep -q '"device":"pv:pci:auto' || fail "${3}case $i ($c) did not run over pv:pci"
    done
  }
  # Host a's guest network: a bridge with the guest's tap, the device's RDMA address (vrdmad's
  # soft engine) and the peer's address.
  inA ip link add vmbr type bridge
  inA ip addr add $NET.1/24 dev vmbr
  inA ip addr add $PEER/24 dev vmbr
  inA ip addr add $DEVIP/24 dev vmbr
  inA ip tuntap add vmtap0 mode tap
  inA ip link set vmtap0 master vmbr up
  inA ip link set vmbr up

  start_servers "$CASES" 18600 peer

  vm_domain_xml lv7g1 1024 "vrdma.ip=$GUEST vrdma.peer=$PEER vrdma.cases=$CASES" "52:54:00:88:07:02" vmtap0 "$W/console.log" > "$W/base.xml"
  "$VRDMACTL" domain attach --xml "$W/base.xml" --socket "$W/g7.sock" --engine soft:$DEVIP \
    --mac 52:54:00:88:07:12 --migration-port 7711 > "$W/dom.xml" || fail "vrdmactl domain attach failed"
  grep -q "<disk type=\"vhostuser\"" "$W/dom.xml" || fail "no vhostuser disk in the attached XML"
  grep -q "<access mode=\"shared\"/>" "$W/dom.xml" || fail "the attached XML does not share the guest's memory"
  virt-xml-validate "$W/dom.xml" domain || fail "virt-xml-validate rejects the attached XML"
  # A second attach of the same device is refused with a sentence.
  if "$VRDMACTL" domain attach --xml "$W/dom.xml" --socket "$W/g7.sock" --engine soft:$DEVIP --migration-port 7711 \
       > /dev/null 2> "$W/again.err"; then fail "a second attach was accepted"; fi
  grep -q "already has a vrdma:device" "$W/again.err" || fail "a second attach did not say why: $(cat "$W/again.err")"

  virsh -q -c "$LV_A_URI" create "$W/dom.xml" > /dev/null || fail "virsh create failed"
  qemu_args=$(tr '\0' ' ' < /proc/$(pgrep -f "guest=lv7g1" | head -1)/cmdline 2>/dev/null)
  echo "$qemu_args" | grep -q "vhost-user-blk-pci" || fail "libvirt did not give QEMU a vhost-user-blk-pci device: $qemu_args"
  echo "$qemu_args" | grep -qE "num-queues(=|\":)[0-9]" || fail "QEMU's vhost-user-blk-pci has no num-queues: $qemu_args"
  for _ in $(seq 1800); do grep -q "VRDMA-GUEST-DONE" "$W/console.log" 2>/dev/null && break; sleep 0.1; done
  grep -q "VRDMA-GUEST-DONE" "$W/console.log" || fail "the guest did not finish its cases within 180 s"
  grep -a "VRDMA-BIND" "$W/console.log" | tr -d '\r'
  check_cases "$W/console.log" "$CASES" ""
  grep -q "lv7-a lv7g1 prepare begin: started backend on $W/g7.sock" "$W/hook.log" ||
    fail "the hook did not start vrdmad at prepare"
  for _ in $(seq 100); do grep -q "lv7-a lv7g1 release end" "$W/hook.log" && break; sleep 0.1; done
  grep -q "lv7-a lv7g1 release end" "$W/hook.log" || fail "the hook was not called to release the device"
  [ ! -e "$W/g7.sock.pid" ] || fail "vrdmad still has a pid file after release"

  # 2. Hot-plug: a guest that booted with shared memory but no device gets it from
  #    `vrdmactl domain attach --live` (vrdmad started as the hook would, the carrier plugged in by
  #    libvirt, the metadata set), runs checked cases over it, and loses it again with
  #    `vrdmactl domain detach --live` (the guest releases it, vrdmad stops, the metadata goes).
  HCASES="write_bw/65536/200/8,send_lat/64/200/1"
  start_servers "$HCASES" 18700 hpeer
  vm_domain_xml lv7g2 512 "vrdma.ip=$GUEST vrdma.peer=$PEER vrdma.port=18700 vrdma.cases=$HCASES vrdma.wait=120" \
    "52:54:00:88:07:03" vmtap0 "$W/console2.log" |
    sed "s|<os>|<memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking><os>|" > "$W/hot.xml"
  virsh -q -c "$LV_A_URI" create "$W/hot.xml" > /dev/null || fail "virsh create of the hot-plug guest failed"
  for _ in $(seq 1800); do grep -q "VRDMA-WAITING" "$W/console2.log" 2>/dev/null && break; sleep 0.1; done
  grep -q "VRDMA-WAITING" "$W/console2.log" || fail "the hot-plug guest did not come up within 180 s"
  # vrdmactl runs on host a (its namespaces: its address, its hostname), as an operator's would.
  onA() { nsenter -t "$LV_A_PID" -m -u -n "$@"; }
  # Refused before anything happens: a wrong engine (usage, 2) and a domain that is not running.
  onA "$VRDMACTL" domain attach --live lv7g2 --connect "$LV_A_URI" --socket "$W/g7h.sock" --engine soft:nonsense! \
    > /dev/null 2>&1; [ $? = 2 ] || fail "attach --live with a malformed engine did not exit 2"
  out=$(onA "$VRDMACTL" domain attach --live nosuch --connect "$LV_A_URI" --socket "$W/g7h.sock" --engine soft:$DEVIP 2>&1) &&
    fail "attach --live to a domain that does not exist succeeded"
  echo "$out" | grep -q "there is no domain nosuch" || fail "attach --live to a missing domain did not say so: $out"
  out=$(onA "$VRDMACTL" domain attach --live lv7g2 --connect "$LV_A_URI" --socket "$W/g7h.sock" --engine soft:$DEVIP \
    --mac 52:54:00:88:07:13 2>&1) || fail "vrdmactl domain attach --live failed: $out"
  echo "  vrdmactl: $out"
  echo "$out" | grep -q "Domain lv7g2 has the virtio RDMA device now" || fail "attach --live did not say what it did: $out"
  live=$(virsh -q -c "$LV_A_URI" dumpxml lv7g2)
  echo "$live" | grep -q "type=\"vhostuser\"\|type='vhostuser'" || fail "the running domain has no vhostuser disk after attach --live"
  echo "$live" | grep -q "vrdma:device" || fail "the running domain has no vrdma:device metadata after attach --live"
  [ -s "$W/g7h.sock.pid" ] || fail "attach --live started no vrdmad (no pid file)"
  listed=$("$VRDMACTL" list --dir "$W" --json)
  echo "$listed" | grep -q '"domain":"lv7g2"' || fail "vrdmactl list does not show the hot-plugged backend: $listed"
  for _ in $(seq 1800); do grep -q "^VRDMA-CASE 2 " "$W/console2.log" 2>/dev/null && break; sleep 0.1; done
  grep -a "VRDMA-FOUND\|VRDMA-BIND" "$W/console2.log" | tr -d '\r'
  check_cases "$W/console2.log" "$HCASES" "hot-plug "
  out=$(onA "$VRDMACTL" domain detach --live lv7g2 --connect "$LV_A_URI" --timeout 60 2>&1) ||
    fail "vrdmactl domain detach --live failed: $out"
  echo "  vrdmactl: $out"
  echo "$out" | grep -q "no longer has the virtio RDMA device" || fail "detach --live did not say what it did: $out"
  live=$(virsh -q -c "$LV_A_URI" dumpxml lv7g2)
  echo "$live" | grep -q "vhostuser" && fail "the running domain still has the vhostuser disk after detach --live"
  echo "$live" | grep -q "vrdma:device" && fail "the running domain still has the vrdma:device metadata after detach --live"
  [ ! -e "$W/g7h.sock.pid" ] || fail "vrdmad still runs after detach --live"
  for _ in $(seq 600); do grep -q "VRDMA-GUEST-DONE" "$W/console2.log" 2>/dev/null && break; sleep 0.1; done
  grep -q "VRDMA-DEVICE-GONE" "$W/console2.log" || fail "the guest did not see the device go"
  echo "hot-plug: attached to the running guest, 2 checked cases, detached; the guest saw it come and go"

  echo "hook calls:"; sed 's/^/  /' "$W/hook.log"
  wait
}
export -f inner
"$SRC/tests/integration/integration/two_hosts.sh" bash -c inner
