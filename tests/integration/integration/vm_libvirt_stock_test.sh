#!/usr/bin/env bash
# vrdma as an operator installs it, on libvirt as Debian sets it up (issue 27): the host package
# (integration/packaging/make_host_deb.sh) is built from the build and installed with dpkg -i on
# this machine; two libvirt hosts (two_hosts.sh with LV_STOCK=1: qemu.conf at Debian's defaults,
# so QEMU runs as libvirt-qemu with dynamic_ownership; the package's hook in hooks/qemu.d/; a
# /run of each host's own, made at boot by tmpfiles.d) run a guest that the installed vrdmactl
# gave the device (sockets in /run/vrdma). The guest streams checked RDMA messages
# (vrdma-stream over pv:pci) to a soft-engine peer across a switch dropping 1 % of RoCE packets
# while it moves a -> b with virsh migrate; host a then reboots (its daemons stop, its /run is
# emptied, tmpfiles.d makes /run/vrdma again) and the guest moves back b -> a with vrdmactl
# migrate, guest memory compared after each move. The serving vrdmad holds CAP_CHOWN,
# CAP_NET_ADMIN, CAP_NET_RAW and CAP_IPC_LOCK only. Then dpkg --purge takes everything back.
# AppArmor: this kernel has none, so the abstraction is installed and wired (checked) but not
# enforced here.
# Usage: vm_libvirt_stock_test.sh BUILD_DIR VRDMA_PERF PVVERBS_BIND VRDMA_STREAM VRDMA_MEMCMP
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../../.." && pwd)
[ "$#" = 5 ] || { echo "usage: $0 BUILD_DIR VRDMA_PERF PVVERBS_BIND VRDMA_STREAM VRDMA_MEMCMP" >&2; exit 2; }
BUILD=$(readlink -f "$1")
export PERF=$(readlink -f "$2") BIND=$(readlink -f "$3") STREAM=$(readlink -f "$4") MEMCMP=$(readlink -f "$5") HERE
skip() { echo "vm_libvirt_stock: SKIP: $*" >&2; exit 77; }
. "$SRC/tests/conformance/serial_lib.sh"  # rig_tools, guest_build
rig_tools libvirtd virsh qemu-system-x86_64 nft dpkg dpkg-deb dpkg-shlibdeps systemd-tmpfiles
getent passwd libvirt-qemu >/dev/null || skip "there is no libvirt-qemu user (Debian's libvirt-daemon-system makes it)"
if dpkg-query -W -f='${Status}' vrdma 2>/dev/null | grep -q "installed"; then
  skip "the vrdma package is installed on this machine; this test installs and purges its own (dpkg --purge vrdma first)"
fi
guest_build "$SRC/tests/conformance/vm/make_guest.sh" "$PERF" "$BIND" "$STREAM"
export KERNEL INITRD

export W=$(mktemp -d /tmp/lv4vm.XXXXXX)
chmod 0755 "$W"  # QEMU (libvirt-qemu) writes the guest's console log here
export SWNS=lv4sw$$ PNS=lv4p$$
. "$HERE/fabric_lib.sh"  # fabric_cleanup
INSTALLED=0
LOCAL_AA=/etc/apparmor.d/local/abstractions/libvirt-qemu
AA_BEFORE=$(cat "$LOCAL_AA" 2>/dev/null; echo .)
cleanup() {
  fabric_cleanup
  [ $INSTALLED = 1 ] && dpkg --purge vrdma > "$W/purge.out" 2>&1
  [ -n "${KEEP_WORK:-}" ] && echo "kept $W" || rm -rf "$W"
}
trap cleanup EXIT
die() { echo "FAIL: $*" >&2; exit 1; }

# 1. The package: built from the build, installed as an operator would.
DEB=$("$SRC/integration/packaging/make_host_deb.sh" "$SRC" "$BUILD" "$W/deb") || die "make_host_deb.sh failed"
echo "package: $(basename "$DEB") ($(du -k "$DEB" | cut -f1) KiB): $(dpkg-deb -f "$DEB" Depends)"
INSTALLED=1
dpkg -i "$DEB" > "$W/install.out" 2>&1 || { cat "$W/install.out"; die "dpkg -i $(basename "$DEB") failed"; }
for f in /usr/sbin/vrdmad /usr/bin/vrdmactl /usr/bin/vrdma-perf /etc/libvirt/hooks/qemu.d/vrdma; do
  [ -x "$f" ] || die "the package did not install $f"
done
[ "$(stat -c '%U %a' /run/vrdma 2>/dev/null)" = "root 755" ] || die "the postinst did not make /run/vrdma (root, 0755)"
grep -qx "include <abstractions/vrdma-qemu>" "$LOCAL_AA" || die "the postinst did not include abstractions/vrdma-qemu in $LOCAL_AA"
dpkg-query -W -f='${Conffiles}\n' vrdma | grep -q "/etc/default/vrdma" || die "/etc/default/vrdma is not a conffile"
/usr/bin/vrdmactl --version | grep -q "$(dpkg-deb -f "$DEB" Version)" || die "the installed vrdmactl does not say the package's version"
echo "installed: $(/usr/bin/vrdmactl --version)"
# The operator's settings: the hook's log, and (for the memory check) the backends' write journals.
printf 'VRDMA_HOOK_LOG=%s/hook.log\nexport VRDMA_WRITE_JOURNAL=%s/journal-%%p.bin\n' "$W" "$W" >> /etc/default/vrdma
export VRDMACTL=/usr/bin/vrdmactl

