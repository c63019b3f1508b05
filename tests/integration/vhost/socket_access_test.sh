#!/usr/bin/env bash
# vrdmad's vhost-user socket under stock libvirt (issue 27): with --socket-group the socket is
# root:GROUP mode 0660, so QEMU running as that group's user connects and another user cannot;
# a second vrdmad on the live socket refuses to start with a sentence and the first one keeps
# serving. Once set up, vrdmad (started as root, as the hook starts it) holds only CAP_CHOWN,
# CAP_NET_ADMIN, CAP_NET_RAW and CAP_IPC_LOCK, in every set including the bounding one, with no-new-privileges; with
# --keep-privileges it keeps what it started with. Real users (libvirt-qemu from Debian's
# libvirt, nobody), setpriv, a network namespace.
# Usage: socket_access_test.sh VRDMAD
set -uo pipefail
VRDMAD=$1
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (a network namespace, setpriv)"; exit 77; }
getent group libvirt-qemu >/dev/null && getent passwd libvirt-qemu >/dev/null ||
  { echo "SKIP: no libvirt-qemu user and group (Debian's libvirt-daemon-system makes them)"; exit 77; }
NS=vsa$$
W=$(mktemp -d /tmp/vrdma-sa.XXXXXX)
chmod 755 "$W"
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; ip netns del $NS 2>/dev/null; rm -rf "$W"; }
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ip netns add $NS && ip -n $NS link set lo up || { echo "cannot make a network namespace"; exit 1; }
ip netns exec $NS "$VRDMAD" --socket "$W/g1.sock" --control "$W/g1.ctl" --engine soft:127.0.0.1 \
  --socket-group libvirt-qemu 2>"$W/g1.log" &
pid=$!
for _ in $(seq 100); do [ -S "$W/g1.ctl" ] && break; sleep 0.1; done
[ -S "$W/g1.sock" ] || { cat "$W/g1.log"; echo "FAIL: vrdmad did not start"; exit 1; }
# CAP_CHOWN (0), CAP_NET_ADMIN (12), CAP_NET_RAW (13) and CAP_IPC_LOCK (14): 0x7001.
status() { grep -E "^($2):" "/proc/$1/status" | tr -s '\t ' ' ' | tr '\n' ' '; }
caps=$(status "$pid" "CapEff|CapPrm|CapInh|CapBnd|CapAmb|NoNewPrivs")
[ "$caps" = "CapInh: 0000000000000000 CapPrm: 0000000000007001 CapEff: 0000000000007001 CapBnd: 0000000000007001 CapAmb: 0000000000000000 NoNewPrivs: 1 " ] ||
  fail "vrdmad's privileges after setup: $caps"
grep -q "vrdmad: capabilities cap_chown,cap_net_admin,cap_net_raw,cap_ipc_lock=ep, no new privileges" "$W/g1.log" || fail "vrdmad did not log what it kept"
[ "$(stat -c '%U:%G %a' "$W/g1.sock")" = "root:libvirt-qemu 660" ] ||
  fail "the socket is $(stat -c '%U:%G %a' "$W/g1.sock"), not root:libvirt-qemu 660"
connect='import socket,sys
s=socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1]); print("connected")
except PermissionError:
    print("refused")'
out=$(setpriv --reuid=libvirt-qemu --regid=libvirt-qemu --clear-groups /usr/bin/python3 -c "$connect" "$W/g1.sock")
[ "$out" = connected ] || fail "QEMU's user libvirt-qemu could not connect: $out"
out=$(setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 -c "$connect" "$W/g1.sock")
[ "$out" = refused ] || fail "user nobody could connect to the socket: $out"
# A second vrdmad for the same socket: refused at once, the first one untouched.
err=$(ip netns exec $NS "$VRDMAD" --socket "$W/g1.sock" --engine soft:127.0.0.1 2>&1)
rc=$?
[ $rc = 1 ] && echo "$err" | grep -q "another process listens on $W/g1.sock (a second backend for the same device?); stop it first" ||
  fail "a second vrdmad on the live socket: exit $rc, $err"
kill -0 "$pid" 2>/dev/null && [ -S "$W/g1.sock" ] || fail "the first vrdmad or its socket is gone"
out=$(setpriv --reuid=libvirt-qemu --regid=libvirt-qemu --clear-groups /usr/bin/python3 -c "$connect" "$W/g1.sock")
[ "$out" = connected ] || fail "the first vrdmad no longer takes QEMU's connection: $out"
# An unknown group is a sentence, exit 1.
err=$(ip netns exec $NS "$VRDMAD" --socket "$W/g2.sock" --engine soft:127.0.0.1 --socket-group no-such-group 2>&1)
[ $? = 1 ] && echo "$err" | grep -q "there is no group no-such-group on this host" || fail "an unknown group: $err"
[ ! -e "$W/g2.sock" ] || fail "vrdmad left a socket behind after refusing its group"
# --keep-privileges: what it started with (root's full set here).
ip netns exec $NS "$VRDMAD" --socket "$W/g3.sock" --control "$W/g3.ctl" --engine soft:127.0.0.1 --keep-privileges 2>"$W/g3.log" &
kpid=$!
for _ in $(seq 100); do [ -S "$W/g3.ctl" ] && break; sleep 0.1; done
[ "$(status "$kpid" CapEff)" = "$(status $$ CapEff)" ] || fail "--keep-privileges: $(status "$kpid" "CapEff|CapBnd")"
grep -q "no new privileges" "$W/g3.log" && fail "--keep-privileges still dropped them"
kill "$kpid"; wait "$kpid" 2>/dev/null
[ $fails = 0 ] && echo "socket access and privileges ok"
[ $fails = 0 ]
