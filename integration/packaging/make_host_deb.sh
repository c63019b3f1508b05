#!/usr/bin/env bash
# The host side of vrdma as a Debian package, vrdma_<version>_<arch>.deb (docs/operations.md
# "Install from the package"): vrdmad, vrdmactl and vrdma-perf, the libvirt hook in
# /etc/libvirt/hooks/qemu.d/, /etc/default/vrdma, vrdma@.service, tmpfiles.d for /run/vrdma, the
# AppArmor abstraction that lets libvirt's QEMU reach the sockets, man pages, bash completion and
# the operator's documents. Made from an existing build: `cmake --install BUILD --component
# integration --prefix /usr --strip` into a staging tree (every installed path is the /usr
# layout's, never the build's configure-time prefix), dependencies from dpkg-shlibdeps, every file
# under /etc a conffile. Needs dpkg-deb and dpkg-shlibdeps (dpkg-dev); no root.
#   make_host_deb.sh SOURCE_DIR BUILD_DIR OUT_DIR     prints the path of the .deb it wrote
set -euo pipefail
usage="usage: make_host_deb.sh SOURCE_DIR BUILD_DIR OUT_DIR  (builds OUT_DIR/vrdma_<version>_<arch>.deb from BUILD_DIR)"
[ "${1:-}" = --help ] && { echo "$usage"; exit 0; }
[ $# -eq 3 ] || { echo "$usage" >&2; exit 2; }
BUILD=$(readlink -f "$2")
[ -f "$BUILD/CMakeCache.txt" ] || { echo "make_host_deb: $2 is not a CMake build folder (configure and build it first)" >&2; exit 1; }
for t in vrdmad vrdmactl; do
  [ -n "$(find "$BUILD" -name "$t" -type f -perm -u+x -print -quit)" ] ||
    { echo "make_host_deb: $BUILD has no $t: build it first (ninja -C $BUILD)" >&2; exit 1; }
done
. "$(dirname "$0")/../../guest/packaging/package_lib.sh"
pkg_setup make_host_deb "$usage" "$1" "$3"  # SRC OUT VER STAGE

R=$STAGE/root
DESTDIR=$R cmake --install "$BUILD" --component integration --prefix /usr --strip >/dev/null
DOC=$R/usr/share/doc/vrdma
# Man pages compressed, as dh_compress leaves them.
find "$R/usr/share/man" -type f ! -name '*.gz' -exec gzip -9n {} +
install -d "$DOC" "$R/DEBIAN"
cat > "$DOC/copyright" <<CPY
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: vrdma

Files: *
Copyright: vrdma developers
License: GPL-2.0-only or BSD-2-Clause
 On Debian systems the full text of the GNU General Public License version 2 is in
 /usr/share/common-licenses/GPL-2; the BSD 2-clause license is in LICENSES/BSD-2-Clause.txt of the
 source and below.
 .
$(sed -e 's/^$/./' -e 's/^/ /' "$SRC/LICENSES/BSD-2-Clause.txt")
CPY
cat > "$DOC/README.Debian" <<'DOC'
vrdma on a Debian host
----------------------
vrdmad serves a guest's virtio RDMA device (one process per device); libvirt's QEMU hook
(/etc/libvirt/hooks/qemu.d/vrdma) starts and stops it as domains start, stop and migrate.

After installing, once:  restart libvirtd (it finds new hook scripts only when it starts).
Attach:   vrdmactl domain attach --xml DOMAIN.xml --socket /run/vrdma/GUEST.sock \
            --engine soft:GUEST_IPV4 --mac 52:54:00:.. > DOMAIN-rdma.xml
          virsh define DOMAIN-rdma.xml && virsh start GUEST
Watch:    vrdmactl list        (every backend, its objects and counters; --json, --prometheus)
Migrate:  virsh migrate --live GUEST qemu+ssh://OTHER/system   (vrdma installed there too)

Settings: /etc/default/vrdma. Sockets: /run/vrdma (made at boot by tmpfiles.d), root:<QEMU's
group> 0660, the group libvirt's qemu.conf gives QEMU (libvirt-qemu by default). Where AppArmor
is on, QEMU reaches them through /etc/apparmor.d/abstractions/vrdma-qemu, included from
/etc/apparmor.d/local/abstractions/libvirt-qemu by this package. Backends started without
libvirt: vrdma@GUEST.service with /etc/vrdma/GUEST.conf.
More: integration.md and operations.md in this folder, and vrdmactl(8), vrdmad(8).
DOC
(cd "$R" && find etc -type f | sort | sed 's|^|/|') > "$R/DEBIAN/conffiles"

# Package relations: the libraries the programs link, as dpkg-shlibdeps finds them.
SH=$STAGE/shlibs
mkdir -p "$SH/debian"
printf 'Source: vrdma\n\nPackage: vrdma\nArchitecture: any\n' > "$SH/debian/control"
bins=$(find "$R/usr/bin" "$R/usr/sbin" -type f -perm -u+x)
deps=$(cd "$SH" && dpkg-shlibdeps -O -e $bins 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
[ -n "$deps" ] || { echo "make_host_deb: dpkg-shlibdeps found no dependencies (is dpkg-dev installed?)" >&2; exit 1; }
ARCH=$(dpkg --print-architecture)
size=$(du -sk --exclude=DEBIAN "$R" | cut -f1)
cat > "$R/DEBIAN/control" <<CTL
Package: vrdma
Version: $VER
Architecture: $ARCH
Section: net
Priority: optional
Maintainer: vrdma developers <vrdma@localhost>
Depends: $deps
Recommends: libvirt-daemon-system, qemu-system-x86
Suggests: ibverbs-providers, rdma-core
Installed-Size: $size
Description: virtio RDMA device backend for KVM/QEMU and libvirt hosts
 vrdma gives virtual machines a paravirtual RDMA device (RoCEv2) and moves their RDMA
 connections with them when they live-migrate. This package holds the host side:
  - vrdmad, the backend of one guest's device, over the host's RDMA NIC (any rdma-core
    device or SR-IOV VF) or over its own software RoCEv2 engine on a plain NIC;
  - vrdmactl, which attaches the device to libvirt domains, migrates them, lists the
    backends and their counters, and manages the SR-IOV VF pool;
  - the libvirt hook that starts and stops the backends with the domains;
  - vrdma-perf, bandwidth and latency tests speaking perftest's exchange.
CTL
cat > "$R/DEBIAN/postinst" <<'SH'
#!/bin/sh
# vrdma postinst: /run/vrdma now (as tmpfiles.d makes it at boot), QEMU's AppArmor rule.
set -e
LOCAL=/etc/apparmor.d/local/abstractions/libvirt-qemu
LINE="include <abstractions/vrdma-qemu>"
if [ "$1" = configure ]; then
  if command -v systemd-tmpfiles >/dev/null 2>&1; then
    systemd-tmpfiles --create /usr/lib/tmpfiles.d/vrdma.conf || true
  fi
  [ -d /run/vrdma ] || install -d -m 0755 /run/vrdma
  if [ -d /etc/apparmor.d/abstractions ]; then
    mkdir -p "${LOCAL%/*}"
    grep -qxF "$LINE" "$LOCAL" 2>/dev/null || printf '# Added by the vrdma package: QEMU reaches vrdmad'"'"'s sockets.\n%s\n' "$LINE" >> "$LOCAL"
  fi
  if [ -d /run/systemd/system ]; then systemctl daemon-reload >/dev/null 2>&1 || true; fi
  if pidof libvirtd virtqemud >/dev/null 2>&1; then
    echo "vrdma: restart libvirtd (or virtqemud) once so that it runs /etc/libvirt/hooks/qemu.d/vrdma; running domains keep going."
  fi
fi
exit 0
SH
cat > "$R/DEBIAN/postrm" <<'SH'
#!/bin/sh
# vrdma postrm: take back the AppArmor include; on purge, the VF ledger and the hook's log too.
set -e
LOCAL=/etc/apparmor.d/local/abstractions/libvirt-qemu
case "$1" in
  remove|purge)
    if [ -f "$LOCAL" ]; then
      sed -i -e '/^# Added by the vrdma package: /d' -e '/^include <abstractions\/vrdma-qemu>$/d' "$LOCAL"
    fi
    rmdir /run/vrdma 2>/dev/null || true
    ;;
esac
if [ "$1" = purge ]; then
  rm -rf /var/lib/vrdma
  rm -f /var/log/vrdma-hook.log
fi
if [ -d /run/systemd/system ]; then systemctl daemon-reload >/dev/null 2>&1 || true; fi
exit 0
SH
chmod 0755 "$R/DEBIAN/postinst" "$R/DEBIAN/postrm"
deb="$OUT/vrdma_${VER}_${ARCH}.deb"
dpkg-deb --root-owner-group -Zxz --build "$R" "$deb" >/dev/null
echo "$deb"
