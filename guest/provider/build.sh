#!/usr/bin/env bash
# Builds libvrdma (vrdma.c), the rdma-core provider of virtio_rdma.ko's devices, for the host's
# libibverbs (Debian 12: rdma-core 44.0, provider ABI IBVERBS_PRIVATE_34). libibverbs' provider
# interface (infiniband/driver.h, ibv_cmd_*) is only in rdma-core's source, so that source is
# fetched once from Debian's archive (apt-get source with a private deb-src list: the machine
# needs none of its own) into $VRDMA_RIG_CACHE (default /var/cache/vrdma-rig)/rdma-core-VERSION,
# and its CMake configured once for the generated headers (build/include; nothing of it is
# built but the uverbs ABI header). Nothing of rdma-core is copied into this repository.
#   build.sh OUTDIR      writes OUTDIR/libvrdma-rdmav34.so and OUTDIR/vrdma.driver
# Exits 3 with a reason on stderr when the source cannot be had (the tests then skip).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../.." && pwd)
OUT=$1
CACHE=${VRDMA_RIG_CACHE:-/var/cache/vrdma-rig}
unavailable() { echo "provider: $*" >&2; exit 3; }

VER=$(dpkg-query -W -f='${Version}' libibverbs1 2>/dev/null) || unavailable "libibverbs1 is not installed"
UPVER=${VER%-*}
RC="$CACHE/rdma-core-$UPVER"
PABI=$(objdump -T /usr/lib/x86_64-linux-gnu/libibverbs.so.1 2>/dev/null | grep -o 'IBVERBS_PRIVATE_[0-9]*' | head -1)
[ -n "$PABI" ] || unavailable "no IBVERBS_PRIVATE_ version in libibverbs.so.1 (objdump from binutils?)"

mkdir -p "$CACHE"
exec 9>"$CACHE/rdma-core.lock"
flock 9
if [ ! -f "$RC/libibverbs/driver.h" ]; then
  tmp=$(mktemp -d "$CACHE/rdma-core-src.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/lists/partial"
  echo "deb-src http://deb.debian.org/debian $(. /etc/os-release && echo "$VERSION_CODENAME") main" > "$tmp/sources.list"
  apt_opts=(-o Dir::Etc::SourceList="$tmp/sources.list" -o Dir::Etc::SourceParts=/dev/null
            -o Dir::State::Lists="$tmp/lists" -o APT::Sandbox::User=root)
  timeout 300 apt-get "${apt_opts[@]}" update >"$tmp/apt.log" 2>&1 || unavailable "apt-get update of deb-src failed: $(tail -1 "$tmp/apt.log")"
  (cd "$tmp" && timeout 300 apt-get "${apt_opts[@]}" source --download-only "rdma-core=$VER" >>"$tmp/apt.log" 2>&1) ||
    unavailable "cannot download rdma-core $VER's source: $(grep -E '^E:' "$tmp/apt.log" | head -1)"
  (cd "$tmp" && dpkg-source --no-check -x rdma-core_*.dsc "src" >>"$tmp/apt.log" 2>&1) || unavailable "dpkg-source -x failed"
  rm -rf "$RC"
  mv "$tmp/src" "$RC"
fi
if [ ! -f "$RC/build/include/kernel-abi/ib_user_verbs.h" ]; then
  command -v cmake >/dev/null && command -v ninja >/dev/null || unavailable "cmake and ninja are needed to configure rdma-core"
  rm -rf "$RC/build"
  cmake -S "$RC" -B "$RC/build" -G Ninja -DNO_MAN_PAGES=1 -DNO_PYVERBS=1 -DENABLE_RESOLVE_NEIGH=0 \
    >"$CACHE/rdma-core-cmake.log" 2>&1 || unavailable "rdma-core's CMake failed: see $CACHE/rdma-core-cmake.log"
  ninja -C "$RC/build" include/kernel-abi/ib_user_verbs.h >>"$CACHE/rdma-core-cmake.log" 2>&1 ||
    unavailable "rdma-core's ABI header could not be generated: see $CACHE/rdma-core-cmake.log"
fi
flock -u 9
grep -q "^set(IBVERBS_PABI_VERSION \"${PABI#IBVERBS_PRIVATE_}\")" "$RC/CMakeLists.txt" || unavailable "rdma-core in $RC is not of $PABI"

# The provider's ABI suffix is the private ABI's number (rdmav34 for IBVERBS_PRIVATE_34).
mkdir -p "$OUT"
cc -std=gnu11 -O2 -g -fPIC -shared -Wall -Wextra -Werror -D_GNU_SOURCE \
  -include "$RC/build/include/config.h" -isystem "$RC/build/include" -I"$SRC/include" -I"$SRC/guest/include" \
  -Wl,-z,defs -o "$OUT/libvrdma-rdmav${PABI#IBVERBS_PRIVATE_}.so" "$HERE/vrdma.c" /usr/lib/x86_64-linux-gnu/libibverbs.so.1
echo "driver vrdma" > "$OUT/vrdma.driver"
