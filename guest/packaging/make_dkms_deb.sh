#!/usr/bin/env bash
# The guest kernel driver as a DKMS package, virtio-rdma-dkms_<version>_all.deb (docs/virtio-rdma.md
# "The guest kernel driver"): the module's source under /usr/src/virtio-rdma-<version>/ (Kbuild,
# the C files, dkms.conf, the device contract and the user/kernel ABI in include/vrdma/), which
# DKMS builds for every installed kernel and for each new one (AUTOINSTALL), and
# /lib/modprobe.d/virtio-rdma.conf (`softdep virtio_blk pre: virtio_rdma`: the driver loads before
# virtio_blk, so that it, not virtio_blk, claims the function behind the vhost-user-blk carrier).
# The version is the project's (CMakeLists.txt). Needs only dpkg-deb; no root.
#   make_dkms_deb.sh SOURCE_DIR OUT_DIR     prints the path of the .deb it wrote
set -euo pipefail
usage="usage: make_dkms_deb.sh SOURCE_DIR OUT_DIR  (builds OUT_DIR/virtio-rdma-dkms_<version>_all.deb)"
. "$(dirname "$0")/package_lib.sh"
pkg_setup make_dkms_deb "$usage" "$@"  # SRC OUT VER STAGE
D=$STAGE/usr/src/virtio-rdma-$VER
install -d "$D/include/vrdma" "$STAGE/lib/modprobe.d" "$STAGE/DEBIAN" "$STAGE/usr/share/doc/virtio-rdma-dkms"
install -m 0644 "$SRC"/guest/kernel/{Kbuild,Makefile,*.c,*.h} "$D/"
install -m 0644 "$SRC/include/vrdma/virtio_rdma.h" "$SRC/guest/include/vrdma/virtio_rdma_abi.h" "$D/include/vrdma/"
# dkms.conf names the version the source folder carries.
sed "s/^PACKAGE_VERSION=.*/PACKAGE_VERSION=\"$VER\"/" "$SRC/guest/kernel/dkms.conf" > "$D/dkms.conf"
cat > "$STAGE/lib/modprobe.d/virtio-rdma.conf" <<EOF
# virtio-rdma-dkms: virtio_rdma loads before virtio_blk, so that it claims the virtio RDMA function
# behind its vhost-user-blk carrier (virtio_blk declines nothing; virtio_rdma declines real disks).
softdep virtio_blk pre: virtio_rdma
EOF
cat > "$STAGE/usr/share/doc/virtio-rdma-dkms/README" <<EOF
virtio_rdma.ko, the guest kernel driver of the vrdma virtio RDMA device, in source form.
DKMS builds it for each installed kernel (linux-headers-<kernel> must be installed):
  dkms status virtio-rdma          what is built and installed
  modprobe virtio_rdma             then: rdma link show (vrdma0), ibv_devices
The function behind the vhost-user-blk carrier is claimed when virtio_rdma loads before virtio_blk
(/lib/modprobe.d/virtio-rdma.conf); if virtio_blk took it first (it sits in the initramfs):
  echo virtioN > /sys/bus/virtio/drivers/virtio_blk/unbind
  echo virtioN > /sys/bus/virtio/drivers/virtio_rdma/bind
EOF
size=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
cat > "$STAGE/DEBIAN/control" <<EOF
Package: virtio-rdma-dkms
Version: $VER
Architecture: all
Section: kernel
Priority: optional
Maintainer: vrdma developers <vrdma@localhost>
Depends: dkms (>= 2.8.4)
Recommends: linux-headers-amd64 | linux-headers-generic
Installed-Size: $size
Description: virtio RDMA device driver (vrdma) - DKMS source
 virtio_rdma.ko gives a virtual machine a standard RDMA device (vrdma0) on the vrdma virtio RDMA
 device, so that unmodified verbs and RDMA-CM software runs in the guest. DKMS builds the module
 for each installed kernel. Verbs applications also need the rdma-core provider
 of the vrdma source tree (guest/provider).
EOF
cat > "$STAGE/DEBIAN/postinst" <<EOF
#!/bin/sh
set -e
# Adds, builds and installs the module for the installed kernels, as dh_dkms's postinst does.
if [ "\$1" = configure ]; then
  /usr/lib/dkms/common.postinst virtio-rdma $VER "" "" "\$2"
fi
EOF
cat > "$STAGE/DEBIAN/prerm" <<EOF
#!/bin/sh
set -e
case "\$1" in
  remove|upgrade|deconfigure)
    if [ "\$(dkms status -m virtio-rdma -v $VER)" ]; then dkms remove -m virtio-rdma -v $VER --all; fi ;;
esac
EOF
chmod 0755 "$STAGE/DEBIAN/postinst" "$STAGE/DEBIAN/prerm"
deb="$OUT/virtio-rdma-dkms_${VER}_all.deb"
dpkg-deb --root-owner-group -Zxz --build "$STAGE" "$deb" >/dev/null
echo "$deb"
