# shellcheck shell=bash
# Sourced by the rigs whose guest carries the guest kernel driver (kmod_test.sh, tests/bench/guest/
# bench_kmod.sh): the module as users get it and the rdma-core provider, put into an initramfs
# tree (after guest_lib.sh's guest_kernel and guest_headers), and the host's side: the namespace
# and the guest booted on vrdmad's socket.

# kmod_build SRC WORK: the DKMS package (guest/packaging/make_dkms_deb.sh) of the tree at SRC,
# unpacked into WORK/pkg and built by Debian's dkms for the guest's kernel ($KVER, headers $KHDR)
# from its /usr/src tree (unsigned: sign_file names no program, so dkms makes no signing key on
# this host), into WORK/kmod/virtio_rdma.ko. A module built from the same bytes with the same
# headers, compiler and dkms is taken from $CACHE (as siw is); any change builds it again;
# VRDMA_KMOD_REBUILD=1 always builds. Sets KMOD_DEB (the package); says how on stderr ("BUILT").
# For Debian 13's kernel (guest_kernel set KTREE) the same is done inside the Debian 13 tree, by
# its own dkms, gcc and headers (the headers' tools are built for its C library, not this host's).
kmod_build() {
  local src=$1 work=$2 kver_src key cached t ver ko bw rc=0
  # KTREE is UTREE (guest_lib.sh's guest_kernel): in_utree runs there, or here.
  if ! command -v dpkg-deb >/dev/null || ! in_utree sh -c 'command -v dkms' >/dev/null; then echo "dkms or dpkg-deb is not installed" >&2; return 3; fi
  KMOD_DEB=$("$src/guest/packaging/make_dkms_deb.sh" "$src" "$work/deb") || return 1
  dpkg-deb -x "$KMOD_DEB" "$work/pkg"
  kver_src=$(echo "$work"/pkg/usr/src/virtio-rdma-*)
  key=$( (cd "$kver_src" && find . -type f | LC_ALL=C sort | xargs cat;
          in_utree dpkg-query -W -f='${Version}' "linux-headers-$KVER" dkms 2>/dev/null; in_utree cc --version | head -1) | sha256sum | cut -c1-16)
  cached="$CACHE/virtio_rdma-$KVER-$key.ko"
  mkdir -p "$work/kmod" "$work/dkms"
  if [ -f "$cached" ] && [ -z "${VRDMA_KMOD_REBUILD:-}" ]; then
    cp "$cached" "$work/kmod/virtio_rdma.ko"
    echo "BUILT earlier by dkms from the same package (cache $cached): $(modinfo -F vermagic "$work/kmod/virtio_rdma.ko")" >&2
    return 0
  fi
  t=$(date +%s.%N)
  ver=${kver_src##*/virtio-rdma-}
  # Built where the tree's dkms sees it: WORK here, a folder of the tree's /tmp there.
  bw=$work
  if [ -n "${KTREE:-}" ]; then
    bw=$(mktemp -d "$KTREE/tmp/vrdma-kmod.XXXXXX")
    cp -a "$work/pkg" "$bw/pkg"
    mkdir -p "$bw/dkms"
  fi
  in_utree env sign_file=/nonexistent dkms build -m virtio-rdma -v "$ver" -k "$KVER" --sourcetree "${bw#"${KTREE:-}"}/pkg/usr/src" \
    --dkmstree "${bw#"${KTREE:-}"}/dkms" --kernelsourcedir "$KHDR" >"$work/kbuild.log" 2>&1 || rc=$?
  if [ "$bw" != "$work" ]; then
    cp -a "$bw/dkms/." "$work/dkms/"
    rm -rf "$bw"
  fi
  [ $rc = 0 ] || { cat "$work/kbuild.log" >&2; return 1; }
  ko=$(find "$work/dkms/virtio-rdma/$ver/$KVER" -name 'virtio_rdma.ko*' | head -1)
  [ -n "$ko" ] || { echo "dkms built no virtio_rdma.ko:"; cat "$work/kbuild.log"; return 1; } >&2
  case $ko in  # Debian 13's dkms compresses as its kernel's modules are
    *.xz) xz -dc "$ko" > "$work/kmod/virtio_rdma.ko" ;;
    *) cp "$ko" "$work/kmod/virtio_rdma.ko" ;;
  esac
  echo "BUILT by dkms from $(basename "$KMOD_DEB") in $(echo "$(date +%s.%N) - $t" | bc | cut -c1-4) s: $(modinfo -F vermagic "$work/kmod/virtio_rdma.ko")" >&2
  rm -f "$CACHE"/virtio_rdma-"$KVER"-*.ko
  cp "$work/kmod/virtio_rdma.ko" "$cached"
}

