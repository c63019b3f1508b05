#!/usr/bin/env bash
# Debian 13 (trixie) beside Debian 12 for the conformance rigs (../shared/RIG.md): a minbase
# debootstrap tree with QEMU 10, built once from Debian's archive into $VRDMA_RIG_CACHE
# (default /var/cache/vrdma-rig)/trixie (~80 s, ~380 MB), and a wrapper that runs its QEMU on
# this host through the tree's own dynamic loader and libraries (no chroot: the rigs' paths,
# sockets and network namespaces stay as they are).
#   debian13.sh qemu     prints the path of the wrapper (use it as qemu-system-x86_64);
#                        exits 3 with the reason on stderr when the tree cannot be had
#   debian13.sh kernel   Debian 13's kernel for the guests, what builds modules for it, and the
#                        guests' Debian 13 user space: a second tree, $CACHE/trixie-kbuild (a
#                        copy of the first with Debian 13's linux-headers-amd64, gcc, make, dkms,
#                        rdma-core 56 and the RDMA tools, ~1.3 GB, ~1 minute once),
#                        and the image package of the headers' kernel in $CACHE; prints
#                        KTREE=<that tree>, KVER=<the kernel's release>, KDEB=<the image .deb>
#                        (tests/conformance/guest_lib.sh's guest_kernel with VRDMA_GUEST_DEBIAN=13)
# The trees are built under a lock, so concurrent rigs wait for one build.
set -euo pipefail
CACHE=${VRDMA_RIG_CACHE:-/var/cache/vrdma-rig}
TREE=$CACHE/trixie
unavailable() { echo "debian13: $*" >&2; exit 3; }
case "${1:-}" in qemu | kernel) ;; *) echo "usage: debian13.sh qemu|kernel" >&2; exit 2 ;; esac
mkdir -p "$CACHE"

ensure_tree() {
  [ -x "$TREE/usr/bin/qemu-system-x86_64" ] && return 0
  command -v debootstrap >/dev/null || unavailable "debootstrap is not installed (apt-get install debootstrap)"
  [ "$(id -u)" -eq 0 ] || unavailable "building the Debian 13 tree needs root (debootstrap)"
  local mirror
  mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  mirror=${mirror:-http://deb.debian.org/debian}
  rm -rf "$TREE.tmp"
  echo "debian13: building the Debian 13 tree with QEMU 10 in $TREE (once; about a minute and a half)" >&2
  timeout 900 debootstrap --variant=minbase --include=qemu-system-x86,qemu-utils trixie "$TREE.tmp" "$mirror" \
    >"$CACHE/trixie-debootstrap.log" 2>&1 ||
    unavailable "debootstrap of trixie from $mirror failed; see $CACHE/trixie-debootstrap.log"
  mv "$TREE.tmp" "$TREE"
}

# ensure_kbuild: the guests' Debian 13 tree (a copy of the first, so that QEMU 10's stays as the
# rigs know it): what builds modules for Debian 13's kernel, and the user space a Debian 13 guest
# gets (rdma-core 56's libibverbs and its headers, for the provider too; the tools the kernel-driver
# rigs run); and the image of the kernel its headers are for. The packages it holds are written in
# its .ready: a tree made for a shorter list gets the rest installed in place.
KBUILD_PKGS="linux-headers-amd64 gcc make dkms xz-utils libc6-dev libibverbs-dev ibverbs-utils perftest rdmacm-utils
  iproute2 nvme-cli strace ucx-utils cmake ninja-build"
ensure_kbuild() {
  local kt=$CACHE/trixie-kbuild want
  want=$(echo $KBUILD_PKGS)
  if [ ! -f "$kt/.ready" ]; then
    [ "$(id -u)" -eq 0 ] || unavailable "building the Debian 13 guest tree needs root (chroot)"
    echo "debian13: building the Debian 13 guest tree in $kt (once; about a minute)" >&2
    rm -rf "$kt.tmp"
    cp -a "$TREE" "$kt.tmp"
    kbuild_install "$kt.tmp" "$want" || { rm -rf "$kt.tmp"; exit 3; }
    rm -rf "$kt"
    mv "$kt.tmp" "$kt"
  elif [ "$(cat "$kt/.ready")" != "$want" ]; then
    echo "debian13: adding packages to the Debian 13 guest tree in $kt" >&2
    kbuild_install "$kt" "$want" || exit 3
  fi
  local hdr kver deb
  hdr=$(cd "$kt/usr/src" && ls -d linux-headers-*-amd64 2>/dev/null | head -1 || true)
  [ -n "$hdr" ] || unavailable "no linux-headers-*-amd64 in $kt/usr/src"
  kver=${hdr#linux-headers-}
  deb=$(ls "$CACHE"/linux-image-"$kver"_*.deb 2>/dev/null | head -1 || true)
  if [ -z "$deb" ]; then
    rm -rf "$kt/tmp/kimage" && mkdir -p "$kt/tmp/kimage"
    timeout 300 chroot "$kt" sh -c "cd /tmp/kimage && apt-get download -qq linux-image-$kver" >>"$CACHE/trixie-kbuild.log" 2>&1 ||
      unavailable "cannot download linux-image-$kver in the Debian 13 tree; see $CACHE/trixie-kbuild.log"
    mv "$kt"/tmp/kimage/*.deb "$CACHE/"
    deb=$(ls "$CACHE"/linux-image-"$kver"_*.deb | head -1)
  fi
  echo "KTREE=$kt"
  echo "KVER=$kver"
  echo "KDEB=$deb"
}

# kbuild_install TREE PACKAGES: apt-get installs them in TREE (chroot, with this host's resolver
# configuration), then writes its .ready.
kbuild_install() {
  cp /etc/resolv.conf "$1/etc/resolv.conf" 2>/dev/null || true
  # shellcheck disable=SC2086
  { timeout 300 chroot "$1" apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive timeout 900 chroot "$1" apt-get install -y -qq --no-install-recommends $2 &&
    chroot "$1" apt-get clean; } >"$CACHE/trixie-kbuild.log" 2>&1 ||
    { echo "debian13: apt-get in the Debian 13 tree failed; see $CACHE/trixie-kbuild.log" >&2; return 1; }
  echo "$2" > "$1/.ready"
}

exec 9>"$CACHE/trixie.lock"
flock 9
ensure_tree
if [ "$1" = kernel ]; then ensure_kbuild; exit 0; fi
WRAP=$TREE/qemu10
if [ ! -x "$WRAP" ]; then
  cat > "$WRAP.tmp" <<EOF
#!/bin/sh
# QEMU 10 from the Debian 13 tree, run on this host through the tree's loader and libraries.
QEMU_MODULE_DIR=$TREE/usr/lib/x86_64-linux-gnu/qemu
export QEMU_MODULE_DIR
exec $TREE/lib64/ld-linux-x86-64.so.2 --library-path $TREE/lib/x86_64-linux-gnu:$TREE/usr/lib/x86_64-linux-gnu \\
  $TREE/usr/bin/qemu-system-x86_64 -L $TREE/usr/share/qemu -L $TREE/usr/share/seabios "\$@"
EOF
  chmod +x "$WRAP.tmp"
  mv "$WRAP.tmp" "$WRAP"
fi
"$WRAP" --version 2>/dev/null | grep -q "QEMU emulator version 10" || unavailable "$WRAP does not run QEMU 10: $("$WRAP" --version 2>&1 | head -2)"
echo "$WRAP"
