#!/usr/bin/env bash
# Builds the paravirtual-verbs guest (../shared/RIG.md): Debian's 6.1 kernel and a busybox-static
# initramfs carrying our guest binaries (vrdma-perf, pvverbs-bind, vrdma-stream) with every library they
# load, the modules virtio_pci, virtio_blk (so pvverbs-bind has something to take the function
# from), virtio_net and uio_pci_generic, and guest_init.sh as /init.
#   make_guest.sh VRDMA_PERF PVVERBS_BIND VRDMA_STREAM
# Downloads are cached in $VRDMA_RIG_CACHE (default /var/cache/vrdma-rig); the initramfs is
# rebuilt when a binary or script is newer. Prints "KERNEL=<path> INITRD=<path>"; exits 3 with
# a reason on stderr when a part is missing.
set -euo pipefail
PERF=$(readlink -f "$1"); BIND=$(readlink -f "$2"); STREAM=$(readlink -f "$3")
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

BUSYBOX=$(command -v busybox || true)
bb_ldd=$( [ -n "$BUSYBOX" ] && ldd "$BUSYBOX" 2>&1 || true)
case "$bb_ldd" in *"not a dynamic"*) ;; *) skip "busybox-static is not installed" ;; esac
command -v cpio >/dev/null || skip "cpio is not installed"

INITRD="$CACHE/pv-guest-$KVER.cpio.gz"
if [ ! -f "$INITRD" ] || [ "$HERE/guest_init.sh" -nt "$INITRD" ] || [ "$0" -nt "$INITRD" ] ||
   [ "$PERF" -nt "$INITRD" ] || [ "$BIND" -nt "$INITRD" ] || [ "$STREAM" -nt "$INITRD" ]; then
  ROOT=$(mktemp -d)
  trap 'rm -rf "$ROOT"' EXIT
  mkdir -p "$ROOT"/{bin,sbin,proc,sys,dev,tmp,lib/modules/$KVER}
  cp "$BUSYBOX" "$ROOT/bin/busybox"
  for a in $("$BUSYBOX" --list); do [ -e "$ROOT/bin/$a" ] || ln -s busybox "$ROOT/bin/$a"; done
  ln -sf ../bin/busybox "$ROOT/sbin/modprobe"
  # Kernel modules with their dependencies, from modules.dep.
  for m in virtio_pci virtio_blk virtio_net uio_pci_generic; do
    line=$(grep -E "/${m}\.ko(\.xz|\.zst)?:" "$MODDIR/modules.dep" || true)
    [ -n "$line" ] || skip "module $m is not in $KPKG"
    echo "$line" | tr ':' ' ' | tr ' ' '\n'
  done | grep -v '^$' | sort -u | while read -r f; do
    mkdir -p "$ROOT/lib/modules/$KVER/$(dirname "$f")"
    cp "$MODDIR/$f" "$ROOT/lib/modules/$KVER/$f"
  done
  cp "$MODDIR"/modules.{builtin,order} "$ROOT/lib/modules/$KVER/" 2>/dev/null || true
  depmod -b "$ROOT" "$KVER"
  # Our binaries, every library they load, and libgcc_s (glibc loads it at run time for thread
  # cancellation; ldd does not list it).
  mkdir -p "$ROOT/usr/bin"
  cp "$PERF" "$ROOT/usr/bin/vrdma-perf"
  cp "$BIND" "$ROOT/usr/bin/pvverbs-bind"
  cp "$STREAM" "$ROOT/usr/bin/vrdma-stream"
  libs=$(for f in "$PERF" "$BIND" "$STREAM"; do ldd "$f" | awk '/=>/ {print $3} /^\t\/lib/ {print $1}'; done | sort -u)
  for f in $libs $(readlink -f /lib/x86_64-linux-gnu/libgcc_s.so.1) /lib/x86_64-linux-gnu/libgcc_s.so.1; do
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
