# Sourced by the guest builders (tests/conformance/{vhost,rxe,vm}/make_guest.sh): the parts of a
# TCG test guest they share (../shared/RIG.md). Downloads are cached in $VRDMA_RIG_CACHE
# (default /var/cache/vrdma-rig). A part that cannot be had ends the builder with status 3 and a
# reason on stderr (the tests then skip).
CACHE=${VRDMA_RIG_CACHE:-/var/cache/vrdma-rig}
GUEST_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$CACHE"

skip() { echo "make_guest: $*" >&2; exit 3; }

# Debian's current kernel package, downloaded and unpacked once: sets KPKG, KVER, KDIR, KERNEL
# (the bzImage) and MODDIR (its modules, with modules.dep). With VRDMA_GUEST_DEBIAN=13, Debian
# 13's (debian13.sh kernel; also sets KTREE, the Debian 13 tree that builds modules for it, and
# UTREE, the same tree as the guest's user space: guest_files); its modules come xz-compressed
# and are unpacked here (busybox's modprobe in the guests loads .ko).
guest_kernel() {
  KTREE="" UTREE=""
  if [ "${VRDMA_GUEST_DEBIAN:-12}" = 13 ]; then
    local k13
    k13=$("$GUEST_LIB_DIR/debian13.sh" kernel) || skip "Debian 13's kernel is not to be had here (above)"
    KTREE=$(echo "$k13" | sed -n 's/^KTREE=//p') KVER=$(echo "$k13" | sed -n 's/^KVER=//p')
    UTREE=$KTREE
    KPKG=linux-image-$KVER
  else
    KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1)
    [ -n "$KPKG" ] || KPKG=linux-image-6.1.0-57-amd64
    KVER=${KPKG#linux-image-}
  fi
  if ! ls "$CACHE"/${KPKG}_*.deb >/dev/null 2>&1; then
    (cd "$CACHE" && timeout 300 apt-get download "$KPKG" >/dev/null 2>&1) || skip "cannot download $KPKG (no network or apt mirror?)"
  fi
  KDIR="$CACHE/kernel-$KVER"
  command -v depmod >/dev/null || skip "depmod (package kmod) is not installed"
  if [ ! -f "$KDIR/lib/modules/$KVER/modules.dep" ]; then
    rm -rf "$KDIR"
    dpkg-deb -x "$CACHE"/${KPKG}_*.deb "$KDIR"
    if [ ! -d "$KDIR/lib/modules" ] && [ -d "$KDIR/usr/lib/modules" ]; then  # Debian 13: merged /usr
      mkdir -p "$KDIR/lib" && mv "$KDIR/usr/lib/modules" "$KDIR/lib/modules"
    fi
    find "$KDIR/lib/modules/$KVER" -name '*.ko.xz' -exec xz -d {} +
    depmod -b "$KDIR" "$KVER"
  fi
  KERNEL="$KDIR/boot/vmlinuz-$KVER"
  [ -f "$KERNEL" ] || skip "kernel image missing from $KPKG"
  MODDIR="$KDIR/lib/modules/$KVER"
}

# The headers of the guest kernel (after guest_kernel), to build modules for it (virtio_rdma.ko,
# siw): linux-headers-$KVER, installed from the archive when missing (scripts/setup.sh installs
# linux-headers-amd64, the same version while the archive has not moved on). Sets KHDR.
guest_headers() {
  KHDR=/usr/src/linux-headers-$KVER
  if [ -n "${KTREE:-}" ]; then  # Debian 13's: in its tree, built there (kmod_build)
    [ -f "$KTREE$KHDR/Makefile" ] || skip "the Debian 13 tree $KTREE has no $KHDR/Makefile"
    return 0
  fi
  if [ ! -f "$KHDR/Makefile" ]; then
    DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq --no-install-recommends "linux-headers-$KVER" \
      >/dev/null 2>&1 || skip "cannot install linux-headers-$KVER (no network or apt mirror?)"
  fi
  [ -f "$KHDR/Makefile" ] || skip "linux-headers-$KVER has no $KHDR/Makefile"
  command -v make >/dev/null && command -v cc >/dev/null || skip "make and cc (build-essential) are not installed"
}

# A static busybox and cpio on the host: sets BUSYBOX.
guest_tools() {
  BUSYBOX=$(command -v busybox || true)
  local bb_ldd
  bb_ldd=$( [ -n "$BUSYBOX" ] && ldd "$BUSYBOX" 2>&1 || true)
  case "$bb_ldd" in *"not a dynamic"*) ;; *) skip "busybox-static is not installed" ;; esac
  command -v cpio >/dev/null || skip "cpio is not installed"
}

# guest_root ROOT: the initramfs skeleton: busybox with every applet it has, /sbin/modprobe.
guest_root() {
  mkdir -p "$1"/{bin,sbin,proc,sys,dev,tmp,lib/modules/$KVER}
  cp "$BUSYBOX" "$1/bin/busybox"
  local a
  for a in $("$BUSYBOX" --list); do [ -e "$1/bin/$a" ] || ln -s busybox "$1/bin/$a"; done
  ln -sf ../bin/busybox "$1/sbin/modprobe"
  install -m 755 "$GUEST_LIB_DIR/nvmet_target.sh" "$1/bin/nvmet-target"
}

