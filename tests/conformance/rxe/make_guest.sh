#!/usr/bin/env bash
# Builds the reference-peer guest (../shared/RIG.md): Debian's 6.1 kernel, whose rdma_rxe is
# Linux Soft-RoCE, and a busybox-static initramfs carrying the host's rdma-core, ibverbs-utils,
# perftest and rdmacm-utils (copied with every library they load) and guest_init.sh as /init.
# It also builds siw (Soft-iWARP, not in Debian's kernel) from Debian's kernel source (below).
# Downloads are cached in $VRDMA_RIG_CACHE (default /var/cache/vrdma-rig).
# Prints "KERNEL=<path> INITRD=<path>"; exits 3 with a reason on stderr when a part is missing.
set -euo pipefail
CACHE=${VRDMA_RIG_CACHE:-/var/cache/vrdma-rig}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$CACHE"
cd "$CACHE"

skip() { echo "make_guest: $*" >&2; exit 3; }

KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1)
[ -n "$KPKG" ] || KPKG=linux-image-6.1.0-57-amd64
KVER=${KPKG#linux-image-}
if ! ls "$CACHE"/${KPKG}_*.deb >/dev/null 2>&1; then
  timeout 300 apt-get download "$KPKG" >/dev/null 2>&1 || skip "cannot download $KPKG (no network or apt mirror?)"
fi
KDIR="$CACHE/kernel-$KVER"
command -v depmod >/dev/null || skip "depmod (package kmod) is not installed"
if [ ! -f "$KDIR/lib/modules/$KVER/modules.dep" ]; then
  rm -rf "$KDIR"
  dpkg-deb -x "$CACHE"/${KPKG}_*.deb "$KDIR"
  depmod -b "$KDIR" "$KVER"
fi
KERNEL="$KDIR/boot/vmlinuz-$KVER"
[ -f "$KERNEL" ] || skip "kernel image missing from $KPKG"
MODDIR="$KDIR/lib/modules/$KVER"

# siw (Soft-iWARP, CONFIG_RDMA_SIW is unset in Debian's kernel) from Debian's own source for
# exactly this kernel ABI. SIW=auto (default) builds it when the matching linux-headers are
# installed, SIW=0 never; a siw that cannot be built leaves the guest without it (our engine has
# no iWARP yet, so siw is loaded and listed, not yet a peer).
SIW_KO=""
build_siw() {
  local ko="$CACHE/siw-$KVER/siw.ko" hdr=/usr/src/linux-headers-$KVER src
  [ -f "$ko" ] && { SIW_KO=$ko; return 0; }
  [ -d "$hdr" ] || { echo "make_guest: no siw: linux-headers-$KVER is not installed" >&2; return 0; }
  if ! ls "$CACHE"/linux-source-6.1_*.deb >/dev/null 2>&1; then
    timeout 600 apt-get download linux-source-6.1 >/dev/null 2>&1 || { echo "make_guest: no siw: cannot download linux-source-6.1" >&2; return 0; }
  fi
  src=$(mktemp -d)
  if dpkg-deb --fsys-tarfile "$CACHE"/linux-source-6.1_*.deb | tar -x -C "$src" --wildcards '*/linux-source-6.1.tar.xz' &&
     tar -xJf "$src"/usr/src/linux-source-6.1.tar.xz -C "$src" linux-source-6.1/drivers/infiniband/sw/siw &&
     make -s -C "$hdr" M="$src/linux-source-6.1/drivers/infiniband/sw/siw" CONFIG_RDMA_SIW=m modules >/dev/null; then
    mkdir -p "$CACHE/siw-$KVER"
    cp "$src/linux-source-6.1/drivers/infiniband/sw/siw/siw.ko" "$ko"
    SIW_KO=$ko
  else
    echo "make_guest: no siw: building it from linux-source-6.1 failed" >&2
  fi
  rm -rf "$src"
}
[ "${SIW:-auto}" = 0 ] || build_siw

BUSYBOX=$(command -v busybox || true)
bb_ldd=$( [ -n "$BUSYBOX" ] && ldd "$BUSYBOX" 2>&1 || true)
case "$bb_ldd" in *"not a dynamic"*) ;; *) skip "busybox-static is not installed" ;; esac
command -v cpio >/dev/null || skip "cpio is not installed"
TOOLS="ibv_devinfo ibv_rc_pingpong ib_write_bw ib_read_bw ib_send_bw ib_send_lat rping rdma"
for t in $TOOLS; do command -v "$t" >/dev/null || skip "$t is not installed (perftest ibverbs-utils rdmacm-utils iproute2)"; done

