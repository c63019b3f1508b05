#!/usr/bin/env bash
# Builds the conformance guest: the Debian 6.1 kernel (as ../shared/RIG.md describes) and a
# busybox-static initramfs whose /init runs the checksummed block test on /dev/vda.
# Everything downloaded is cached in $VRDMA_RIG_CACHE (../guest_lib.sh), so a second run takes
# about a second. Prints "KERNEL=<path> INITRD=<path>" on success; exits 3
# (with a reason on stderr) when the kernel or busybox cannot be obtained.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../guest_lib.sh"
guest_kernel
guest_tools

INITRD="$CACHE/vhost-guest-$KVER.cpio.gz"
if guest_stale "$INITRD" "$HERE/guest_init.sh"; then
  ROOT=$(mktemp -d)
  trap 'rm -rf "$ROOT"' EXIT
  guest_root "$ROOT"
  guest_modules "$ROOT" virtio_blk virtio_pci
  depmod -b "$ROOT" "$KVER"
  guest_pack "$ROOT" "$HERE/guest_init.sh" "$INITRD"
fi
echo "KERNEL=$KERNEL INITRD=$INITRD"