# guest_modules ROOT MODULE...: the modules with their dependencies (modules.dep); one that is
# not a module of this kernel (built in, or gone) is left out with a note. Run depmod after.
guest_modules() {
  local root=$1 m line f
  shift
  for m in "$@"; do
    line=$(grep -E "/${m}\.ko(\.xz|\.zst)?:" "$MODDIR/modules.dep" || true)
    [ -n "$line" ] || { echo "make_guest: $m is not a module of $KPKG (built in?)" >&2; continue; }
    echo "$line" | tr ':' ' ' | tr ' ' '\n'
  done | grep -v '^$' | sort -u | while read -r f; do
    mkdir -p "$root/lib/modules/$KVER/$(dirname "$f")"
    cp "$MODDIR/$f" "$root/lib/modules/$KVER/$f"
  done
  cp "$MODDIR"/modules.{builtin,order} "$root/lib/modules/$KVER/" 2>/dev/null || true
}

# Where a guest's programs and libraries come from: this host (UTREE empty), or with
# VRDMA_GUEST_DEBIAN=13 the Debian 13 tree (guest_kernel sets UTREE=$KTREE), whose paths the
# functions below take as the guest's (/usr/bin/x is $UTREE/usr/bin/x) and whose ldd they ask,
# in the tree (chroot), for the libraries; a guest never mixes the two C libraries.
# in_utree CMD...: CMD run in the user-space tree (or here).
in_utree() { if [ -n "${UTREE:-}" ]; then chroot "$UTREE" "$@"; else "$@"; fi; }

# guest_which PROGRAM...: each program's path, as `command -v` in the user-space tree finds it;
# a missing one prints nothing (callers count the words).
guest_which() {
  local p
  for p in "$@"; do in_utree sh -c "command -v $p" || true; done
}

# guest_libs ROOT FILE...: every library ldd lists for the files, and libgcc_s (glibc loads it
# at run time for thread cancellation; ldd does not list it), at their own paths.
guest_libs() {
  local root=$1 f
  shift
  for f in $(for f in "$@"; do in_utree ldd "$f" 2>/dev/null | awk '/=>/ {print $3} /^\t\/lib/ {print $1}'; done | sort -u) \
           $(in_utree readlink -f /lib/x86_64-linux-gnu/libgcc_s.so.1) /lib/x86_64-linux-gnu/libgcc_s.so.1; do
    [ -e "${UTREE:-}$f" ] || continue
    mkdir -p "$root/$(dirname "$f")"
    cp -L "${UTREE:-}$f" "$root/$f"
  done
}

# guest_files ROOT FILE...: the files at their own paths, and their libraries (guest_libs).
guest_files() {
  local root=$1 f
  shift
  for f in "$@"; do
    mkdir -p "$root/$(dirname "$f")"
    cp -L "${UTREE:-}$f" "$root/$f"
  done
  guest_libs "$root" "$@"
}

# guest_cc ROOT NAME CC-ARG...: a program compiled for the guest's user space (this host's cc, or
# the user-space tree's against its own headers and libraries) into ROOT/usr/bin/NAME, with the
# libraries it needs (guest_libs). Files and -I folders among the arguments are this host's paths.
guest_cc() {
  local root=$1 name=$2 kw a i=0 args=() rc=0
  shift 2
  mkdir -p "$root/usr/bin"
  if [ -z "${UTREE:-}" ]; then
    kw=$(mktemp -d)
    cc "$@" -o "$kw/$name" >&2 && cp "$kw/$name" "$root/usr/bin/" && guest_libs "$root" "$kw/$name" || rc=1
    rm -rf "$kw"
    return $rc
  fi
  kw=$(mktemp -d "$UTREE/tmp/vrdma-cc.XXXXXX")
  for a in "$@"; do
    i=$((i + 1))
    if [[ $a == -I* ]] && [ -d "${a#-I}" ]; then
      cp -a "${a#-I}" "$kw/inc$i" && a="-I${kw#"$UTREE"}/inc$i"
    elif [ -f "$a" ]; then
      cp "$a" "$kw/" && a="${kw#"$UTREE"}/$(basename "$a")"
    fi
    args+=("$a")
  done
  chroot "$UTREE" cc "${args[@]}" -o "${kw#"$UTREE"}/$name" >&2 && cp "$kw/$name" "$root/usr/bin/" &&
    guest_libs "$root" "${kw#"$UTREE"}/$name" || rc=1
  rm -rf "$kw"
  return $rc
}

# guest_stale INITRD FILE...: true when INITRD is missing or older than a FILE, the calling
# builder ($0), this file or guest_steps.sh (what the initramfs is made of).
guest_stale() {
  local out=$1 f
  shift
  [ -f "$out" ] || return 0
  for f in "$@" "$0" "$GUEST_LIB_DIR/guest_lib.sh" "$GUEST_LIB_DIR/guest_steps.sh" "$GUEST_LIB_DIR/nvmet_target.sh"; do
    [ "$f" -nt "$out" ] && return 0
  done
  return 1
}

# guest_pack ROOT INIT OUT: INIT as /init (with guest_steps.sh as /steps.sh, which it may
# source), the tree as a gzipped newc cpio at OUT.
guest_pack() {
  cp "$2" "$1/init"
  chmod +x "$1/init"
  cp "$GUEST_LIB_DIR/guest_steps.sh" "$1/steps.sh"
  (cd "$1" && find . | cpio -o -H newc --quiet | gzip -1) > "$3.tmp"
  mv "$3.tmp" "$3"
}
