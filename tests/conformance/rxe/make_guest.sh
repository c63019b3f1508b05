#!/usr/bin/env bash
# Builds the reference-peer guest (../shared/RIG.md): Debian's 6.1 kernel, whose rdma_rxe is
# Linux Soft-RoCE, and a busybox-static initramfs carrying the host's rdma-core, ibverbs-utils,
# perftest and rdmacm-utils (copied with every library they load) and guest_init.sh as /init.
# It also builds siw (Soft-iWARP, not in Debian's kernel) from Debian's kernel source (below).
# Downloads are cached in $VRDMA_RIG_CACHE (default /var/cache/vrdma-rig; ../guest_lib.sh).
# With VRDMA_GUEST_DEBIAN=13 the guest is Debian 13's throughout (../guest_lib.sh guest_kernel:
# Linux 6.12, rdma-core 56 and the tools from the Debian 13 tree; no siw, which Debian 13's
# kernel lacks too and which would need linux-source-6.12).
# Prints "KERNEL=<path> INITRD=<path>"; exits 3 with a reason on stderr when a part is missing.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../guest_lib.sh"
cd "$CACHE"
guest_kernel

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
[ "${SIW:-auto}" = 0 ] || [ -n "${KTREE:-}" ] || build_siw

guest_tools
TOOLS="ibv_devinfo ibv_rc_pingpong ibv_ud_pingpong ibv_srq_pingpong ib_write_bw ib_read_bw ib_send_bw ib_send_lat ib_write_lat ib_read_lat ib_atomic_bw rping ucmatose rdma"
for t in $TOOLS; do [ -n "$(guest_which "$t")" ] || skip "$t is not installed (perftest ibverbs-utils rdmacm-utils iproute2)"; done

INITRD="$CACHE/rxe-guest-$KVER${SIW_KO:+-siw}${UTREE:+-deb13}.cpio.gz"
if guest_stale "$INITRD" "$HERE/guest_init.sh"; then
  ROOT=$(mktemp -d)
  trap 'rm -rf "$ROOT"' EXIT
  guest_root "$ROOT"
  mkdir -p "$ROOT/etc/libibverbs.d"
  # nvmet-rdma: the NVMe over Fabrics target a kernel-driver guest connects to (vm_kmod_rxe_test).
  guest_modules "$ROOT" virtio_net virtio_pci rdma_rxe ib_uverbs rdma_ucm crc32_generic crc32c_generic libcrc32c nvmet-rdma  # libcrc32c: siw
  [ -n "$SIW_KO" ] && mkdir -p "$ROOT/lib/modules/$KVER/extra" && cp "$SIW_KO" "$ROOT/lib/modules/$KVER/extra/"
  depmod -b "$ROOT" "$KVER"
  # User space: the tools, the rxe/siw verbs providers, every library they load.
  files=""
  for t in $TOOLS; do files="$files $(guest_which "$t")"; done
  for p in rxe siw; do
    files="$files /usr/lib/x86_64-linux-gnu/libibverbs/lib${p}-rdmav34.so"
    cp "${UTREE:-}/etc/libibverbs.d/$p.driver" "$ROOT/etc/libibverbs.d/"
  done
  # UCX (ucx-utils, when installed): ucx_perftest and the transports it loads (vm_kmod_rxe_test).
  if [ -n "$(guest_which ucx_perftest)" ]; then files="$files $(guest_which ucx_perftest) $(cd "${UTREE:-}/" && ls usr/lib/x86_64-linux-gnu/ucx/libuct_*.so.0 | sed "s|^|/|")"; fi
  # shellcheck disable=SC2086
  guest_files "$ROOT" $files
  guest_pack "$ROOT" "$HERE/guest_init.sh" "$INITRD"
fi
echo "KERNEL=$KERNEL INITRD=$INITRD"
