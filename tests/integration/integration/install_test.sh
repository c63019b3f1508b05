#!/usr/bin/env bash
# cmake --install of the integration component into a DESTDIR: vrdmactl, the libvirt hook (which
# execs the installed vrdmactl and reads the defaults file), vrdma@.service (which runs the
# installed vrdmad) and the defaults file, at the configured prefix's places.
# Usage: install_test.sh BUILD_DIR PREFIX SYSCONFDIR SBINDIR
set -uo pipefail
B=$1 PREFIX=$2 ETC=$3 SBIN=$4
D=$(mktemp -d /tmp/lv9inst.XXXXXX)
trap 'rm -rf "$D"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
DESTDIR=$D cmake --install "$B" --component integration >/dev/null || fail "cmake --install failed"
[ -x "$D$PREFIX/bin/vrdmactl" ] || fail "no $PREFIX/bin/vrdmactl"
u=$("$D$PREFIX/bin/vrdmactl" --help 2>&1)
echo "$u" | grep -q "^  migrate  *live-migrate a libvirt domain" || fail "the installed vrdmactl does not run: $u"
H=$D$ETC/libvirt/hooks/qemu.d/vrdma
[ -x "$H" ] || fail "no executable $ETC/libvirt/hooks/qemu.d/vrdma"
[ ! -e "$D$ETC/libvirt/hooks/qemu" ] || fail "the install replaces the operator's own $ETC/libvirt/hooks/qemu"
T=$D$PREFIX/lib/tmpfiles.d/vrdma.conf
grep -q "^d /run/vrdma 0755 root root -$" "$T" || fail "no tmpfiles.d entry making /run/vrdma at boot"
grep -q "^exec $PREFIX/bin/vrdmactl hook qemu \"\$@\"$" "$H" || fail "the hook does not exec the installed vrdmactl"
grep -q "\. $ETC/default/vrdma" "$H" || fail "the hook does not read $ETC/default/vrdma"
[ -f "$D$ETC/default/vrdma" ] || fail "no $ETC/default/vrdma"
U=$D$PREFIX/lib/systemd/system/vrdma@.service
[ -f "$U" ] || fail "no vrdma@.service"
grep -q "^ExecStart=$SBIN/vrdmad --supervise \$VRDMAD_ARGS$" "$U" || fail "the unit does not run $SBIN/vrdmad"
grep -q "^EnvironmentFile=$ETC/vrdma/%i.conf$" "$U" || fail "the unit does not read $ETC/vrdma/%i.conf"
! grep -qE "@[A-Z_]+@" "$H" "$U" || fail "an unsubstituted @VAR@ in the hook or the unit"
echo "install layout ok under $PREFIX"