. "$HERE/vm_domain.sh"
export -f vm_domain_xml
export LV_PREFIX=lv4 LV_NET=10.98.4 LV_STOCK=1

inner() {
  set -u
  . "$HERE/memcheck_lib.sh"
  . "$HERE/fabric_lib.sh"
  . "$HERE/../../conformance/serial_lib.sh"  # stream_verdict
  GIP=10.88.4.12 GMAC=52:54:00:88:04:0c GUEST=10.88.4.2 NICMAC=52:54:00:88:04:02 PEER=10.88.4.3
  MSGS=${VM_MIGRATE_MESSAGES:-1000000}
  fail() {
    echo "FAIL: $*" >&2
    echo "--- hook log"; cat "$W/hook.log" 2>/dev/null
    echo "--- console"; tr -d '\r' < "$W/console.log" 2>/dev/null | grep -v "progress" | tail -15
    for h in a b; do
      d=LV_${h^^}_DIR
      for f in "${!d}"/run/vrdma/*.log; do [ -f "$f" ] && { echo "--- $f"; grep -v "ring .* stopped" "$f" | tail -12; }; done
      echo "--- qemu log on $h"; tail -8 "${!d}/var/log/libvirt/qemu/lv4g1.log" 2>/dev/null
      echo "--- libvirtd on $h"; grep -i error "${!d}/var/log/libvirt/libvirtd.log" 2>/dev/null | tail -5
    done
    echo "--- peer"; cat "$W/peer.log"
    ip netns pids $PNS 2>/dev/null | xargs -r kill 2>/dev/null
    exit 1
  } >&2
  # owner_mode PATH: "USER:GROUP MODE"
  owner_mode() { stat -c '%U:%G %a' "$1" 2>/dev/null; }
  # qemu_user HOST_DIR: the user the domain's QEMU runs as
  qemu_user() { ps -o user= -p "$(cat "$1/run/libvirt/qemu/lv4g1.pid" 2>/dev/null)" 2>/dev/null; }
  guest_fabric || fail "cannot build the fabric"
  ip netns exec $PNS timeout 900 "$STREAM" -d soft:$PEER -n "$MSGS" --limit 800 --end-file "$W/end-stream" > "$W/peer.log" 2>&1 &
  peer_pid=$!

  # The hosts booted: tmpfiles.d made each one's /run/vrdma.
  for h in a b; do
    d=LV_${h^^}_DIR
    [ "$(owner_mode "${!d}/run/vrdma")" = "root:root 755" ] || fail "host $h booted without /run/vrdma (root, 0755) from tmpfiles.d"
  done
  vm_domain_xml lv4g1 512 "vrdma.ip=$GUEST vrdma.peer=$PEER vrdma.stream=$MSGS" "$NICMAC" vmtap0 "$W/console.log" > "$W/base.xml"
  "$VRDMACTL" domain attach --xml "$W/base.xml" --socket /run/vrdma/lv4g1.sock --engine soft:$GIP --mac $GMAC --announce vg \
    > "$W/dom.xml" || fail "vrdmactl domain attach failed"
  A="virsh -q -c $LV_A_URI" B="virsh -q -c $LV_B_URI"
  $A create "$W/dom.xml" > /dev/null || fail "virsh create on host a failed"
  SOCK_A=$LV_A_DIR/run/vrdma/lv4g1.sock
  [ "$(qemu_user "$LV_A_DIR")" = libvirt-qemu ] || fail "QEMU on host a runs as '$(qemu_user "$LV_A_DIR")', not libvirt-qemu"
  [ "$(owner_mode "$SOCK_A")" = "root:libvirt-qemu 660" ] || fail "vrdmad's socket on host a is $(owner_mode "$SOCK_A"), not root:libvirt-qemu 660"
  [ "$(readlink "/proc/$(cat "$SOCK_A.pid")/exe")" = /usr/sbin/vrdmad ] || fail "the hook did not start the installed /usr/sbin/vrdmad"
  # The backend serving (the supervisor's child) keeps CAP_CHOWN, CAP_NET_ADMIN, CAP_NET_RAW and CAP_IPC_LOCK only.
  srv=$(pgrep -P "$(cat "$SOCK_A.pid")" | head -1)
  caps=$(grep -E '^(CapEff|CapBnd|NoNewPrivs):' "/proc/$srv/status" 2>/dev/null | tr -s '\t ' ' ' | tr '\n' ' ')
  [ "$caps" = "CapEff: 0000000000007001 CapBnd: 0000000000007001 NoNewPrivs: 1 " ] ||
    fail "the serving vrdmad ($srv) holds more than CAP_CHOWN, CAP_NET_ADMIN, CAP_NET_RAW and CAP_IPC_LOCK: $caps"
  echo "host a: QEMU as libvirt-qemu, vrdmad's socket $(owner_mode "$SOCK_A"), /usr/sbin/vrdmad from the package's hook, holding cap_chown,cap_net_admin,cap_net_raw,cap_ipc_lock only"
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
  listed=$(nsenter -t "$LV_A_PID" -m -u -n "$VRDMACTL" list --json)
  echo "$listed" | grep -q '"domain":"lv4g1"' || fail "vrdmactl list (its default folder, /run/vrdma) does not show the guest's backend: $listed"
  echo "guest streaming on host a ($(progress) messages); vrdmactl list shows its backend"

  # 1. a -> b with virsh.
  p0=$(progress); t0=$(date +%s%N)
  virsh_move_a_to_b lv4g1 "$SOCK_A.pid"  # sets t1
  SOCK_B=$LV_B_DIR/run/vrdma/lv4g1.lv4-b.sock
  [ "$(qemu_user "$LV_B_DIR")" = libvirt-qemu ] || fail "QEMU on host b runs as '$(qemu_user "$LV_B_DIR")', not libvirt-qemu"
  [ "$(owner_mode "$SOCK_B")" = "root:libvirt-qemu 660" ] || fail "vrdmad's socket on host b is $(owner_mode "$SOCK_B"), not root:libvirt-qemu 660"
  echo "virsh migrate a -> b: $(( (t1 - t0) / 1000000 )) ms wall, stream at $p0 messages"
  wait_progress $((p0 + 1500)) 240 || fail "the stream made no progress on host b (at $(progress))"

  # 2. Host a reboots: no domain there now; its /run starts empty and tmpfiles.d makes /run/vrdma.
  [ -z "$($A list --name)" ] || fail "host a still has a domain after the move: $($A list --name)"
  touch "$LV_A_DIR/run/vrdma/left-from-before"
  "$LV_REBOOT" a || fail "host a did not come back from its reboot"
  [ ! -e "$LV_A_DIR/run/vrdma/left-from-before" ] || fail "host a's /run survived the reboot"
  [ "$(owner_mode "$LV_A_DIR/run/vrdma")" = "root:root 755" ] || fail "host a rebooted without /run/vrdma (root, 0755)"
  echo "host a rebooted: /run emptied, /run/vrdma made again by tmpfiles.d"

  # 3. b -> a (the rebooted host) with vrdmactl migrate.
  p1=$(progress)
  vrdmactl_move_b_to_a lv4g1 "$SOCK_B.pid"
  SOCK_A2=$LV_A_DIR/run/vrdma/lv4g1.lv4-a.sock
  [ "$(qemu_user "$LV_A_DIR")" = libvirt-qemu ] || fail "QEMU on the rebooted host a runs as '$(qemu_user "$LV_A_DIR")'"
  [ "$(owner_mode "$SOCK_A2")" = "root:libvirt-qemu 660" ] || fail "vrdmad's socket on the rebooted host a is $(owner_mode "$SOCK_A2")"
  wait_progress $((p1 + 1500)) 240 || fail "the stream made no progress on the rebooted host a (at $(progress))"
  touch "$W/end-stream"

  stream_verdict "$W/console.log" "$W/peer.log" "$peer_pid" $((p1 + 1500))
  echo "the switch dropped $(fabric_dropped) RoCE packets"
  for _ in $(seq 100); do [ -z "$($A list --name)" ] && break; sleep 0.1; done
  grep -q "lv4-a lv4g1 prepare begin: started backend" "$W/hook.log" || fail "the package's hook did not start the backend on host a"
  grep -q "lv4-b lv4g1 migrate begin: started vrdmad --incoming" "$W/hook.log" || fail "the package's hook on host b did not start vrdmad --incoming"
  grep -q "lv4-a lv4g1 migrate begin: started vrdmad --incoming" "$W/hook.log" || fail "the package's hook on the rebooted host a did not start vrdmad --incoming"
  echo "hook calls:"; sed 's/^/  /' "$W/hook.log"
}
export -f inner
. "$HERE/memcheck_lib.sh"
rc=0
memcheck_scenario "$SRC/tests/integration/integration/two_hosts.sh" bash -c inner || rc=$?
[ $rc = 0 ] || exit $rc

# 4. dpkg --purge takes everything back.
INSTALLED=0
dpkg --purge vrdma > "$W/purge.out" 2>&1 || { cat "$W/purge.out"; die "dpkg --purge vrdma failed"; }
for f in /usr/sbin/vrdmad /usr/bin/vrdmactl /etc/libvirt/hooks/qemu.d/vrdma /etc/default/vrdma /etc/apparmor.d/abstractions/vrdma-qemu; do
  [ ! -e "$f" ] || die "dpkg --purge left $f"
done
[ "$(cat "$LOCAL_AA" 2>/dev/null; echo .)" = "$AA_BEFORE" ] || die "dpkg --purge did not take the AppArmor include back out of $LOCAL_AA"
echo "purged: binaries, hook, settings and the AppArmor include are gone"
