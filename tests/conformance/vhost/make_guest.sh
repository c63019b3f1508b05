#!/usr/bin/env bash
# Builds the conformance guest: the Debian 6.1 kernel (as ../shared/RIG.md describes) and a
# busybox-static initramfs whose /init runs the checksummed block test on /dev/vda.
# Everything downloaded is cached in $VRDMA_RIG_CACHE (default /var/cache/vrdma-rig), so a
# second run takes about a second. Prints "KERNEL=<path> INITRD=<path>" on success; exits 3
# (with a reason on stderr) when the kernel or busybox cannot be obtained.
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
  (cd "$CACHE" && timeout 300 apt-get download "$KPKG" >/dev/null 2>&1) || skip "cannot download $KPKG (no network or apt mirror?)"
fi
KDIR="$CACHE/kernel-$KVER"
if [ ! -f "$KDIR/lib/modules/$KVER/modules.dep" ]; then
  rm -rf "$KDIR"
  dpkg-deb -x "$CACHE"/${KPKG}_*.deb "$KDIR"
  command -v depmod >/dev/null || skip "depmod (package kmod) is not installed"
  depmod -b "$KDIR" "$KVER"
fi
KERNEL="$KDIR/boot/vmlinuz-$KVER"
[ -f "$KERNEL" ] || skip "kernel image missing from $KPKG"

BUSYBOX=$(command -v busybox || true)
[ -n "$BUSYBOX" ] && file_is_static=$(ldd "$BUSYBOX" 2>&1 | grep -c "not a dynamic" || true)
[ -n "$BUSYBOX" ] && [ "${file_is_static:-0}" -ge 1 ] || skip "busybox-static is not installed"
command -v cpio >/dev/null || skip "cpio is not installed"

INITRD="$CACHE/vhost-guest-$KVER.cpio.gz"
if [ ! -f "$INITRD" ] || [ "$HERE/guest_init.sh" -nt "$INITRD" ] || [ "$0" -nt "$INITRD" ]; then
  ROOT=$(mktemp -d)
  trap 'rm -rf "$ROOT"' EXIT
  mkdir -p "$ROOT"/{bin,sbin,proc,sys,dev,tmp,lib/modules/$KVER}
  cp "$BUSYBOX" "$ROOT/bin/busybox"
  for a in sh mount umount mkdir cat echo dd md5sum sha256sum sleep poweroff modprobe insmod taskset seq \
           grep awk cut tr wc ls head tail sync test [ timeout kill uname; do
    ln -sf busybox "$ROOT/bin/$a"
  done
  ln -sf ../bin/busybox "$ROOT/sbin/modprobe"
  MODDIR="$KDIR/lib/modules/$KVER"
  # virtio_blk and virtio_pci with their dependencies, straight from modules.dep.
  want="virtio_blk virtio_pci"
  mods=$(for m in $want; do
    line=$(grep -E "/${m}\.ko(\.xz|\.zst)?:" "$MODDIR/modules.dep" || true)
    [ -n "$line" ] && echo "$line" | tr ':' ' ' | tr ' ' '\n'
  done | grep -v '^$' | sort -u)
  for f in $mods; do
    mkdir -p "$ROOT/lib/modules/$KVER/$(dirname "$f")"
    cp "$MODDIR/$f" "$ROOT/lib/modules/$KVER/$f"
  done
  cp "$MODDIR"/modules.{dep,builtin,order,alias} "$ROOT/lib/modules/$KVER/" 2>/dev/null || true
  depmod -b "$ROOT" "$KVER" 2>/dev/null || true
  cp "$HERE/guest_init.sh" "$ROOT/init"
  chmod +x "$ROOT/init"
  (cd "$ROOT" && find . | cpio -o -H newc --quiet | gzip -1) > "$INITRD.tmp"
  mv "$INITRD.tmp" "$INITRD"
fi
echo "KERNEL=$KERNEL INITRD=$INITRD"