# kmod_install ROOT WORK: the module kmod_build made, where dkms installs it (dkms.conf
# DEST_MODULE_LOCATION), with the package's modprobe.d file; depmod on the tree.
kmod_install() {
  mkdir -p "$1/lib/modules/$KVER/updates/dkms" "$1/lib/modprobe.d" &&
    cp "$2/kmod/virtio_rdma.ko" "$1/lib/modules/$KVER/updates/dkms/" &&
    cp "$2/pkg/lib/modprobe.d/virtio-rdma.conf" "$1/lib/modprobe.d/" &&
    depmod -b "$1" "$KVER"
}

# guest_provider SRC ROOT WORK: the rdma-core provider from its Debian package
# (SRC/guest/packaging/make_provider_deb.sh into WORK/provider), unpacked into the guest's tree
# as dpkg would install it (the library where Debian's libibverbs looks for providers, the
# .driver file naming it), and an unprivileged user (vrdma, uid 1000) to run the tools as.
# Returns the package script's status (3: the provider cannot be built here; the reason is on
# stderr). Prints the provider's path in the guest, then the package's name and control fields.
guest_provider() {
  local root=$2 work=$3 deb prc=0 so
  if [ -n "${UTREE:-}" ]; then
    deb=$(utree_provider_deb "$1" "$work/provider") || prc=$?
  else
    deb=$("$1/guest/packaging/make_provider_deb.sh" "$1" "$work/provider") || prc=$?
  fi
  [ $prc -eq 0 ] || return $prc
  dpkg-deb -x "$deb" "$root"
  so=$(dpkg-deb -c "$deb" | grep -o '/usr/lib/.*/libibverbs/libvrdma-rdmav[0-9]*\.so$')
  echo "root:x:0:0::/:/bin/sh" > "$root/etc/passwd"
  echo "vrdma:x:1000:1000::/tmp:/bin/sh" >> "$root/etc/passwd"
  printf 'root:x:0:\nvrdma:x:1000:\n' > "$root/etc/group"
  echo "$so"
  echo "$(basename "$deb") $(dpkg-deb -W --showformat='${Package} ${Version} ${Architecture} ${Depends}' "$deb")"
}

