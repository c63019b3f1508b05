#!/usr/bin/env bash
# Debian 13 (trixie) beside Debian 12 for the conformance rigs (../shared/RIG.md): a minbase
# debootstrap tree with QEMU 10, built once from Debian's archive into $VRDMA_RIG_CACHE
# (default /var/cache/vrdma-rig)/trixie (~80 s, ~380 MB), and a wrapper that runs its QEMU on
# this host through the tree's own dynamic loader and libraries (no chroot: the rigs' paths,
# sockets and network namespaces stay as they are).
#   debian13.sh qemu     prints the path of the wrapper (use it as qemu-system-x86_64);
#                        exits 3 with the reason on stderr when the tree cannot be had
# The tree is built under a lock, so concurrent rigs wait for one build.
set -euo pipefail
CACHE=${VRDMA_RIG_CACHE:-/var/cache/vrdma-rig}
TREE=$CACHE/trixie
unavailable() { echo "debian13: $*" >&2; exit 3; }
[ "${1:-}" = qemu ] || { echo "usage: debian13.sh qemu" >&2; exit 2; }
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

exec 9>"$CACHE/trixie.lock"
flock 9
ensure_tree
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
