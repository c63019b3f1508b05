#!/usr/bin/env bash
# The two-host libvirt rig itself: two libvirtds with their own names, UUIDs and addresses that
# reach each other over the veth pair (qemu+tcp, as a p2p migration does), and nothing left
# behind afterwards (processes, mounts, links, the rig's folder).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }

inner() {
  set -e
  [ "$(virsh -q -c "$LV_A_URI" hostname)" = lv9-a ] || fail "host a is not called lv9-a"
  [ "$(virsh -q -c "$LV_B_URI" hostname)" = lv9-b ] || fail "host b is not called lv9-b"
  ua=$(virsh -q -c "$LV_A_URI" capabilities | sed -n 's:.*<uuid>\(.*\)</uuid>.*:\1:p' | head -1)
  ub=$(virsh -q -c "$LV_B_URI" capabilities | sed -n 's:.*<uuid>\(.*\)</uuid>.*:\1:p' | head -1)
  [ -n "$ua" ] && [ "$ua" != "$ub" ] || fail "the hosts' UUIDs are not distinct ($ua, $ub)"
  [ "$(nsenter -t "$LV_A_PID" -n virsh -q -c "$LV_B_TCP" hostname)" = lv9-b ] || fail "a cannot reach b's libvirtd"
  [ "$(nsenter -t "$LV_B_PID" -n virsh -q -c "$LV_A_TCP" hostname)" = lv9-a ] || fail "b cannot reach a's libvirtd"
  [ "$(readlink /proc/$LV_A_PID/ns/net)" != "$(readlink /proc/self/ns/net)" ] || fail "host a shares our netns"
  ! grep -q "$LV_ROOT" /proc/self/mountinfo || fail "the rig's bind mounts leak into our mount namespace"
  echo "$LV_ROOT $(cat "$LV_A_DIR/libvirtd.pid") $(cat "$LV_B_DIR/libvirtd.pid")" > "$OUT"
  echo "rig ok: lv9-a $ua, lv9-b $ub"
}
export -f inner fail
export OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
"$HERE/two_hosts.sh" bash -c inner
rc=$?
[ $rc = 77 ] && exit 77
[ $rc = 0 ] || fail "the rig or its checks failed (status $rc)"
read -r root pa pb < "$OUT"
[ ! -e "$root" ] || fail "$root is left behind"
for p in $pa $pb; do [ ! -d /proc/$p ] || fail "libvirtd $p still runs"; done
! ip link show lv9a >/dev/null 2>&1 || fail "veth lv9a is left behind"
! grep -q "$root" /proc/self/mountinfo || fail "mounts of $root are left behind"
echo "teardown ok: no processes, mounts, links or files left"
