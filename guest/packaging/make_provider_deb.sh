#!/usr/bin/env bash
# The rdma-core provider of virtio_rdma.ko's devices as a Debian package,
# ibverbs-provider-vrdma_<version>_<arch>.deb (docs/virtio-rdma.md "The rdma-core provider"):
# libvrdma-rdmav<ABI>.so where this machine's libibverbs loads providers from
# (/usr/lib/<multiarch>/libibverbs/, as Debian's ibverbs-providers puts its own) and
# /etc/libibverbs.d/vrdma.driver, which names it. Built by guest/provider/build.sh for the
# installed libibverbs (its private provider ABI, IBVERBS_PRIVATE_<n>, is in the file name and
# the package's dependency: a libibverbs of the same ABI, at least the installed version). The
# version is the project's (CMakeLists.txt). Needs dpkg-deb; no root (build.sh may fetch
# rdma-core's source into its cache, which wants write access there).
#   make_provider_deb.sh SOURCE_DIR OUT_DIR     prints the path of the .deb it wrote
# Exits 3 with build.sh's reason when the provider cannot be built here.
set -euo pipefail
usage="usage: make_provider_deb.sh SOURCE_DIR OUT_DIR  (builds OUT_DIR/ibverbs-provider-vrdma_<version>_<arch>.deb)"
. "$(dirname "$0")/package_lib.sh"
pkg_setup make_provider_deb "$usage" "$@"  # SRC OUT VER STAGE
rc=0
"$SRC/guest/provider/build.sh" "$STAGE/build" >&2 || rc=$?
[ $rc -eq 0 ] || exit $rc
so=$(cd "$STAGE/build" && ls libvrdma-rdmav*.so)
pabi=${so#libvrdma-rdmav}
pabi=${pabi%.so}
ARCH=$(dpkg --print-architecture)
LIBDIR=$(dirname "$(readlink -f /usr/lib/"$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)"/libibverbs.so.1)")
IBV=$(dpkg-query -W -f='${Version}' libibverbs1)
install -d "$STAGE/root$LIBDIR/libibverbs" "$STAGE/root/etc/libibverbs.d" "$STAGE/root/DEBIAN" \
  "$STAGE/root/usr/share/doc/ibverbs-provider-vrdma"
install -m 0644 "$STAGE/build/$so" "$STAGE/root$LIBDIR/libibverbs/"
# As dh_strip leaves a shared library: its symbols for linking only (the debug information would
# belong in a -dbgsym package).
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$STAGE/root$LIBDIR/libibverbs/$so"
glibc=$(objdump -T "$STAGE/root$LIBDIR/libibverbs/$so" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
install -m 0644 "$STAGE/build/vrdma.driver" "$STAGE/root/etc/libibverbs.d/"
cat > "$STAGE/root/usr/share/doc/ibverbs-provider-vrdma/README" <<DOC
libvrdma, the rdma-core (libibverbs) provider of the vrdma virtio RDMA device's guest kernel
driver (virtio_rdma.ko, package virtio-rdma-dkms). With both installed, unmodified verbs and
RDMA-CM software (ibv_devinfo, perftest, rping, UCX) runs on vrdma0:
  ibv_devices                      vrdma0 is listed
  ibv_devinfo -d vrdma0            its port, MTU and GIDs
Send and receive rings and completion rings are mapped into each process; posting writes the work
request and rings a doorbell the process reaches without a system call.
Built for libibverbs $IBV (provider ABI IBVERBS_PRIVATE_$pabi).
DOC
gzip -9n "$STAGE/root/usr/share/doc/ibverbs-provider-vrdma/README"
size=$(du -sk --exclude=DEBIAN "$STAGE/root" | cut -f1)
cat > "$STAGE/root/DEBIAN/control" <<CTL
Package: ibverbs-provider-vrdma
Version: $VER
Architecture: $ARCH
Section: libs
Priority: optional
Maintainer: vrdma developers <vrdma@localhost>
Depends: libibverbs1 (>= ${IBV%-*}), libc6 (>= ${glibc#GLIBC_})
Recommends: virtio-rdma-dkms (= $VER)
Installed-Size: $size
Description: virtio RDMA device (vrdma) - rdma-core provider
 libvrdma-rdmav$pabi.so lets libibverbs drive vrdma0, the RDMA device virtio_rdma.ko gives a
 virtual machine on the vrdma virtio RDMA device: unmodified verbs and RDMA-CM applications
 (perftest, rping, UCX, libfabric) run in the guest. The data path (posting work requests,
 polling completions) runs in the process without system calls.
CTL
deb="$OUT/ibverbs-provider-vrdma_${VER}_${ARCH}.deb"
dpkg-deb --root-owner-group -Zxz --build "$STAGE/root" "$deb" >/dev/null
echo "$deb"
