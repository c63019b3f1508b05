#!/usr/bin/env bash
# Builds the paravirtual-verbs guest (../shared/RIG.md): Debian's 6.1 kernel and a busybox-static
# initramfs carrying our guest binaries (vrdma-perf, pvverbs-bind, vrdma-stream) with every
# library they load, the modules virtio_pci, virtio_blk (so pvverbs-bind has something to take
# the function from), virtio_net and uio_pci_generic, and guest_init.sh as /init.
#   make_guest.sh VRDMA_PERF PVVERBS_BIND VRDMA_STREAM
# The initramfs is rebuilt when a binary or script is newer. Prints "KERNEL=<path> INITRD=<path>";
# exits 3 with a reason on stderr when a part is missing.
set -euo pipefail
PERF=$(readlink -f "$1"); BIND=$(readlink -f "$2"); STREAM=$(readlink -f "$3")
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../guest_lib.sh"
guest_kernel
guest_tools

INITRD="$CACHE/pv-guest-$KVER.cpio.gz"
if guest_stale "$INITRD" "$HERE/guest_init.sh" "$PERF" "$BIND" "$STREAM"; then
  ROOT=$(mktemp -d)
  trap 'rm -rf "$ROOT"' EXIT
  guest_root "$ROOT"
  guest_modules "$ROOT" virtio_pci virtio_blk virtio_net uio_pci_generic
  depmod -b "$ROOT" "$KVER"
  mkdir -p "$ROOT/usr/bin"
  cp "$PERF" "$ROOT/usr/bin/vrdma-perf"
  cp "$BIND" "$ROOT/usr/bin/pvverbs-bind"
  cp "$STREAM" "$ROOT/usr/bin/vrdma-stream"
  guest_libs "$ROOT" "$PERF" "$BIND" "$STREAM"
  guest_pack "$ROOT" "$HERE/guest_init.sh" "$INITRD"
fi
echo "KERNEL=$KERNEL INITRD=$INITRD"