INITRD="$CACHE/rxe-guest-$KVER${SIW_KO:+-siw}.cpio.gz"
if [ ! -f "$INITRD" ] || [ "$HERE/guest_init.sh" -nt "$INITRD" ] || [ "$0" -nt "$INITRD" ]; then
  ROOT=$(mktemp -d)
  trap 'rm -rf "$ROOT"' EXIT
  mkdir -p "$ROOT"/{bin,sbin,proc,sys,dev,tmp,etc/libibverbs.d,lib/modules/$KVER}
  cp "$BUSYBOX" "$ROOT/bin/busybox"
  for a in $("$BUSYBOX" --list); do [ -e "$ROOT/bin/$a" ] || ln -s busybox "$ROOT/bin/$a"; done
  ln -sf ../bin/busybox "$ROOT/sbin/modprobe"
  # Kernel modules with their dependencies, from modules.dep.
  want="virtio_net virtio_pci rdma_rxe ib_uverbs rdma_ucm crc32_generic crc32c_generic libcrc32c"  # libcrc32c: siw
  for m in $want; do
    line=$(grep -E "/${m}\.ko(\.xz|\.zst)?:" "$MODDIR/modules.dep" || true)
    [ -n "$line" ] && echo "$line" | tr ':' ' ' | tr ' ' '\n'
  done | grep -v '^$' | sort -u | while read -r f; do
    mkdir -p "$ROOT/lib/modules/$KVER/$(dirname "$f")"
    cp "$MODDIR/$f" "$ROOT/lib/modules/$KVER/$f"
  done
  [ -n "$SIW_KO" ] && mkdir -p "$ROOT/lib/modules/$KVER/extra" && cp "$SIW_KO" "$ROOT/lib/modules/$KVER/extra/"
  cp "$MODDIR"/modules.{builtin,order} "$ROOT/lib/modules/$KVER/" 2>/dev/null || true
  depmod -b "$ROOT" "$KVER"
  # User space: the tools, the rxe/siw verbs providers, every library they load, libgcc_s
  # (glibc loads it at run time for thread cancellation; ldd does not list it).
  files=""
  for t in $TOOLS; do files="$files $(command -v "$t")"; done
  for p in rxe siw; do
    files="$files /usr/lib/x86_64-linux-gnu/libibverbs/lib${p}-rdmav34.so"
    cp /etc/libibverbs.d/$p.driver "$ROOT/etc/libibverbs.d/"
  done
  libs=$(for f in $files; do ldd "$f" | awk '/=>/ {print $3} /^\t\/lib/ {print $1}'; done | sort -u)
  for f in $files $libs $(readlink -f /lib/x86_64-linux-gnu/libgcc_s.so.1) /lib/x86_64-linux-gnu/libgcc_s.so.1; do
    [ -e "$f" ] || continue
    mkdir -p "$ROOT/$(dirname "$f")"
    cp -L "$f" "$ROOT/$f"
  done
  cp "$HERE/guest_init.sh" "$ROOT/init"
  chmod +x "$ROOT/init"
  (cd "$ROOT" && find . | cpio -o -H newc --quiet | gzip -1) > "$INITRD.tmp"
  mv "$INITRD.tmp" "$INITRD"
fi
echo "KERNEL=$KERNEL INITRD=$INITRD"
