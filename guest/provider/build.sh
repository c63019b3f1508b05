#!/usr/bin/env bash
# Builds libvrdma (the *.c here, by role: vrdma.h), the rdma-core provider of virtio_rdma.ko's
# devices, for the host's libibverbs (Debian 12: rdma-core 44.0, provider ABI IBVERBS_PRIVATE_34).
# libibverbs' provider interface (infiniband/driver.h, ibv_cmd_*) is only in rdma-core's source, so that source is
# fetched once from Debian's archive (apt-get source with a private deb-src list: the machine
# needs none of its own; the installed version's, else the next release's of the same private
# ABI, below) into $VRDMA_RIG_CACHE (default /var/cache/vrdma-rig)/rdma-core-VERSION,
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
PABI=$(objdump -T /usr/lib/x86_64-linux-gnu/libibverbs.so.1 2>/dev/null | grep -o 'IBVERBS_PRIVATE_[0-9]*' | head -1)
[ -n "$PABI" ] || unavailable "no IBVERBS_PRIVATE_ version in libibverbs.so.1 (objdump from binutils?)"
CODENAME=$(. /etc/os-release && echo "$VERSION_CODENAME")

# rdma-core's source of exactly the installed libibverbs when the archive has it; else of the
# next Debian release (the archive here answers 404 for rdma-core_44.0.orig.tar.gz, and has
# trixie's 56.1) when that speaks the same private ABI: its CMakeLists says the same
# IBVERBS_PABI_VERSION, and the provider is linked with -z defs against the installed
# libibverbs, so a symbol the older library lacks fails the build rather than the load.
same_pabi() { grep -q "^set(IBVERBS_PABI_VERSION \"${PABI#IBVERBS_PRIVATE_}\")" "$1/CMakeLists.txt" 2>/dev/null; }
fetch() {  # fetch SUITE PACKAGE[=VERSION]: the source into $CACHE/rdma-core-<upstream version>; prints that path
  # Only the upstream tarball is needed (the headers; Debian's rdma-core 44.0-2 carries no
  # patch). It is fetched by the URI and SHA-256 the suite's Sources index gives
  # (apt-get source --print-uris), checked by apt-helper: the archive here lacks some of a
  # source package's files (44.0's tarball, 56.1's .dsc), so dpkg-source cannot always run.
  local suite=$1 what=$2 tmp line uri file hash up
  tmp=$(mktemp -d "$CACHE/rdma-core-src.XXXXXX")
  mkdir -p "$tmp/lists/partial" "$tmp/src"
  echo "deb-src http://deb.debian.org/debian $suite main" > "$tmp/sources.list"
  local apt_opts=(-o Dir::Etc::SourceList="$tmp/sources.list" -o Dir::Etc::SourceParts=/dev/null
                  -o Dir::State::Lists="$tmp/lists" -o APT::Sandbox::User=root)
  if timeout 300 apt-get "${apt_opts[@]}" update >"$tmp/apt.log" 2>&1 &&
     line=$(cd "$tmp" && apt-get "${apt_opts[@]}" source --print-uris "$what" 2>>"$tmp/apt.log" | grep "\.orig\.tar\.") &&
     read -r uri file _ hash <<<"$line" && uri=${uri//\'/} &&
     timeout 300 /usr/lib/apt/apt-helper download-file "$uri" "$tmp/$file" "$hash" >>"$tmp/apt.log" 2>&1 &&
     tar -xf "$tmp/$file" -C "$tmp/src" --strip-components=1; then
    up=${file#rdma-core_}
    up=${up%.orig.tar.*}
    rm -rf "$CACHE/rdma-core-$up"
    mv "$tmp/src" "$CACHE/rdma-core-$up"
    rm -rf "$tmp"
    echo "$CACHE/rdma-core-$up"
    return 0
  fi
  echo "provider: rdma-core's source from $suite ($what) is not to be had: $(grep -E '^(E|W):|404|[Ff]ailed' "$tmp/apt.log" | head -1)" >&2
  rm -rf "$tmp"
  return 1
}

mkdir -p "$CACHE"
exec 9>"$CACHE/rdma-core.lock"
flock 9
RC="$CACHE/rdma-core-${VER%-*}"
if [ ! -f "$RC/libibverbs/driver.h" ]; then
  RC=""
  for d in "$CACHE"/rdma-core-*/; do  # a source fetched before, of the same private ABI
    [ -f "$d/libibverbs/driver.h" ] && same_pabi "$d" && RC=${d%/} && break
  done
fi
if [ -z "$RC" ]; then
  RC=$(fetch "$CODENAME" "rdma-core=$VER") || RC=$(fetch trixie rdma-core) ||
    unavailable "no rdma-core source of $PABI from Debian's archive"
  same_pabi "$RC" || unavailable "rdma-core in $RC is not of $PABI"
  echo "provider: building against rdma-core's source in $RC (libibverbs $VER is installed)" >&2
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
same_pabi "$RC" || unavailable "rdma-core in $RC is not of $PABI"

# The installed library's sizeof(struct ibv_qp_ex), from its own header (libibverbs-dev of the
# same version): struct verbs_qp's comp_mask follows it, and it grew after 44.0 (wr_flush) within
# private ABI 34, so the headers above may not say it (vrdma.h, struct vrdma_vqp).
mkdir -p "$OUT"
DEVVER=$(dpkg-query -W -f='${Version}' libibverbs-dev 2>/dev/null) || unavailable "libibverbs-dev (the installed libibverbs' header) is not installed"
[ "$DEVVER" = "$VER" ] || unavailable "libibverbs-dev $DEVVER is not the installed libibverbs1 $VER"
printf '#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void) { printf("%%zu\\n", sizeof(struct ibv_qp_ex)); return 0; }\n' \
  | cc -x c -o "$OUT/.qp_ex_size" - || unavailable "the installed <infiniband/verbs.h> does not compile"
QP_EX_SIZE=$("$OUT/.qp_ex_size")
rm -f "$OUT/.qp_ex_size"

# The provider's ABI suffix is the private ABI's number (rdmav34 for IBVERBS_PRIVATE_34). Like
# rdma-core's own providers: -fno-strict-aliasing (container_of over libibverbs' structs).
cc -std=gnu11 -O2 -g -fPIC -shared -fvisibility=hidden -fno-strict-aliasing -Wall -Wextra -Werror -D_GNU_SOURCE \
  -DVRDMA_IBV_QP_EX_SIZE="$QP_EX_SIZE" \
  -include "$RC/build/include/config.h" -isystem "$RC/build/include" -I"$SRC/include" -I"$SRC/guest/include" \
  -Wl,-z,defs -o "$OUT/libvrdma-rdmav${PABI#IBVERBS_PRIVATE_}.so" "$HERE"/*.c /usr/lib/x86_64-linux-gnu/libibverbs.so.1
echo "driver vrdma" > "$OUT/vrdma.driver"
