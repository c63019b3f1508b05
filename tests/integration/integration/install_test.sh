#!/usr/bin/env bash
# cmake --install of the integration component (the host's) and the guest component into a
# DESTDIR: vrdmactl and vrdmad, the libvirt hook (which execs the installed vrdmactl and reads the
# defaults file), vrdma@.service (which runs the installed vrdmad), the defaults file, the AppArmor
# abstraction, the man pages and bash completion, at the configured prefix's places; then the same
# with another prefix given at install time (--prefix /usr, as the package does): every path in
# the hook and the unit is that prefix's, never the configure-time one.
# Usage: install_test.sh BUILD_DIR PREFIX SYSCONFDIR SBINDIR
set -uo pipefail
B=$1 PREFIX=$2 ETC=$3 SBIN=$4
D=$(mktemp -d /tmp/lv9inst.XXXXXX)
trap 'rm -rf "$D"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
DESTDIR=$D cmake --install "$B" --component integration >/dev/null || fail "cmake --install failed"
DESTDIR=$D cmake --install "$B" --component guest >/dev/null || fail "cmake --install of the guest component failed"
[ -x "$D$PREFIX/bin/vrdmactl" ] || fail "no $PREFIX/bin/vrdmactl"
[ -x "$D$SBIN/vrdmad" ] || fail "the integration component does not install vrdmad in $SBIN"
[ -x "$D$SBIN/pvverbs-bind" ] || fail "the guest component does not install pvverbs-bind in $SBIN"
grep -q "^  /run/vrdma/\*.sock rw,$" "$D$ETC/apparmor.d/abstractions/vrdma-qemu" ||
  fail "no AppArmor rule for QEMU to reach /run/vrdma/*.sock"
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
# Man pages (made from each tool's --help) and bash completion.
for page in man8/vrdmactl.8 man8/vrdmad.8 man1/vrdma-perf.1 man8/pvverbs-bind.8; do
  M=$D$PREFIX/share/man/$page
  [ -s "$M" ] || fail "no $PREFIX/share/man/$page"
  txt=$(MANWIDTH=100 man -l "$M" 2>&1) || fail "man cannot show $page: $txt"
  echo "$txt" | grep -q "^NAME" && echo "$txt" | grep -q "^OPTIONS" || fail "$page has no NAME or OPTIONS section"
done
txt=$(MANWIDTH=100 man -l "$D$PREFIX/share/man/man8/vrdmactl.8" 2>&1)
for cmd in "vrdmactl domain attach" "vrdmactl migrate" "vrdmactl vf enable" "vrdmactl list"; do
  echo "$txt" | grep -q "^   $cmd\$" || fail "vrdmactl(8) has no section for '$cmd'"
done
echo "$txt" | grep -q "^       --live TEXT" || fail "vrdmactl(8) does not list domain attach --live"
C=$D$PREFIX/share/bash-completion/completions
for t in vrdmactl vrdmad vrdma-perf pvverbs-bind; do [ -s "$C/$t" ] || fail "no bash completion $C/$t"; done
comp() {  # WORDS...: what completing the last word offers
  PATH=$D$PREFIX/bin:$PATH bash -c 'source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _vrdma_complete
    echo "${COMPREPLY[*]}"' _ "$C/vrdmactl" "$@"
}
[ "$(comp vrdmactl do)" = domain ] || fail "completing 'vrdmactl do' gives '$(comp vrdmactl do)'"
[ "$(comp vrdmactl domain attach --li)" = --live ] || fail "completing 'vrdmactl domain attach --li' gives '$(comp vrdmactl domain attach --li)'"
comp vrdmactl "" | grep -qw migrate || fail "completing 'vrdmactl ' does not offer migrate: $(comp vrdmactl "")"
comp vrdmactl vf "" | grep -qw reconcile || fail "completing 'vrdmactl vf ' does not offer reconcile"
echo "install layout ok under $PREFIX"

# The prefix given at install time decides: /usr puts the configuration in /etc, as Debian's
# packages have it.
U2=$(mktemp -d /tmp/lv9inst.XXXXXX)
trap 'rm -rf "$D" "$U2"' EXIT
DESTDIR=$U2 cmake --install "$B" --component integration --prefix /usr >/dev/null || fail "cmake --install --prefix /usr failed"
H=$U2/etc/libvirt/hooks/qemu.d/vrdma
[ -x "$H" ] || fail "--prefix /usr: no executable /etc/libvirt/hooks/qemu.d/vrdma"
grep -q '^exec /usr/bin/vrdmactl hook qemu "\$@"$' "$H" || fail "--prefix /usr: the hook does not exec /usr/bin/vrdmactl: $(tail -1 "$H")"
grep -q '\. /etc/default/vrdma' "$H" || fail "--prefix /usr: the hook does not read /etc/default/vrdma"
grep -q '^ExecStart=/usr/sbin/vrdmad --supervise \$VRDMAD_ARGS$' "$U2/usr/lib/systemd/system/vrdma@.service" ||
  fail "--prefix /usr: the unit does not run /usr/sbin/vrdmad"
[ -f "$U2/etc/default/vrdma" ] && [ -x "$U2/usr/sbin/vrdmad" ] && [ -f "$U2/usr/share/doc/vrdma/integration.md" ] ||
  fail "--prefix /usr: no /etc/default/vrdma, /usr/sbin/vrdmad or /usr/share/doc/vrdma/integration.md"
! grep -rq "$PREFIX/" "$H" "$U2/usr/lib/systemd/system/vrdma@.service" "$U2/etc/apparmor.d/abstractions/vrdma-qemu" ||
  [ "$PREFIX" = /usr ] || fail "--prefix /usr: a path of the configure-time prefix $PREFIX is left"
echo "install layout ok under /usr (prefix given at install time)"
