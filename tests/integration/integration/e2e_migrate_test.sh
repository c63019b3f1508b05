#!/usr/bin/env bash
# End to end through libvirt: a TCG guest (the vhost rig's kernel and initramfs, vrdma.mode=migrate)
# with a vhost-user-blk disk whose backend the libvirt hook (vrdmactl hook qemu) starts on each host
# keeps writing and reading back checksummed data while it moves
#   host a -> host b   with plain `virsh migrate --live --p2p`
#   host b -> host a   with `vrdmactl migrate`, asking for rdma:// (this machine has no RDMA
#                      device, so the pre-flight falls back to TCP, multifd, and must say why)
# After each move the domain runs on the other host only; at the end the host writes the stop
# marker and the guest must report RESULT OK (every read-back matched). Downtimes are printed.
# Each move leaves the domain paused on the destination (--suspend) until its guest RAM has been
# compared with the source's (memcheck_lib.sh); a page that differs fails the test.
# Usage: e2e_migrate_test.sh VRDMACTL VHOST_BLK_BACKEND VRDMA_MEMCMP
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../../.." && pwd)
[ "$#" = 3 ] || { echo "usage: $0 VRDMACTL VHOST_BLK_BACKEND VRDMA_MEMCMP" >&2; exit 2; }
export VRDMACTL=$1 BLK=$2 MEMCMP=$(readlink -f "$3") HERE
skip() { echo "e2e_migrate: SKIP: $*" >&2; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root"
for t in libvirtd virsh qemu-system-x86_64; do
  command -v $t >/dev/null || skip "$t is not installed (scripts/setup.sh installs libvirt and QEMU)"
done
G=$("$SRC/tests/conformance/vhost/make_guest.sh") || skip "the guest kernel/initramfs cannot be built (make_guest.sh: status $?)"
eval "$G"  # KERNEL=... INITRD=...

export W=$(mktemp -d /tmp/lv9e2e.XXXXXX)
cleanup() { rm -rf "$W"; }
trap cleanup EXIT
. "$HERE/vm_domain.sh"
vm_hook VRDMA_WRITE_JOURNAL=$W/journal-%p.bin VRDMA_BLK_BACKEND=$BLK
export KERNEL INITRD

inner() {
  set -u
  . "$HERE/memcheck_lib.sh"
  fail() {
    echo "FAIL: $*" >&2
    echo "--- hook log"; cat "$W/hook.log" 2>/dev/null
    echo "--- console"; tail -20 "$W/console.log" 2>/dev/null
    for h in a b; do d=LV_${h^^}_DIR; echo "--- qemu log on $h"; tail -15 "${!d}/var/log/libvirt/qemu/lv9g1.log" 2>/dev/null; done
    for f in "$W"/*.log; do case $f in *hook.log|*console.log) ;; *) echo "--- $f"; tail -5 "$f";; esac; done
    exit 1
  } >&2
  # A guest whose kernel died (panic=-1 reboots it, and its I/O loop starts again from 1, so
  # iteration counts alone would not tell) fails the test: after a migration its memory was not
  # what it was at the source.
  no_crash() {  # no_crash WHEN
    local first
    first=$(grep -m1 -E "Kernel panic|BUG: |kernel BUG|Oops: |general protection fault" "$W/console.log" 2>/dev/null)
    if [ -n "$first" ] || [ "$(grep -c "loop started" "$W/console.log" 2>/dev/null)" -gt 1 ]; then
      fail "the guest's kernel crashed $1 (${first:-its I/O loop started again}): its memory after the move was not what it was at the source"
    fi
  }
  A="virsh -q -c $LV_A_URI" B="virsh -q -c $LV_B_URI"
  cat > "$W/dom.xml" <<X
<domain type='qemu'>
  <name>lv9g1</name>
  <memory unit='MiB'>256</memory>
  <vcpu current='1'>2</vcpu>
  <metadata>
    <vrdma:device xmlns:vrdma='https://vrdma.dev/xmlns/1' backend='vhost-user-blk' socket='$W/g1.sock' disk='$W/disk.img'/>
  </metadata>
  <memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>
  <os><type arch='x86_64' machine='pc'>hvm</type><kernel>$KERNEL</kernel><initrd>$INITRD</initrd>
    <cmdline>console=ttyS0 quiet panic=-1 vrdma.mode=migrate</cmdline></os>
  <features><acpi/></features>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='vhostuser' device='disk'>
      <driver name='qemu' type='raw'/>
      <source type='unix' path='$W/g1.sock'><reconnect enabled='yes' timeout='2'/></source>
      <target dev='vda' bus='virtio'/>
    </disk>
    <serial type='file'><source path='$W/console.log' append='on'/></serial>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>
</domain>
X
  $A create "$W/dom.xml" >/dev/null || fail "host a cannot start the guest"
  for i in $(seq 600); do grep -q "loop started" "$W/console.log" 2>/dev/null && break; sleep 0.1; done
  grep -q "loop started" "$W/console.log" || fail "the guest did not start its I/O loop within 60 s"
  grep -q "lv9-a lv9g1 prepare begin: started backend on $W/g1.sock" "$W/hook.log" ||
    fail "the hook did not start the backend on host a"
  sleep 2

  # 1. a -> b, plain virsh.
  t0=$(date +%s%N)
  # At --bandwidth 32 (QEMU's own default; libvirt's is unlimited): without a limit QEMU 7.2 loses
  # guest memory in about 1 of 15-25 migrations of a TCG guest, even with its own virtio-blk and
  # no vrdma code at all (docs/integration.md "QEMU 7.2 TCG and unlimited bandwidth").
  virsh_move_a_to_b lv9g1 "$W/g1.sock.pid"  # sets t1
  [ -z "$($A list --name)" ] || fail "the guest still shows on host a after virsh migrate"
  grep -q "lv9-b lv9g1 migrate begin: started vhost-user-blk on $W/lv9g1.lv9-b.sock" "$W/hook.log" ||
    fail "the hook on host b did not start the incoming backend with a rewritten socket"
  for i in $(seq 50); do grep -q "lv9-a lv9g1 release end" "$W/hook.log" && break; sleep 0.1; done
  grep -q "lv9-a lv9g1 release end" "$W/hook.log" || fail "host a's hook did not release the backend"
  [ ! -e "$W/g1.sock.pid" ] || fail "host a's backend still has a pid file after release"
  # virsh shows the completed job's figures on the destination.
  dt=$($B domjobinfo --completed lv9g1 2>/dev/null | awk '/^Total downtime:/ {print $3}')
  echo "virsh migrate a -> b: $(( (t1 - t0) / 1000000 )) ms wall, downtime ${dt:-unknown} ms"
  sleep 2
  no_crash "after virsh migrate a -> b"
  iters=$(grep -c "VRDMA-GUEST: iter .* ok" "$W/console.log")

  # 2. b -> a, vrdmactl migrate (rdma:// requested, falls back to TCP with the reasons).
  mem_hold "$LV_B_DIR" lv9g1 "$W/lv9g1.lv9-b.sock.pid" || fail "cannot hold the source's guest memory"
  out=$("$VRDMACTL" migrate lv9g1 "$LV_A_TCP" --connect "$LV_B_URI" --migrateuri "rdma://$LV_A_IP:49338" --timeout 120 \
    --bandwidth 32 --suspend 2>&1)
  rc=$?
  echo "$out" | sed 's/^/  vrdmactl: /'
  [ $rc = 0 ] || fail "vrdmactl migrate b -> a failed (status $rc)"
  echo "$out" | grep -q "RDMA migration is not possible: this host has no RDMA device" ||
    fail "vrdmactl did not explain the missing RDMA device"
  echo "$out" | grep -q "hard_limit" || fail "vrdmactl did not mention the missing hard_limit"
  echo "$out" | grep -qE "is reached through .*, which carries no RDMA GID|is not reachable from this host" ||
    fail "vrdmactl did not check the route to the destination for an RDMA port"
  echo "$out" | grep -q "The memory copy is limited to 32 MiB/s." || fail "vrdmactl did not say it limits the bandwidth"
  echo "$out" | grep -q "2 parallel TCP connections (multifd)" || fail "vrdmactl did not send the memory multifd"
  echo "$out" | grep -q "Falling back to TCP (tcp://$LV_A_IP:49338)" || fail "vrdmactl did not fall back to TCP"
  echo "$out" | grep -qE "Domain lv9g1 is now paused on .* with [0-9]+ ms of downtime" ||
    fail "vrdmactl did not print the JOB_COMPLETED figures"
  [ "$($A domstate lv9g1 2>/dev/null)" = paused ] || fail "the guest is not paused on host a after vrdmactl migrate --suspend"
  mem_check_or_rerun "$LV_A_DIR" lv9g1 "b -> a"
  echo "$out" | grep -qE "remaining|Memory copy pass" || fail "vrdmactl printed no progress"
  [ "$($A domstate lv9g1 2>/dev/null)" = running ] || fail "the guest does not run on host a after vrdmactl migrate"
  [ -z "$($B list --name)" ] || fail "the guest still shows on host b after vrdmactl migrate"
  grep -q "lv9-a lv9g1 migrate begin: started vhost-user-blk on $W/lv9g1.lv9-a.sock" "$W/hook.log" ||
    fail "the hook on host a did not start the incoming backend"
  sleep 2
  no_crash "after vrdmactl migrate b -> a"
  iters2=$(grep -c "VRDMA-GUEST: iter .* ok" "$W/console.log")
  [ "$iters2" -gt "$iters" ] || fail "the guest's I/O loop made no progress after coming back to host a"

  # 3. Stop the guest's loop: every read-back must have matched across both moves.
  printf 'VRDMA-STOP' | dd of="$W/disk.img" bs=512 seek=120000 conv=notrunc status=none
  for i in $(seq 600); do grep -q "RESULT" "$W/console.log" && break; sleep 0.1; done
  grep -q "RESULT OK" "$W/console.log" || fail "the guest did not report RESULT OK: $(grep RESULT "$W/console.log")"
  no_crash "before its RESULT"
  echo "guest: $(grep RESULT "$W/console.log" | tail -1 | sed 's/.*VRDMA-GUEST: //')"
  for i in $(seq 100); do [ -z "$($A list --name)" ] && break; sleep 0.1; done
  for i in $(seq 50); do [ ! -e "$W/lv9g1.lv9-a.sock.pid" ] && break; sleep 0.1; done
  [ ! -e "$W/lv9g1.lv9-a.sock.pid" ] || fail "host a's backend was not stopped when the guest ended"
  echo "hook calls:"; sed 's/^/  /' "$W/hook.log"
}
export -f inner
. "$HERE/memcheck_lib.sh"
memcheck_scenario "$HERE/two_hosts.sh" bash -c inner