# utree_provider_deb SRC OUT_DIR: the provider's package made in the guest's user-space tree
# (guest_lib.sh's UTREE: Debian 13's), by the same make_provider_deb.sh and build.sh, for that
# tree's libibverbs (rdma-core 56) with its headers and compiler; rdma-core's source as this
# host's build cached it is copied into the tree's own cache first (else build.sh fetches it
# there). Prints the .deb's path in OUT_DIR; returns make_provider_deb.sh's status.
utree_provider_deb() {
  local src=$1 out=$2 kw up rc=0
  kw=$(mktemp -d "$UTREE/tmp/vrdma-prov.XXXXXX")
  mkdir -p "$kw/src/guest" "$out"
  cp -a "$src/CMakeLists.txt" "$src/include" "$kw/src/"
  cp -a "$src/guest/provider" "$src/guest/packaging" "$src/guest/include" "$kw/src/guest/"
  up=$(chroot "$UTREE" dpkg-query -W -f='${Version}' libibverbs1 2>/dev/null || true)
  up=${up%-*}
  if [ -n "$up" ] && [ ! -d "$UTREE$CACHE/rdma-core-$up" ] && [ -d "$CACHE/rdma-core-$up" ]; then
    mkdir -p "$UTREE$CACHE" && cp -a "$CACHE/rdma-core-$up" "$UTREE$CACHE/"
  fi
  chroot "$UTREE" env VRDMA_RIG_CACHE="$CACHE" bash "${kw#"$UTREE"}/src/guest/packaging/make_provider_deb.sh" \
    "${kw#"$UTREE"}/src" "${kw#"$UTREE"}/out" > "$kw/deb.path" || rc=$?
  if [ $rc -eq 0 ]; then
    cp "$kw"/out/*.deb "$out/" && echo "$out/$(basename "$(cat "$kw/deb.path")")" || rc=1
  fi
  rm -rf "$kw"
  return $rc
}

# kmod_tree SRC WORK ROOT MODULE...: the initramfs tree ROOT of a kernel-driver guest: busybox,
# virtio_pci, virtio_net, ib_core, ib_uverbs and the MODULEs of the guest's kernel, the module
# (kmod_build first) where dkms installs it, and the provider (guest_provider; its status).
kmod_tree() {
  local src=$1 work=$2 root=$3
  shift 3
  guest_root "$root"
  guest_modules "$root" virtio_pci virtio_net ib_core ib_uverbs "$@"
  kmod_install "$root" "$work" || return 1
  guest_provider "$src" "$root" "$work" >/dev/null
}

# kmod_guest WORK "TOOL..." [MODULE...]: the kernel-driver guest most rigs boot (bench_kmod.sh,
# the libvirt kmod tests): Debian's kernel, virtio_rdma.ko from its DKMS package (kmod_build),
# the provider, the kernel's MODULEs, the host's TOOLs with their libraries, and what a function
# kmod_guest_more ROOT adds when the caller defines one; packed with kmod_guest_init.sh into
# WORK/initrd.cpio.gz. Sets KERNEL and INITRD; a tool or the guest's kernel missing skips (the
# caller's `skip`); a failed build exits 1 with the log. kmod_test.sh builds a richer tree itself.
kmod_guest() {
  local work=$1 want=$2 rc=0 out
  shift 2
  out=$(
    exec 2>"$work/make_guest.err"
    set -e
    . "$SRC/tests/conformance/guest_lib.sh"
    guest_kernel
    guest_headers
    guest_tools
    kmod_build "$SRC" "$work" || exit $?
    # shellcheck disable=SC2086
    tools=$(guest_which $want)
    [ "$(echo "$tools" | wc -w)" -eq "$(echo "$want" | wc -w)" ] ||
      { echo "one of $want is not installed (scripts/setup.sh installs perftest, rdmacm-utils and strace)" >&2; exit 3; }
    kmod_tree "$SRC" "$work" "$work/root" "$@"
    # shellcheck disable=SC2086
    guest_files "$work/root" $tools
    if declare -F kmod_guest_more >/dev/null; then kmod_guest_more "$work/root"; fi
    guest_pack "$work/root" "$SRC/tests/conformance/vm/kmod_guest_init.sh" "$work/initrd.cpio.gz" || exit 1
    echo "KERNEL=$KERNEL"
  ) || rc=$?
  if [ $rc -eq 3 ]; then skip "guest unavailable: $(grep -v '^BUILT' "$work/make_guest.err")"; elif [ $rc -ne 0 ]; then
    echo "FAIL: the guest or the module could not be built:"; cat "$work/make_guest.err"; exit 1
  fi
  grep "^BUILT" "$work/make_guest.err" | sed 's/^BUILT/virtio_rdma.ko built/'
  KERNEL=$(echo "$out" | sed -n 's/^KERNEL=//p') INITRD=$work/initrd.cpio.gz
}

# kmod_host: the host's side of the guest's device: network namespace $NS with br0 (MTU 9000: the
# soft engines take their active MTU from it, 4096, so that tools can run -m 4096) holding the
# device's address $DEVIP, and tap0 for the guest's NIC, up.
kmod_host() {
  ip netns add "$NS"
  ip -n "$NS" link set lo up
  ip -n "$NS" link add br0 mtu 9000 type bridge
  ip -n "$NS" addr add "$DEVIP/24" dev br0
  ip -n "$NS" link set br0 up
  ip -n "$NS" tuntap add tap0 mode tap
  ip -n "$NS" link set tap0 up
}

# kmod_boot MEMORY [QEMU ARG...]: the guest (QEMU TCG in $NS, MEMORY of shared memfd RAM, $KERNEL
# and $work/initrd.cpio.gz, vrdma.ip=$DEVIP) with the device's carrier on vrdmad's socket
# $work/vrdma.sock and its NIC (MAC $GMAC) on tap0; the serial console is fd 3 (commands) and
# $work/serial.log, as serial_lib.sh's guest_run wants it. Sets qemu_pid and cat_pid.
kmod_boot() {
  local mem=$1
  shift
  mkfifo "$work/con.in" "$work/con.out"
  cat "$work/con.out" > "$work/serial.log" &
  cat_pid=$!
  ip netns exec "$NS" qemu-system-x86_64 -accel tcg -cpu max -m "$mem" -smp 1,maxcpus=2 -display none -monitor none -no-reboot \
    -object memory-backend-memfd,id=mem,size="$mem",share=on -numa node,memdev=mem \
    -kernel "$KERNEL" -initrd "$work/initrd.cpio.gz" -append "console=ttyS0 quiet panic=-1 vrdma.ip=$DEVIP" \
    -chardev pipe,id=con,path="$work/con" -serial chardev:con \
    -chardev socket,id=vr,path="$work/vrdma.sock",reconnect=1 -device vhost-user-blk-pci,chardev=vr,num-queues=4,queue-size=256 \
    -netdev tap,id=n0,ifname=tap0,script=no,downscript=no -device virtio-net-pci,netdev=n0,mac="$GMAC" \
    "$@" >"$work/qemu.log" 2>&1 &
  qemu_pid=$!
  exec 3>"$work/con.in"
}

# pt_moved OUR-ROLE(server|client) TEST N SIZE HOSTLOG [MTU]: the data of a perftest run moved:
# vrdma-perf's engine (its JSON's last line in HOSTLOG) counted, on its side, the packets N
# messages of SIZE take at MTU (default 1024): ours for what we send (WRITEs, SENDs, atomics as
# client, READ responses as server), the tool's for the rest, both ways for latency tests; no
# ICRC error; a SEND server received all N messages (perftest does not check its data).
pt_moved() {
  python3 - "$@" <<'PY'
import json, sys
role, test, n, size, log = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
mtu = int(sys.argv[6]) if len(sys.argv) > 6 else 1024
lines = [l for l in open(log) if l.lstrip().startswith("{")]
if not lines: print("  no JSON from vrdma-perf"); sys.exit(1)
j = json.loads(lines[-1]); e = j.get("engine", {})
per = max(1, -(-size // mtu)) * n
if test in ("send_lat", "write_lat"):
    need = {"rx": per, "tx": per}
elif test in ("read_bw", "read_lat"):
    need = {"tx" if role == "server" else "rx": per}
else:  # write_bw, send_bw, atomic_bw
    need = {"rx" if role == "server" else "tx": per}
got = {"rx": e.get("rx_packets", 0), "tx": e.get("tx_packets", 0)}
bad = [f"{k} {got[k]} < {v}" for k, v in need.items() if got[k] < v]
if e.get("rx_dropped_icrc", 1) != 0: bad.append(f"rx_dropped_icrc {e.get('rx_dropped_icrc')}")
if test == "send_bw" and role == "server" and j.get("ops", 0) < n: bad.append(f"received {j.get('ops', 0)} of {n} SENDs")
if bad: print(f"  data did not move: {test}, {n} x {size} B at MTU {mtu}: " + ", ".join(bad)); sys.exit(1)
print(f"  moved: {test} {n} x {size} B, our engine rx {got['rx']} tx {got['tx']} packets (needed {need})")
PY
}
