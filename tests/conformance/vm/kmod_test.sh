#!/usr/bin/env bash
# The guest kernel driver, virtio_rdma.ko (guest/kernel, docs/virtio-rdma.md "The guest kernel
# driver"), in a real QEMU 7.2 TCG guest on Debian's own 6.1 kernel: the module is built here
# against linux-headers-<that kernel> from a DKMS-shaped copy of guest/kernel; vrdmad (soft
# engine, odd per-guest limits so that they can be recognised) serves the device through the
# vhost-user-blk-pci carrier; the guest also has a real virtio-blk disk, which the driver must
# decline. In the guest: virtio_rdma binds the carrier (virtio_blk is not loaded), `rdma link`
# shows vrdma0 ACTIVE on eth0, sysfs shows the RoCEv2 GID of eth0's address (the device's
# address), uverbs_probe (a static program speaking the kernel's uverbs write commands) reads the
# device and port attributes, which must be vrdmad's limits, and holds PDs that vrdmad must count;
# a 6th PD over vrdmad's limit (5) fails with ENOSPC and the device's sentence, and the exited
# process's PDs are freed; uverbs_data (a static program speaking uverbs and the driver's ABI,
# guest/include/vrdma/virtio_rdma_abi.h) moves data: a 64 KiB MR, a CQ and two RC QPs whose rings
# it maps, connected through the device's own GID, a SEND, an RDMA WRITE and a receive written
# into the rings and rung through POST_SEND / POST_RECV, the mapped CQ polled, the armed CQ's
# event read, the bytes compared; the same objects held by a process that is SIGKILLed are all
# destroyed (vrdmad's counters back to 0); virtio_blk then takes the disk and not the carrier; the module is
# unloaded and loaded with the address missing (the port waits for it, the GID comes when it is
# added); the carrier moves to virtio_blk and back through sysfs. vrdmad must have seen every
# command and refused only that PD. Last, the backend (vrdmad --supervise) is SIGKILLed while a
# process holds 2 PDs: the new backend's DEVICE_FATAL event reaches the driver, which frees the
# lost PDs without naming their handles at the new backend, and a new process gets a PD there.
# Step 4e: the rdma-core provider (guest/provider/build.sh) under Debian's unmodified ibv_devices,
# ibv_devinfo, ibv_rc/ud/srq_pingpong (as uid 1000, both roles, against vrdma-perf: every byte
# verified), verbs_wr (the provider's ibv_wr_* API: every builder and setter, abort, latched
# errors, one doorbell a batch; with cq_ex, ibv_create_cq_ex and start/next/end_poll) and
# perftest's unmodified tools with their defaults: every RC bandwidth and latency test as
# client, write/read/send bandwidth and every latency test as server, ib_send_bw over UD (the
# data's packets counted); 4f: two tools at once, one SIGKILLed
# mid-run (its objects freed by the driver, the other's data verified after); 4g: path MTU 4096,
# then 2 % of RoCE packets dropped both ways (nftables), the retransmissions counted; skipped with
# a reason if the provider cannot be built; 4j: Debian's UCX 1.13 (ucx_perftest put bandwidth and
# tag latency between two processes on vrdma0, UCX's destination-GID filter on).
# Every guest command runs under `timeout`.
#   kmod_test.sh SOURCE_DIR VRDMAD VRDMA-PERF   exits 77 (skip) without root, QEMU, the guest kernel or its headers
#   KEEP_WORK=1 keeps the logs.
set -euo pipefail
SRC=$(readlink -f "$1"); VRDMAD=$(readlink -f "$2"); PERF=$(readlink -f "$3")
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../serial_lib.sh"  # skip, rig_require, wait_serial, guest_run, vm_rig_cleanup
. "$HERE/kmod_lib.sh"        # kmod_build, kmod_install, guest_provider, kmod_host, kmod_boot
rig_require
command -v rdma >/dev/null || skip "rdma (iproute2) is not installed"
T0=$(date +%s.%N)
work=$(mktemp -d)
NS=vmk$$
qemu_pid="" cat_pid="" vrdmad_pid=""
trap vm_rig_cleanup EXIT

# ---- The guest: Debian's kernel, the module built for it, busybox, rdma, uverbs_probe --------
rc=0
out=$(
  exec 2>"$work/make_guest.err"
  set -e
  . "$HERE/../guest_lib.sh"
  guest_kernel
  guest_headers
  guest_tools
  # set -e does not act in this subshell (its status is tested below): each step says so itself.
  kmod_build "$SRC" "$work" || exit $?
  cc -static -O2 -std=gnu11 -Wall -Wextra -Werror -o "$work/uverbs_probe" "$HERE/uverbs_probe.c" >&2 || exit 1
  cc -static -O2 -std=gnu11 -Wall -Wextra -Werror -I"$SRC/include" -I"$SRC/guest/include" -o "$work/uverbs_data" \
    "$HERE/uverbs_data.c" >&2 || exit 1
  ROOT="$work/root"
  guest_root "$ROOT"
  guest_modules "$ROOT" virtio_pci virtio_net virtio_blk ib_core ib_uverbs rdma_ucm nvme-rdma nvmet-rdma
  kmod_install "$ROOT" "$work" || exit 1
  # Debian's modprobe (kmod) on that tree: loading virtio_blk loads virtio_rdma first.
  echo "SOFTDEP=$(modprobe -d "$ROOT" -S "$KVER" -C "$ROOT/lib/modprobe.d" --show-depends virtio_blk 2>&1 |
    sed -n 's|^insmod .*/\([a-z_]*\)\.ko.*|\1|p' | tr '\n' ' ')"
  echo "PKG=$(basename "$KMOD_DEB") $(dpkg-deb -W --showformat='${Package} ${Version} ${Architecture} ${Depends}' "$KMOD_DEB")"
  mkdir -p "$ROOT/usr/bin"
  cp "$work/uverbs_probe" "$work/uverbs_data" "$ROOT/usr/bin/"
  # The guest's programs: this host's, or with VRDMA_GUEST_DEBIAN=13 Debian 13's (guest_lib.sh).
  p=$(guest_which rdma)
  [ -n "$p" ] || { echo "rdma (iproute2) is not installed" >&2; exit 3; }
  guest_files "$ROOT" "$p"
  # NVMe over Fabrics (4i): Debian's nvme-cli; without it that step is skipped with the reason.
  p=$(guest_which nvme)
  if [ -n "$p" ]; then guest_files "$ROOT" "$p"; else echo "NVME-SKIP: nvme-cli is not installed" >&2; fi
  # strace -c counts a tool's system calls (4e: no system call per post).
  p=$(guest_which strace)
  if [ -n "$p" ]; then guest_files "$ROOT" "$p"; else echo "STRACE-SKIP: strace is not installed" >&2; fi
  # The rdma-core provider (guest/provider/build.sh) with Debian's unmodified libibverbs and
  # tools, and an unprivileged user to run them. Without rdma-core's source or the tools the
  # provider's checks are skipped (PROVIDER-SKIP) and the rest runs.
  prc=0
  pout=$(guest_provider "$SRC" "$ROOT" "$work") || prc=$?
  pfile=$(echo "$pout" | head -1)
  tools=$(guest_which ibv_devices ibv_devinfo ibv_rc_pingpong ibv_ud_pingpong ibv_srq_pingpong ib_write_bw ib_send_bw ib_read_bw \
    ib_atomic_bw ib_write_lat ib_send_lat ib_read_lat rping ucmatose || true)
  if [ $prc -eq 0 ] && [ "$(echo "$tools" | wc -w)" -eq 14 ]; then
    # shellcheck disable=SC2086
    guest_files "$ROOT" $tools
    # UCX (Debian's ucx-utils, 4j): ucx_perftest and the transports it loads (ucx/libuct_*.so).
    p=$(guest_which ucx_perftest)
    if [ -n "$p" ]; then
      # shellcheck disable=SC2046
      guest_files "$ROOT" "$p" $(cd "${UTREE:-}/" && ls usr/lib/x86_64-linux-gnu/ucx/libuct_*.so.0 | sed 's|^|/|')
    else
      echo "UCX-SKIP: ucx-utils is not installed" >&2
    fi
    # verbs_wr: the extended send API through Debian's libibverbs (perftest does not use it here).
    guest_cc "$ROOT" verbs_wr -std=gnu11 -O2 -Wall -Wextra -Werror -I"$HERE" "$HERE/verbs_wr.c" "$HERE/verbs_cqx.c" -libverbs || exit 1
    echo "PROVIDER=$pfile"
    echo "PPKG=$(echo "$pout" | sed -n 2p)"
  elif [ $prc -eq 3 ]; then
    echo "PROVIDER-SKIP: the provider could not be built (above)" >&2
  elif [ $prc -eq 0 ]; then
    echo "PROVIDER-SKIP: ibv_devices, ibv_devinfo, an ibv_*_pingpong (ibverbs-utils), a perftest tool or rping (rdmacm-utils) is not installed" >&2
  else
    exit 1
  fi
  guest_pack "$ROOT" "$HERE/kmod_guest_init.sh" "$work/initrd.cpio.gz" || exit 1
  echo "KERNEL=$KERNEL"
) || rc=$?
if [ $rc -eq 3 ]; then skip "guest unavailable: $(cat "$work/make_guest.err")"; elif [ $rc -ne 0 ]; then
  echo "FAIL: the guest or the module could not be built:"; cat "$work/make_guest.err"; exit 1
fi
KERNEL=$(echo "$out" | sed -n 's/^KERNEL=//p')
PROVIDER=$(echo "$out" | sed -n 's/^PROVIDER=//p')
[ -n "$PROVIDER" ] || grep -E "^(provider:|PROVIDER-SKIP)" "$work/make_guest.err" || true
grep "^BUILT" "$work/make_guest.err" | sed 's/^BUILT/virtio_rdma.ko built/'
SOFTDEP=$(echo "$out" | sed -n 's/^SOFTDEP=//p')
PKG=$(echo "$out" | sed -n 's/^PKG=//p')
PPKG=$(echo "$out" | sed -n 's/^PPKG=//p')

# ---- One "host": vrdmad's soft engine on br0 at the device's address; the guest's NIC on a tap
# of its own (no traffic in this test: eth0 only carries the same address, as the guest owns it).
# br0's MTU 9000 lets the tools run -m 4096 (4g); the other cases ask for 1024 themselves.
DEVIP=10.77.9.12 GMAC=52:54:00:77:09:0c
kmod_host
# Limits no engine has by itself: the guest must show exactly these.
LIMITS=(--max-qp 1000 --max-cq 2000 --max-mr 3000 --max-pd 5 --max-qp-wr 512)
ip netns exec "$NS" "$VRDMAD" --socket "$work/vrdma.sock" --engine soft:$DEVIP --mac $GMAC --control "$work/vrdma.ctl" \
  "${LIMITS[@]}" --supervise >"$work/vrdmad.log" 2>&1 &
vrdmad_pid=$!
for _ in $(seq 100); do [ -S "$work/vrdma.sock" ] && break; sleep 0.05; done
[ -S "$work/vrdma.sock" ] || { echo "FAIL: vrdmad did not start"; cat "$work/vrdmad.log"; exit 1; }
# The guest kernel's own objects on the device (ib_mad's QP1 with its PD, DMA MR and CQ, once
# step 1b saw them): taken off every object count below, which are the processes'.
KBASE='{}'
VADJ='import json
def adj(line, base):
    v = json.loads(line)
    if isinstance(v.get("objects"), dict):
        for k, n in json.loads(base).items(): v["objects"][k] = v["objects"].get(k, 0) - n
    return v'
vstatus() {
  timeout 5 python3 -c "$VADJ"'
import socket,sys
s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b"{\"cmd\":\"status\"}\n")
print(json.dumps(adj(s.makefile().readline().strip(), sys.argv[2])))' "$work/vrdma.ctl" "$KBASE" 2>/dev/null || true
}
vwait() {  # vwait DOTTED.KEY VALUE SECONDS: polls vrdmad's status until KEY is VALUE; prints the status
  timeout $(($3 + 5)) python3 -c "$VADJ"'
import socket,sys,time
end = time.time() + float(sys.argv[4])
while True:
    try:
        s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(sys.argv[1])
        s.sendall(b"{\"cmd\":\"status\"}\n"); line = s.makefile().readline().strip(); s.close()
        st = adj(line, sys.argv[5]); v = st
        for k in sys.argv[2].split("."): v = v[k]
        if str(v) == sys.argv[3]: print(json.dumps(st)); sys.exit(0)
    except Exception: pass
    if time.time() > end: sys.exit(1)
    time.sleep(0.05)' "$work/vrdma.ctl" "$1" "$2" "$3" "$KBASE" 2>/dev/null || true
}
jfield() {  # jfield JSON DOTTED.KEY
  python3 -c 'import json,sys
v=json.loads(sys.argv[1])
for k in sys.argv[2].split("."): v=v[k]
print(v)' "$1" "$2" 2>/dev/null || echo "?"
}
delta() {  # delta STATUS0 STATUS1 DOTTED.KEY: how much KEY grew between two vstatus answers; "?" if unreadable
  local a b
  a=$(jfield "$1" "$3"); b=$(jfield "$2" "$3")
  if [[ $a =~ ^[0-9]+$ && $b =~ ^[0-9]+$ ]]; then echo $((b - a)); else echo "?"; fi
}

# A real disk the driver must decline: 1 MiB that starts with a known line.
truncate -s 1M "$work/disk.img"
printf 'VRDMA-DISK-OK' | dd of="$work/disk.img" conv=notrunc status=none

kmod_boot 512M -drive file="$work/disk.img",if=none,id=d0,format=raw -device virtio-blk-pci,drive=d0

failed=0 checks=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
check() {  # check DESCRIPTION COMMAND...: one counted assertion
  local what=$1; shift
  checks=$((checks + 1))
  if "$@"; then echo "ok   $what"; else fail "$what"; fi
}
wait_serial "VRDMA-GUEST-READY" 120 || { echo "FAIL: the guest did not come up"; tail -30 "$work/serial.log"; exit 1; }
echo "guest ready after $(echo "$(date +%s.%N) - $T0" | bc | cut -c1-5) s wall"

# guest SECONDS OUTFILE COMMAND...: the words as one `sh -c` command line in the guest (guest_run).
guest() { guest_run "$1" "$2" "sh -c '${*:3}'"; }
has() { grep -q -- "$2" "$1"; }

# The package the module came from, and its modprobe.d file under Debian's modprobe.
check "the DKMS package: $PKG" eval '[[ "$PKG" =~ ^virtio-rdma-dkms_[0-9.]+_all\.deb\ virtio-rdma-dkms\ [0-9.]+\ all\ dkms ]]'
check "modprobe virtio_blk loads virtio_rdma first (the package's softdep): $SOFTDEP" eval '[[ " $SOFTDEP" =~ \ virtio_rdma\ .*virtio_blk ]]'

# The GID the guest must show for the device's address (sysfs prints 8 groups of 4 hex digits).
IFS=. read -r a b c d <<<"$DEVIP"
WANT_GID=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d")
GIDS='for i in $(seq 0 15); do g=$(cat ports/1/gids/$i); case $g in 0000:0000:0000:0000:0000:0000:0000:0000) ;; *) echo "gid $i $g $(cat ports/1/gid_attrs/types/$i) $(cat ports/1/gid_attrs/ndevs/$i)";; esac; done'

# 1. Bind: virtio_rdma alone takes the carrier, declines the disk, registers vrdma0 on eth0.
guest 60 "$work/load.out" 'modprobe virtio_rdma; ls /sys/bus/virtio/drivers/virtio_rdma | grep virtio; ls /sys/block | grep vd; dmesg | grep -E "virtio_rdma|vrdma|infiniband"' || true
sed 's/^/  guest: /' "$work/load.out" | grep -v "===" | cut -c1-300
CARRIER=$(grep -oE '^virtio[0-9]+$' "$work/load.out" | head -1 || true)
check "virtio_rdma bound one function ($CARRIER)" test -n "$CARRIER"
check "no block device while virtio_blk is not loaded" bash -c "! grep -q '^vd' '$work/load.out'"
check "the driver read the device behind the carrier with vrdmad's limits (max_qp 1000 max_cq 2000 max_mr 3000 max_pd 5 max_qp_wr 512)" \
  has "$work/load.out" "behind the vhost-user-blk carrier: version 1, .* max_qp 1000 max_cq 2000 max_mr 3000 max_pd 5 max_qp_wr 512"
check "port 1 follows eth0 (the netdev with $DEVIP)" has "$work/load.out" "port 1 follows netdev eth0 (it has the device's address $DEVIP)"
check "ib_device vrdma0 registered" has "$work/load.out" "registered vrdma0 (RoCEv2, netdev eth0)"
check "the driver found the doorbell queue's notify address for processes' doorbell rings" \
  has "$work/load.out" "doorbell rings: processes notify the doorbell queue at 0x[0-9a-f]* (a shared notify page)"

# 1b. The kernel's own verbs: ib_mad (in ib_core) opens port 1 of vrdma0 as it does any RoCE
#     port: a PD whose local_dma_lkey is the device's DMA MR (REG_DMA_MR), a CQ the kernel polls
#     and the GSI QP (QP1: the soft engine hands it the CM's MADs), its receives posted.
k=$(vwait objects.qp 1 20)
check "ib_mad opened QP1 on vrdma0: the device holds its PD, DMA MR, CQ and GSI QP (objects $(jfield "$k" objects))" \
  bash -c "[ '$(jfield "$k" objects.pd)$(jfield "$k" objects.mr)$(jfield "$k" objects.cq)$(jfield "$k" objects.qp)' = 1111 ]"
KBASE='{"pd": 1, "mr": 1, "cq": 1, "qp": 1}'
# The state area (docs/virtio-rdma.md "The state area"): what a live migration carries the
# guest's objects in; the device holds the driver's 1 MiB chain (enough for ib_mad's QP1: the
# device asks for no larger one at load).
check "the driver posted a 1 MiB state area on the state queue (vrdmad holds $(jfield "$k" state_area_bytes) bytes)" \
  bash -c "[ '$(jfield "$k" state_area_bytes)' = 1048576 ]"

# 2. rdma link / rdma dev (iproute2) and sysfs.
guest 30 "$work/rdma.out" 'rdma link show; rdma dev show; cd /sys/class/infiniband/vrdma0 && for f in node_type fw_ver node_guid node_desc ports/1/state ports/1/phys_state ports/1/link_layer ports/1/rate; do echo "$f: $(cat $f)"; done; '"$GIDS" || fail "rdma/sysfs step failed"
sed 's/^/  guest: /' "$work/rdma.out" | grep -v "===" | cut -c1-300
check "rdma link: vrdma0/1 ACTIVE LINK_UP on eth0" has "$work/rdma.out" "link vrdma0/1 state ACTIVE physical_state LINK_UP netdev eth0"
# iproute2 6.15 (Debian 13) also prints the device's protocol, which a 6.12 kernel reports: RoCE.
if has "$work/rdma.out" "vrdma0: node_type ca protocol"; then
  check "rdma dev: vrdma0 is a CA speaking RoCE, with vrdmad's firmware string" has "$work/rdma.out" "vrdma0: node_type ca protocol roce fw vrdmad"
else
  check "rdma dev: vrdma0 is a CA with vrdmad's firmware string" has "$work/rdma.out" "vrdma0: node_type ca fw vrdmad"
fi
check "sysfs: port state 4: ACTIVE, link layer Ethernet" bash -c "grep -q 'ports/1/state: 4: ACTIVE' '$work/rdma.out' && grep -q 'ports/1/link_layer: Ethernet' '$work/rdma.out'"
check "sysfs: fw_ver is the device's (QUERY_DEVICE)" has "$work/rdma.out" "^fw_ver: vrdmad 0.1 over vrdma-soft"
check "sysfs: the RoCEv2 GID of $DEVIP ($WANT_GID) on eth0" has "$work/rdma.out" "^gid [0-9]* $WANT_GID RoCE v2 eth0"
grep -o "^gid .*" "$work/rdma.out" | sed 's/^/  /'

# 3. The real disk is virtio_blk's; the carrier stays ours.
guest 30 "$work/blk.out" 'modprobe virtio_blk; for i in $(seq 30); do [ -e /sys/block/vda ] && break; sleep 0.1; done; ls /sys/block | grep vd; for d in /sys/block/vd*; do echo "$d size $(cat $d/size)"; done; dd if=/dev/vda bs=13 count=1 2>/dev/null; echo; ls /sys/bus/virtio/drivers/virtio_rdma | grep virtio' || true
sed 's/^/  guest: /' "$work/blk.out" | grep -v "===" | cut -c1-200
check "virtio_blk took the declined disk (vda, 2048 sectors, its data reads back)" \
  bash -c "grep -q '/sys/block/vda size 2048' '$work/blk.out' && grep -q '^VRDMA-DISK-OK' '$work/blk.out'"
check "virtio_blk did not take the carrier (one disk, $CARRIER still virtio_rdma's)" \
  bash -c "[ \$(grep -c '^vd' '$work/blk.out') -eq 1 ] && grep -q '^$CARRIER\$' '$work/blk.out'"

# 4. User space through uverbs: attributes and PDs (CREATE_PD/DESTROY_PD on vrdmad).
before=$(vstatus)
guest 30 "$work/uv.out" 'modprobe ib_uverbs; cat /sys/class/infiniband_verbs/uverbs0/ibdev; (uverbs_probe /dev/infiniband/uverbs0 3 /tmp/go1 > /tmp/probe.out 2>&1 &); sleep 0.5' || true
held=$(vwait objects.pd 3 6)
guest 30 "$work/probe.out" 'touch /tmp/go1; for i in $(seq 100); do grep -q "pds freed\|failed" /tmp/probe.out && break; sleep 0.1; done; cat /tmp/probe.out' || true
after=$(vstatus)
sed 's/^/  guest: /' "$work/uv.out" "$work/probe.out" | grep -v "===" | cut -c1-300
check "uverbs0 is vrdma0's" has "$work/uv.out" "^vrdma0"
check "QUERY_DEVICE through uverbs shows vrdmad's limits" \
  has "$work/probe.out" "^device max_qp=1000 max_qp_wr=512 .* max_cq=2000 .* max_mr=3000 max_pd=5 "
check "QUERY_PORT through uverbs: ACTIVE, Ethernet, 16 GIDs, 1 P_Key" \
  has "$work/probe.out" "^port state=4 .* gid_tbl_len=16 pkey_tbl_len=1 .* link_layer=2"
check "port 2 does not exist" has "$work/probe.out" "^port2 Invalid argument"
check "vrdmad held the guest's 3 PDs while the process had them (status objects.pd=3)" test -n "$held"
check "the 3 PDs were freed (vrdmad objects.pd=$(jfield "$after" objects.pd))" \
  bash -c "grep -q '^pds freed=3' '$work/probe.out' && [ '$(jfield "$after" objects.pd)' = 0 ]"
echo "  vrdmad commands: $(jfield "$before" commands) before uverbs_probe, $(jfield "$after" commands) after"

# 4b. A refusal: the guest's 6th PD (the process's 5th: ib_mad holds one) is over vrdmad's limit
#     (5). The device's status comes back as the errno, its sentence in the guest's log; the
#     process exits holding 4 PDs and the driver
#     frees them (DESTROY_PD as uverbs cleans the context up).
guest 30 "$work/limit.out" 'uverbs_probe /dev/infiniband/uverbs0 5 0; dmesg | grep "refused by the device"' || true
sed 's/^/  guest: /' "$work/limit.out" | grep -v "===" | cut -c1-300
vwait objects.pd 0 5 >/dev/null; s=$(vstatus)
check "the guest's 6th PD fails with ENOSPC, the device's sentence in the guest's log" \
  bash -c "grep -q '^alloc_pd 4 failed: No space left on device' '$work/limit.out' &&
    grep -q 'CREATE_PD refused by the device (status 28): CREATE_PD: the guest already has 5 PDs (limit 5)' '$work/limit.out'"
check "the 4 PDs of the exited process were freed (vrdmad objects.pd=$(jfield "$s" objects.pd))" test "$(jfield "$s" objects.pd)" = 0

# 4c. Data through the driver (uverbs_data, the provider's way without a provider): a 64 KiB MR,
#     a CQ and two RC QPs whose rings the process maps, connected to each other through the
#     device's own address; a receive, a SEND and an RDMA WRITE written into the mapped rings and
#     rung with POST_RECV / POST_SEND carrying no work request; the mapped CQ polled; the armed
#     CQ's completion event read; the bytes compared.
guest 60 "$work/data.out" 'uverbs_data /dev/infiniband/uverbs0 rc; dmesg | grep "is not the device"' || true
sed 's/^/  guest: /' "$work/data.out" | grep -v "===" | cut -c1-300
s=$(vwait objects.pd 0 5)
check "REG_MR of 64 KiB, CREATE_CQ (50 asked, 64 made) and 3 RC QPs (one for a refusal), mapped by the process" \
  bash -c "grep -q '^mr lkey=' '$work/data.out' && grep -q '^cq depth=64' '$work/data.out' && [ \$(grep -c '^qp qpn=' '$work/data.out') -eq 3 ]"
check "the two QPs connected to each other through the device's own GID (RESET-INIT-RTR-RTS)" \
  has "$work/data.out" "^connected qpn [0-9]* <-> [0-9]* through GID index"
check "QUERY_QP of a connected QP: RTS, its peer's QPN, the PSNs and the guest's GID index" \
  has "$work/data.out" "^query_qp state=3 dest_qp_num=[0-9]* sq_psn=100 rq_psn=100 path_mtu=3 sgid_index=[0-9]* max_send_wr=16"
check "refused with EINVAL: a QP addressed from a guest GID that is not the device's (the driver's sentence in the log), a producer index beyond the ring, a work request in POST_SEND, a CQ over max_cqe" \
  bash -c "[ \$(grep -c '^refused: .*: Invalid argument' '$work/data.out') -eq 4 ] && grep -q 'GID index [0-9]* is not the device.s address ::ffff:$DEVIP' '$work/data.out'"
check "SEND, RDMA WRITE and RECV completions polled from the mapped CQ (status, opcode, byte_len, wr_id, qp_num)" \
  has "$work/data.out" "^cqes ok: SEND, RDMA_WRITE and RECV (4096 bytes)"
check "the armed CQ's completion event reached the completion channel" has "$work/data.out" "^completion event for the armed CQ"
check "the SEND's and the RDMA WRITE's bytes landed (pattern compared)" has "$work/data.out" "^data ok:"
check "an RDMA WRITE with a wrong rkey completes REM_ACCESS_ERR, and the QP's fatal event reaches the process's async fd" \
  bash -c "grep -q '^bad rkey: cqe wr_id=0x1003 status=10' '$work/data.out' && grep -q '^qp fatal event:' '$work/data.out'"
check "everything destroyed: vrdmad holds no PD, MR, CQ or QP" \
  bash -c "grep -q '^rc ok' '$work/data.out' && [ '$(jfield "$s" objects.pd)$(jfield "$s" objects.mr)$(jfield "$s" objects.cq)$(jfield "$s" objects.qp)' = 0000 ]"

# 4c'. UD: two UD QPs, an AH (CREATE_AH) to the device's own address, a 256-byte SEND to the
#     other QP's QPN and Q_Key; the process exits holding everything (ib_core's cleanup frees it).
guest 60 "$work/ud.out" 'uverbs_data /dev/infiniband/uverbs0 ud' || true
sed 's/^/  guest: /' "$work/ud.out" | grep -v "===" | cut -c1-300
s=$(vwait objects.pd 0 5)
check "UD: two UD QPs in RTS and an AH to the device's own address" has "$work/ud.out" "^ud qpn [0-9]* and [0-9]* in RTS, ah handle [1-9]"
check "UD SEND and RECV completed (byte_len 40 + 256 with the GRH, src_qp), the bytes landed" has "$work/ud.out" "^ud ok:"
check "the exited process's AH, UD QPs, CQ, MR and PD were destroyed (vrdmad objects $(jfield "$s" objects))" \
  bash -c "[ '$(jfield "$s" objects.pd)$(jfield "$s" objects.mr)$(jfield "$s" objects.cq)$(jfield "$s" objects.qp)$(jfield "$s" objects.ah)' = 00000 ]"

# 4c''. SRQ: an SRQ whose ring the process maps, an RC QP on it; a receive rung with
#     POST_SRQ_RECV (no WR) serves a SEND to that QP; the process exits holding everything.
guest 60 "$work/srq.out" 'uverbs_data /dev/infiniband/uverbs0 srq' || true
sed 's/^/  guest: /' "$work/srq.out" | grep -v "===" | cut -c1-300
s=$(vwait objects.pd 0 5)
check "SRQ: CREATE_SRQ (10 asked, 16 made) mapped, an RC QP on it, its receive rung by POST_SRQ_RECV serves a SEND (data checked); POST_RECV on that QP refused" \
  has "$work/srq.out" "^srq ok:"
check "the exited process's SRQ, QPs, CQ, MR and PD were destroyed (vrdmad objects $(jfield "$s" objects))" \
  bash -c "[ '$(jfield "$s" objects.pd)$(jfield "$s" objects.mr)$(jfield "$s" objects.cq)$(jfield "$s" objects.qp)$(jfield "$s" objects.srq)' = 00000 ]"

# 4d. A process SIGKILLed holding a PD, an MR, a CQ and 2 connected QPs (their rings mapped):
#     ib_core's cleanup destroys them through the driver, and vrdmad's counters go back to 0.
guest 30 "$work/hold3.out" '(uverbs_data /dev/infiniband/uverbs0 hold > /tmp/hold3.out 2>&1 &); for i in $(seq 100); do grep -q "^held\|failed" /tmp/hold3.out && break; sleep 0.1; done; cat /tmp/hold3.out' || true
held3=$(vstatus)
pid3=$(sed -n 's/^held pid=\([0-9]*\).*/\1/p' "$work/hold3.out" | head -1)
guest 30 "$work/kill3.out" "kill -9 ${pid3:-none}; for i in \$(seq 50); do [ -d /proc/${pid3:-none} ] || break; sleep 0.1; done; [ -d /proc/${pid3:-none} ] || echo gone" || true
s=$(vwait objects.pd 0 10)
sed 's/^/  guest: /' "$work/hold3.out" "$work/kill3.out" | grep -v "===" | cut -c1-300
check "vrdmad held the process's PD, MR, CQ and 2 QPs (objects $(jfield "$held3" objects))" \
  bash -c "grep -q '^held' '$work/hold3.out' && [ '$(jfield "$held3" objects.pd)$(jfield "$held3" objects.mr)$(jfield "$held3" objects.cq)$(jfield "$held3" objects.qp)' = 1112 ]"
check "SIGKILLed: its objects were destroyed (vrdmad objects $(jfield "$s" objects))" \
  bash -c "grep -q '^gone' '$work/kill3.out' && [ '$(jfield "$s" objects.pd)$(jfield "$s" objects.mr)$(jfield "$s" objects.cq)$(jfield "$s" objects.qp)' = 0000 ]"

# 4e. The rdma-core provider (guest/provider): Debian's unmodified libibverbs and tools on
#     vrdma0. ibv_devices lists it, ibv_devinfo shows the port ACTIVE and vrdmad's limits, and
#     ibv_rc_pingpong (RC, 4 KiB), ibv_ud_pingpong (UD, 1 KiB) and ibv_srq_pingpong (16 RC QPs on
#     an SRQ), run as an unprivileged user, each exchange checked messages with vrdma-perf (a soft engine at $PERFIP on the host's
#     bridge, --peer-format pingpong: it checks every echoed byte) in both roles. The tools' TCP
#     exchange runs on a subnet of its own on the guest's NIC (tap0 is not bridged: the device's
#     address is the guest's); ib_core's address resolution of the peer's GID is answered by a
#     static neighbour (the device routes by IP).
PERFIP=10.77.9.1 TCPHOST=10.77.19.1 TCPGUEST=10.77.19.2
pp_ok() {  # pp_ok HOSTLOG GUESTLOG SIZE ITERS PACKETS: vrdma-perf verified every byte; ITERS messages of SIZE each way, PACKETS packets each way at least
  python3 - "$@" <<'PY'
import json, re, sys
host, guest, size, iters, packets = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
lines = [l for l in open(host) if l.lstrip().startswith("{")]
if not lines: sys.exit(1)
j = json.loads(lines[-1]); e = j.get("engine", {})
g = open(guest).read()
ok = (j.get("verified") is True and j.get("ops", 0) >= iters and e.get("rx_packets", 0) >= packets
      and e.get("tx_packets", 0) >= packets and re.search(r"^%d bytes in " % (2 * iters * size), g, re.M)
      and re.search(r"^%d iters in " % iters, g, re.M) and re.search(r"^uid=1000\(vrdma\)", g, re.M))
sys.exit(0 if ok else 1)
PY
}
# pp_case NAME TOOL VRDMA-PERF-ARGS TOOL-ARGS SIZE ITERS PACKETS [ROLES]: the tool in the guest (uid 1000) as
# client against vrdma-perf serving, then (ROLES "client server", the default) as server with vrdma-perf connecting.
pp_case() {
  local name=$1 tool=$2 args=$3 targs=$4 size=$5 iters=$6 packets=$7 roles=${8:-client server} hp
  timeout 90 ip netns exec "$NS" "$PERF" --device soft:$PERFIP $args >"$work/${name}_c.host" 2>&1 &
  hp=$!
  for _ in $(seq 100); do ip netns exec "$NS" ss -ltn 2>/dev/null | grep -q ':18515 ' && break; sleep 0.1; done
  guest 90 "$work/${name}_c.guest" "su -s /bin/sh vrdma -c \"id; timeout 60 $tool $targs $TCPHOST\"" || true
  wait $hp 2>/dev/null || true
  sed 's/^/  guest: /' "$work/${name}_c.guest" | grep -v "===" | cut -c1-200; sed 's/^/  host: /' "$work/${name}_c.host" | cut -c1-400
  check "$tool (uid 1000) as client: $iters x $size B each way${LOSS:+ with $LOSS} with vrdma-perf, every byte verified" \
    pp_ok "$work/${name}_c.host" "$work/${name}_c.guest" "$size" "$iters" "$packets"
  [[ $roles == *server* ]] || return 0
  guest 15 "$work/${name}_s.start" "(su -s /bin/sh vrdma -c \"id; timeout 60 $tool $targs\" > /tmp/${name}_s.out 2>&1 &); sleep 1" || true
  timeout 90 ip netns exec "$NS" "$PERF" --device soft:$PERFIP --connect $TCPGUEST $args >"$work/${name}_s.host" 2>&1 || true
  guest 70 "$work/${name}_s.guest" "for i in \$(seq 250); do pidof $tool >/dev/null || break; sleep 0.2; done; cat /tmp/${name}_s.out" || true
  sed 's/^/  guest: /' "$work/${name}_s.guest" | grep -v "===" | cut -c1-200; sed 's/^/  host: /' "$work/${name}_s.host" | cut -c1-400
  check "$tool (uid 1000) as server: $iters x $size B each way with vrdma-perf, every byte verified" \
    pp_ok "$work/${name}_s.host" "$work/${name}_s.guest" "$size" "$iters" "$packets"
}
# perftest's tools, unmodified and with their defaults. They post through ibv_post_send here:
# perftest (4.5-0.17, Debian 12's, as upstream's since 2020) uses the ibv_wr_* API only on the
# devices it knows by vendor part id and falls back on any other (vrdma0 answers vendor 0), so
# --use_old_post_send changes nothing and verbs_wr (above) drives the ibv_wr_* API; perftest also
# disables inline data on a device it does not know. The data moved: vrdma-perf's engine
# counted the packets it takes (kmod_lib.sh pt_moved).
# pt_case NAME ROLE TOOL TEST SIZE [TOOL-ARGS [VRDMA-PERF-ARGS]]: perftest's TOOL -n N -s SIZE
# -m MTU in the guest (uid 1000) as ROLE: client against vrdma-perf serving --peer-format
# perftest --test TEST, or server with vrdma-perf connecting. Both exit 0, the tool prints its
# result line (SIZE, N iterations) and its MTU, and the data moved (pt_moved). N is $PT_N (200),
# MTU $MTU (1024); $LOSS names the loss the case runs under.
pt_case() {
  local name=$1 role=$2 tool=$3 test=$4 size=$5 targs=${6:-} pargs=${7:-} hp ok=1 n=${PT_N:-200} mtu=${MTU:-1024} our
  local cmd="$tool -d vrdma0 -x ${G:-1} -F -m $mtu -s $size -n $n $targs"
  # shellcheck disable=SC2086
  if [ "$role" = client ]; then
    our=server
    timeout 90 ip netns exec "$NS" "$PERF" --device soft:$PERFIP --peer-format perftest --test "$test" --size "$size" \
      --mtu $mtu $pargs >"$work/$name.host" 2>&1 &
    hp=$!
    for _ in $(seq 100); do ip netns exec "$NS" ss -ltn 2>/dev/null | grep -q ':18515 ' && break; sleep 0.1; done
    guest 90 "$work/$name.guest" "su -s /bin/sh vrdma -c \"id; timeout 60 $cmd $TCPHOST\"" && wait $hp && ok=0
    kill $hp 2>/dev/null || true
    wait $hp 2>/dev/null || true
  else
    our=client
    guest 15 "$work/$name.start" "((su -s /bin/sh vrdma -c \"id; timeout 60 $cmd\"; echo tool-rc=\$?) > /tmp/$name.out 2>&1 &); sleep 1" || true
    timeout 90 ip netns exec "$NS" "$PERF" --device soft:$PERFIP --connect $TCPGUEST --peer-format perftest --test "$test" \
      --size "$size" --iters $n --mtu $mtu $pargs >"$work/$name.host" 2>&1 && ok=0
    guest 70 "$work/$name.guest" "for i in \$(seq 250); do grep -q '^tool-rc=' /tmp/$name.out && break; sleep 0.2; done; cat /tmp/$name.out" || true
    grep -q '^tool-rc=0$' "$work/$name.guest" || ok=1
  fi
  sed 's/^/  guest: /' "$work/$name.guest" | grep -v "===" | grep -vE "^  guest: -+$" | cut -c1-200; sed 's/^/  host: /' "$work/$name.host" | cut -c1-400
  # perftest's ib_read_lat server only lends its buffer: it prints no result line.
  local line="grep -qE '^ *$size +$n ' '$work/$name.guest'"
  [ "$role$test" != serverread_lat ] || line=true
  check "$tool${targs:+ $targs} (uid 1000) as $role ($test): $n x $size B at MTU $mtu${LOSS:+ with $LOSS} with vrdma-perf, both exit 0, the data moved" \
    bash -c "[ $ok = 0 ] && grep -q '^uid=1000(vrdma)' '$work/$name.guest' && $line &&
      grep -qE '^ *Mtu +: $mtu\[B\]' '$work/$name.guest' && pt_moved $our $test $n $size '$work/$name.host' $mtu"
}
export -f pt_moved  # kmod_lib.sh
# No system call per post (issue 25): the same unmodified ib_write_bw under strace -c, 2000 WRITEs
# of 4 KiB. The provider rings through its process's doorbell ring, a record in memory the
# kernel mapped plus a write to the device's notify page mapped the same way (docs/virtio-rdma.md
# "Doorbell rings"): the tool's write() and ioctl() calls are its set-up and tear-down only, and
# vrdmad took at least one doorbell per post from rings, almost none from the doorbell queue.
no_syscall_per_post() {
  local n=2000 s0 s1 calls ring queue
  guest 10 "$work/strace.which" "command -v strace" || true
  if ! grep -q "/strace" "$work/strace.which"; then echo "SKIP no system call per post: no strace in the guest"; return; fi
  s0=$(vstatus)
  # strace prints its table on stderr, which the guest's output carries.
  PT_N=$n pt_case write_bw_strace client "strace -f -c ib_write_bw" write_bw 4096
  s1=$(vstatus)
  grep -E " (write|ioctl|total)\$" "$work/write_bw_strace.guest" | sed 's/^/  strace: /' || true
  calls=$(awk '$NF == "write" || $NF == "ioctl" {c += $4} END {print c + 0}' "$work/write_bw_strace.guest")
  ring=$(delta "$s0" "$s1" ring_doorbells)
  queue=$(delta "$s0" "$s1" doorbells)
  [[ $queue$ring =~ ^[0-9]+$ ]] && queue=$((queue - ring))
  check "ib_write_bw's $n posts under strace -c: $calls write/ioctl calls in all (fewer than $((n / 10))); vrdmad took $ring doorbells from doorbell rings (at least $n), $queue from the doorbell queue (at most 20)" \
    bash -c "grep -qE ' total\$' '$work/write_bw_strace.guest' && [ $calls -lt $((n / 10)) ] && [ $ring -ge $n ] && [ $queue -le 20 ]"
}
# 4h. RDMA-CM (issue 31): Debian's unmodified rping in the guest, as an unprivileged user, connects
#     with the guest kernel's rdma_cm and ib_cm, whose CM MADs (REQ, REP, RTU, DREQ, DREP) go
#     through the device's GSI QP (QP1: ib_mad on the driver's kernel QP, CQ and DMA MR; the soft
#     engine hands QP1 to the guest) to vrdma-perf's CM on the host's soft engine; rping's own
#     QP and data go through the provider. 40 rounds of 4 KiB, every byte checked by both (-V).
# rping_client NAME COUNT: vrdma-perf's rping server on the host, `rping -c -C COUNT -S 4096 -V`
# (uid 1000) in the guest; their output in $work/NAME.host and .guest, ok=0 when vrdma-perf exited 0.
rping_client() {
  local hp
  ok=1
  timeout 120 ip netns exec "$NS" "$PERF" --device soft:$PERFIP --peer-format rping --size 4096 >"$work/$1.host" 2>&1 &
  hp=$!
  sleep 1
  guest 120 "$work/$1.guest" "modprobe rdma_ucm; su -s /bin/sh vrdma -c \"id; timeout 90 rping -c -a $PERFIP -I $DEVIP -C $2 -S 4096 -V && echo RPING-OK\"" || true
  wait $hp && ok=0
  kill $hp 2>/dev/null || true
  sed 's/^/  guest: /' "$work/$1.guest" | grep -v "===" | cut -c1-200; sed 's/^/  host: /' "$work/$1.host" | cut -c1-400
}
# ucmatose_case NAME ROLE COUNT: Debian's ucmatose (uid 1000) in the guest as ROLE (client:
# vrdma-perf --peer-format ucmatose serving on the host; server: vrdma-perf connecting), COUNT
# messages of 4 KiB each way; both sides exit 0, ucmatose says "return status 0", vrdma-perf
# counted every message and its length (it completed all its sends when it is the server).
ucmatose_case() {
  local name=$1 role=$2 n=$3 hp ok=1 what
  if [ "$role" = client ]; then
    timeout 120 ip netns exec "$NS" "$PERF" --device soft:$PERFIP --peer-format ucmatose --size 4096 --iters "$n" >"$work/$name.host" 2>&1 &
    hp=$!
    sleep 1
    guest 120 "$work/$name.guest" "su -s /bin/sh vrdma -c \"id; timeout 90 ucmatose -s $PERFIP -b $DEVIP -C $n -S 4096\"" && wait $hp && ok=0
    kill $hp 2>/dev/null || true
    what="ucmatose -s (uid 1000, client) in the guest with vrdma-perf's ucmatose server"
  else
    guest 15 "$work/$name.start" "((su -s /bin/sh vrdma -c \"id; timeout 90 ucmatose -b $DEVIP -C $n -S 4096\"; echo tool-rc=\$?) > /tmp/$name.out 2>&1 &); sleep 1" || true
    timeout 90 ip netns exec "$NS" "$PERF" --device soft:$PERFIP --connect $DEVIP --peer-format ucmatose --size 4096 --iters "$n" \
      >"$work/$name.host" 2>&1 && ok=0
    guest 70 "$work/$name.guest" "for i in \$(seq 250); do grep -q '^tool-rc=' /tmp/$name.out && break; sleep 0.2; done; cat /tmp/$name.out" || true
    grep -q '^tool-rc=0$' "$work/$name.guest" || ok=1
    what="ucmatose (uid 1000, server) in the guest, vrdma-perf connecting"
  fi
  sed 's/^/  guest: /' "$work/$name.guest" | grep -v "===" | cut -c1-200; sed 's/^/  host: /' "$work/$name.host" | cut -c1-400
  check "$what through RDMA-CM${LOSS:+ with $LOSS}: $n x 4 KiB each way, both exit 0, every message counted by vrdma-perf" \
    bash -c "[ $ok = 0 ] && grep -q '^uid=1000(vrdma)' '$work/$name.guest' && grep -q '^return status 0' '$work/$name.guest' &&
      grep -q '\"ok\":true' '$work/$name.host' && grep -q '\"received\":$n,' '$work/$name.host' &&
      grep -q '\"bytes_received\":$((n * 4096)),' '$work/$name.host' && { [ $role = server ] || grep -q '\"sent\":$n,' '$work/$name.host'; }"
}
# perftest_cm NAME TEST SIZE: vrdma-perf serving perftest -R (--cm) on the host, the guest's
# ib_TEST -R -n 200 -s SIZE (uid 1000) its client; outputs in $work/NAME.host and .guest; ok=0
# when both exited 0.
perftest_cm() {
  local hp
  ok=1
  timeout 90 ip netns exec "$NS" "$PERF" --device soft:$PERFIP --peer-format perftest --cm --test "$2" --size "$3" \
    >"$work/$1.host" 2>&1 &
  hp=$!
  sleep 1
  guest 90 "$work/$1.guest" "su -s /bin/sh vrdma -c \"id; timeout 60 ib_$2 -R -d vrdma0 -x ${G:-1} -F -n 200 -s $3 $PERFIP\"" && wait $hp && ok=0
  kill $hp 2>/dev/null || true
  sed 's/^/  guest: /' "$work/$1.guest" | grep -v "===" | grep -vE "^  guest: -+$" | cut -c1-200; sed 's/^/  host: /' "$work/$1.host" | cut -c1-400
}
# perftest_cm_server NAME TEST SIZE: the guest's ib_TEST -R -n 200 -s SIZE (uid 1000) serving,
# vrdma-perf its client from the host (--cm --connect: perftest's client records, then 200 SENDs
# or WRITEs); vrdmad's wire counters before and after in $work/NAME.s0/.s1; ok=0 when both
# exited 0.
perftest_cm_server() {
  ok=1
  vstatus >"$work/$1.s0"
  guest 15 "$work/$1.start" "((su -s /bin/sh vrdma -c \"id; timeout 60 ib_$2 -R -d vrdma0 -x ${G:-1} -F -n 200 -s $3\"; echo tool-rc=\$?) > /tmp/$1.out 2>&1 &); sleep 1" || true
  timeout 90 ip netns exec "$NS" "$PERF" --device soft:$PERFIP --peer-format perftest --cm --test "$2" --size "$3" \
    --iters 200 --connect $DEVIP >"$work/$1.host" 2>&1 && ok=0
  guest 70 "$work/$1.guest" "for i in \$(seq 250); do grep -q '^tool-rc=' /tmp/$1.out && break; sleep 0.2; done; cat /tmp/$1.out" || true
  grep -q '^tool-rc=0$' "$work/$1.guest" || ok=1
  vstatus >"$work/$1.s1"
  sed 's/^/  guest: /' "$work/$1.guest" | grep -v "===" | grep -vE "^  guest: -+$" | cut -c1-200; sed 's/^/  host: /' "$work/$1.host" | cut -c1-400
}
rdma_cm_rping() {
  local ok hp
  rping_client rping 40
  check "rping -c (uid 1000) through the guest kernel's RDMA-CM over QP1 to vrdma-perf's CM: 40 x 4 KiB verified by both, both exit 0" \
    bash -c "[ $ok = 0 ] && grep -q '^uid=1000(vrdma)' '$work/rping.guest' && grep -q '^RPING-OK' '$work/rping.guest' &&
      grep -q '\"verified\":true' '$work/rping.host' && grep -q '\"pings\":40,' '$work/rping.host'"
  # The other role: rping listens in the guest (rdma_cm's listener takes the REQ that came to QP1),
  # vrdma-perf connects from the host.
  ok=1
  guest 15 "$work/rping_s.start" "((su -s /bin/sh vrdma -c \"id; timeout 60 rping -s -a $DEVIP -S 4096 -V && echo RPING-OK\"; echo tool-rc=\$?) > /tmp/rping_s.out 2>&1 &); sleep 1" || true
  timeout 90 ip netns exec "$NS" "$PERF" --device soft:$PERFIP --connect $DEVIP --peer-format rping --size 4096 --iters 40 \
    >"$work/rping_s.host" 2>&1 && ok=0
  guest 70 "$work/rping_s.guest" "for i in \$(seq 250); do grep -q '^tool-rc=' /tmp/rping_s.out && break; sleep 0.2; done; cat /tmp/rping_s.out" || true
  sed 's/^/  guest: /' "$work/rping_s.guest" | grep -v "===" | cut -c1-200; sed 's/^/  host: /' "$work/rping_s.host" | cut -c1-400
  check "rping -s (uid 1000) in the guest, vrdma-perf connecting through its CM to the guest's QP1: 40 x 4 KiB verified by both, both exit 0" \
    bash -c "[ $ok = 0 ] && grep -q '^uid=1000(vrdma)' '$work/rping_s.guest' && grep -q '^RPING-OK' '$work/rping_s.guest' &&
      grep -q '\"verified\":true' '$work/rping_s.host' && grep -q '\"pings\":40,' '$work/rping_s.host'"
  # perftest over RDMA-CM: ib_send_bw -R in the guest against vrdma-perf's CM listener.
  perftest_cm sendR send_bw 4096
  check "ib_send_bw -R (uid 1000) through RDMA-CM with vrdma-perf: 200 x 4 KiB, both exit 0, the data moved" \
    bash -c "[ $ok = 0 ] && grep -q '^uid=1000(vrdma)' '$work/sendR.guest' && grep -qE '^ *4096 +200 ' '$work/sendR.guest' &&
      grep -q '\"ops\":200,' '$work/sendR.host' && ! grep -q '\"verified\":false' '$work/sendR.host'"
  # ib_write_bw -R: vrdma-perf names its buffer in perftest's key records (sent over the first
  # RDMA-CM connection); the WRITEs' packets reach its engine: 200 x 64 at path MTU 1024, which
  # rdma_cm takes from the guest's netdev (1500 bytes; perftest prints the port's 4096).
  perftest_cm writeR write_bw 65536
  local rx
  rx=$(jfield "$(grep '^{' "$work/writeR.host" | tail -1)" engine.rx_packets)
  check "ib_write_bw -R (uid 1000) through RDMA-CM with vrdma-perf: 200 x 64 KiB written into the buffer it named, both exit 0, its engine received $rx packets (at least 12800)" \
    bash -c "[ $ok = 0 ] && grep -q '^uid=1000(vrdma)' '$work/writeR.guest' && grep -qE '^ *65536 +200 ' '$work/writeR.guest' && [ '$rx' -ge 12800 ]"
  # ib_read_bw -R: the guest READs the buffer vrdma-perf names; its engine sends every response
  # (200 x 64 at path MTU 1024).
  perftest_cm readR read_bw 65536
  local tx
  tx=$(jfield "$(grep '^{' "$work/readR.host" | tail -1)" engine.tx_packets)
  check "ib_read_bw -R (uid 1000) through RDMA-CM with vrdma-perf: 200 x 64 KiB read from the buffer it named, both exit 0, its engine sent $tx packets (at least 12800)" \
    bash -c "[ $ok = 0 ] && grep -q '^uid=1000(vrdma)' '$work/readR.guest' && grep -qE '^ *65536 +200 ' '$work/readR.guest' && [ '$tx' -ge 12800 ]"
  # The other role: ib_send_bw -R and ib_write_bw -R serving in the guest, vrdma-perf their client
  # (perftest's client records; for write_bw the buffer the guest named, and our report, which the
  # guest prints as its result: so the WRITEs' bytes are counted at vrdmad, which received them).
  perftest_cm_server sendRs send_bw 4096
  check "ib_send_bw -R (uid 1000) serving in the guest, vrdma-perf its client through RDMA-CM: 200 x 4 KiB received by the tool, both exit 0" \
    bash -c "[ $ok = 0 ] && grep -q '^uid=1000(vrdma)' '$work/sendRs.guest' && grep -qE '^ *4096 +200 ' '$work/sendRs.guest' &&
      grep -q '\"ops\":200,' '$work/sendRs.host'"
  perftest_cm_server writeRs write_bw 65536
  rx=$(delta "$(cat "$work/writeRs.s0")" "$(cat "$work/writeRs.s1")" wire.rx_bytes)
  check "ib_write_bw -R (uid 1000) serving in the guest, vrdma-perf its client: 200 x 64 KiB written into the buffer the guest named ($rx bytes reached vrdmad), both exit 0" \
    bash -c "[ $ok = 0 ] && grep -q '^uid=1000(vrdma)' '$work/writeRs.guest' && grep -qE '^ *65536 +200 ' '$work/writeRs.guest' &&
      grep -q '\"ops\":200,' '$work/writeRs.host' && [ '$rx' -ge $((200 * 65536)) ] 2>/dev/null"
  ucmatose_case ucm_c client 100
  ucmatose_case ucm_s server 100
}
# RDMA-CM with loss (issue 31): rping against vrdma-perf again with nftables dropping 2 % of the
# RoCE packets, CM MADs included (ib_cm resends a lost REQ/REP/RTU; the data's losses are
# repaired by retransmission).
rdma_cm_with_loss() {
  local ok s0 s1 dropped
  loss_on
  s0=$(vstatus)
  rping_client rpingl 200
  s1=$(vstatus)
  dropped=$(loss_off)
  check "rping -c (uid 1000) through RDMA-CM with 2 % of RoCE packets dropped (${dropped:-?} dropped): 200 x 4 KiB verified by both, both exit 0" \
    bash -c "[ $ok = 0 ] && grep -q '^RPING-OK' '$work/rpingl.guest' && grep -q '\"verified\":true' '$work/rpingl.host' &&
      grep -q '\"pings\":200,' '$work/rpingl.host' && [ '${dropped:-0}' -gt 0 ]"
  check "rping with loss: the loss was repaired by retransmission" resent "$s0" "$s1" "$work/rpingl.host"
  loss_on
  LOSS="2 % loss" ucmatose_case ucml_c client 200
  LOSS="2 % loss" ucmatose_case ucml_s server 200
  dropped=$(loss_off)
  check "ucmatose with loss: packets were dropped (${dropped:-?})" bash -c "[ '${dropped:-0}' -gt 0 ]"
  # perftest -R in both roles with loss: ib_write_bw -R serving in the guest, vrdma-perf writing;
  # ib_send_bw -R in the guest as client, vrdma-perf serving.
  loss_on
  perftest_cm_server writeRsl write_bw 65536
  dropped=$(loss_off)
  rx=$(delta "$(cat "$work/writeRsl.s0")" "$(cat "$work/writeRsl.s1")" wire.rx_bytes)
  check "ib_write_bw -R serving in the guest with 2 % loss (${dropped:-?} dropped): 200 x 64 KiB from vrdma-perf, $rx bytes reached vrdmad, both exit 0" \
    bash -c "[ $ok = 0 ] && grep -qE '^ *65536 +200 ' '$work/writeRsl.guest' && grep -q '\"ops\":200,' '$work/writeRsl.host' &&
      [ '$rx' -ge $((200 * 65536)) ] 2>/dev/null && [ '${dropped:-0}' -gt 0 ]"
  loss_on
  perftest_cm sendRl send_bw 4096
  dropped=$(loss_off)
  check "ib_send_bw -R in the guest as client with 2 % loss (${dropped:-?} dropped): 200 x 4 KiB counted by vrdma-perf, both exit 0" \
    bash -c "[ $ok = 0 ] && grep -qE '^ *4096 +200 ' '$work/sendRl.guest' && grep -q '\"ops\":200,' '$work/sendRl.host' && [ '${dropped:-0}' -gt 0 ]"
}

# 4f. Two processes on vrdma0 at once, one SIGKILLed mid-run (issue 25): a "victim"
# ibv_rc_pingpong client (uid 1000) exchanging 4 KiB messages without end with a vrdma-perf on
# port 18517, and a "survivor" ibv_rc_pingpong server (uid 1000, port 18518) holding its PD, MR,
# CQ and QP, its receives posted. The victim is SIGKILLed while its messages flow: ib_core's
# cleanup of its context destroys its objects through the driver (vrdmad's counts back to the
# survivor's one of each) and the survivor's QP, made before the kill, then serves 200 messages
# with a vrdma-perf connecting (every byte verified); after it exits vrdmad holds nothing. The
# guest's log has no WARNING/BUG/Oops, vrdmad's no error while the survivor ran.
# 4g. Path MTU 4096 (br0's MTU 9000 gives both soft engines an active MTU of 4096), then the same
# with nftables dropping 2 % of RoCE packets both ways (every RoCE packet here is delivered
# locally in the namespace: the input hook sees each once, whichever way it goes). The data is
# checked as above, and vrdma-perf's engine counters show the loss was repaired: its own resends
# (retransmits, re-read READs, tail probes) or the guest side's (vrdmad's engine): the sequence
# NAKs it sent for their gaps and the duplicates it received (and vrdmad's own counts when its
# status has them, "wire").
resent() {  # resent STATUS-BEFORE STATUS-AFTER HOSTLOG
  python3 - "$@" <<'PY'
import json, sys
def wire(s):
    try: return json.loads(s).get("wire") or {}
    except Exception: return {}
a, b = wire(sys.argv[1]), wire(sys.argv[2])
ours = {k: b.get(k, 0) - a.get(k, 0) for k in ("retransmits", "read_rereads") if k in b}
lines = [l for l in open(sys.argv[3]) if l.lstrip().startswith("{")]
e = json.loads(lines[-1]).get("engine", {}) if lines else {}
peer = {k: e.get(k, 0) for k in ("retransmits", "read_rereads", "tail_probes", "seq_naks_sent", "duplicates_received")}
print(f"  resent: vrdma-perf {peer}" + (f", vrdmad {ours}" if ours else ""))
sys.exit(0 if sum(peer.values()) + sum(ours.values()) > 0 else 1)
PY
}
lossy() {  # lossy HOSTLOG-NAME CASE-FUNCTION ARGS...: the case, then its retransmissions checked
  local name=$1 s0 s1; shift
  s0=$(vstatus); "$@"; s1=$(vstatus)
  check "$name: the loss was repaired by retransmission" resent "$s0" "$s1" "$work/$name.host"
}
# loss_on: nftables drops 2 % of RoCE packets at the namespace's input hook. The engines send
# runs of packets with UDP segmentation offload, which lo delivers whole: with it off, lo's
# transmit path cuts the runs and the input hook sees (and drops) single packets. loss_off undoes
# both and prints how many packets were dropped.
loss_on() {
  ip netns exec "$NS" ethtool -K lo tx-udp-segmentation off >&2 || echo "  (lo keeps its UDP segmentation offload: a drop takes a whole run)"
  ip netns exec "$NS" nft -f - <<'EOF'
table inet vrdma_loss {
  chain in { type filter hook input priority 0; udp dport 4791 numgen random mod 100 < 2 counter drop; }
}
EOF
}
loss_off() {
  ip netns exec "$NS" nft list table inet vrdma_loss | sed -n 's/.*counter packets \([0-9]*\).*/\1/p'
  ip netns exec "$NS" nft delete table inet vrdma_loss >&2
  ip netns exec "$NS" ethtool -K lo tx-udp-segmentation on >&2 || true
}
mtu_and_loss() {
  local g=${G:-1} dropped
  MTU=4096 PT_N=100
  pp_case rc4k ibv_rc_pingpong "--peer-format pingpong --size 8192 --iters 100 --mtu 4096" \
    "-d vrdma0 -g $g -m 4096 -s 8192 -n 100 -c" 8192 100 200 client
  pt_case write_bw_4k_c client ib_write_bw write_bw 65536
  pt_case read_bw_4k_c client ib_read_bw read_bw 65536
  loss_on
  LOSS="2 % loss"
  lossy rc4kl_c pp_case rc4kl ibv_rc_pingpong "--peer-format pingpong --size 8192 --iters 200 --mtu 4096" \
    "-d vrdma0 -g $g -m 4096 -s 8192 -n 200 -c" 8192 200 400 client
  lossy write_bw_4kl_c pt_case write_bw_4kl_c client ib_write_bw write_bw 65536
  lossy write_bw_4kl_s pt_case write_bw_4kl_s server ib_write_bw write_bw 65536
  lossy read_bw_4kl_c pt_case read_bw_4kl_c client ib_read_bw read_bw 65536
  dropped=$(loss_off)
  check "nftables dropped RoCE packets in the loss round ($dropped)" bash -c "[ '${dropped:-0}' -gt 0 ]"
  unset MTU PT_N LOSS
}
listening() { for _ in $(seq 100); do ip netns exec "$NS" ss -ltn 2>/dev/null | grep -q ":$1 " && return 0; sleep 0.1; done; return 1; }
two_processes() {
  local hv log0 s0 s1 held after victim pp="-d vrdma0 -g ${G:-1} -s 4096"
  log0=$(wc -l < "$work/vrdmad.log")
  timeout 90 ip netns exec "$NS" "$PERF" --device soft:$PERFIP --peer-format pingpong --size 4096 --iters 100000000 --mtu 1024 \
    --port 18517 >"$work/victim.host" 2>&1 &
  hv=$!
  listening 18517 || true
  guest 30 "$work/two.start" "(su -s /bin/sh vrdma -c \"id; timeout 60 ibv_rc_pingpong $pp -n 100000000 -p 18517 $TCPHOST\" > /tmp/victim.out 2>&1 &); (su -s /bin/sh vrdma -c \"id; timeout 60 ibv_rc_pingpong $pp -n 200 -p 18518\" > /tmp/survivor.out 2>&1 &); for i in \$(seq 100); do v=; for p in \$(pidof ibv_rc_pingpong); do grep -q 18517 /proc/\$p/cmdline && v=\$p; done; [ -n \"\$v\" ] && break; sleep 0.1; done; echo victim=\$v" || true
  victim=$(sed -n 's/^victim=\([0-9]*\)$/\1/p' "$work/two.start" | head -1)
  vwait objects.qp 2 10 >/dev/null; sleep 0.5; s0=$(vstatus); sleep 0.5; s1=$(vstatus)
  held="$(jfield "$s1" objects.pd)$(jfield "$s1" objects.mr)$(jfield "$s1" objects.cq)$(jfield "$s1" objects.qp)"
  guest 30 "$work/two.kill" "kill -9 ${victim:-none}; for i in \$(seq 50); do [ -d /proc/${victim:-none} ] || break; sleep 0.1; done; [ -d /proc/${victim:-none} ] || echo victim gone; dmesg | grep -E \"WARNING|BUG|Oops\" || true" || true
  after=$(vwait objects.qp 1 10)
  kill $hv 2>/dev/null || true
  wait $hv 2>/dev/null || true
  sed 's/^/  guest: /' "$work/two.start" "$work/two.kill" | grep -v "===" | cut -c1-200
  check "two processes (uid 1000) on vrdma0 at once, each holding a PD, MR, CQ and QP (objects $(jfield "$s1" objects)), the victim's SENDs flowing (vrdmad send WQEs $(jfield "$s0" send_wqes) -> $(jfield "$s1" send_wqes) in 0.5 s)" \
    bash -c "[ -n '$victim' ] && [ '$held' = 2222 ] && [ '$(jfield "$s1" send_wqes)' -gt '$(jfield "$s0" send_wqes)' ]"
  check "the SIGKILLed one's objects were destroyed, the survivor's kept (vrdmad objects $(jfield "$after" objects))" \
    bash -c "grep -q '^victim gone' '$work/two.kill' && [ '$(jfield "$after" objects.pd)$(jfield "$after" objects.mr)$(jfield "$after" objects.cq)$(jfield "$after" objects.qp)' = 1111 ]"
  timeout 90 ip netns exec "$NS" "$PERF" --device soft:$PERFIP --connect $TCPGUEST --port 18518 --peer-format pingpong \
    --size 4096 --iters 200 --mtu 1024 >"$work/survivor.host" 2>&1 || true
  guest 70 "$work/survivor.guest" "for i in \$(seq 250); do pidof ibv_rc_pingpong >/dev/null || break; sleep 0.2; done; cat /tmp/survivor.out; dmesg | grep -E \"WARNING|BUG|Oops\" || true" || true
  s=$(vwait objects.pd 0 10)
  sed 's/^/  guest: /' "$work/survivor.guest" | grep -v "===" | cut -c1-200; sed 's/^/  host: /' "$work/survivor.host" | cut -c1-400
  tail -n +"$((log0 + 1))" "$work/vrdmad.log" | grep -iE 'error|refused|warn|fail' > "$work/two.vrdmad" || true
  sed 's/^/  vrdmad: /' "$work/two.vrdmad" | cut -c1-300
  check "the survivor carried on: 200 x 4096 B each way with vrdma-perf after the kill, every byte verified" \
    pp_ok "$work/survivor.host" "$work/survivor.guest" 4096 200 800
  check "the survivor's objects destroyed when it exited (vrdmad objects $(jfield "$s" objects)); no WARNING/BUG/Oops in the guest, no error in vrdmad's log" \
    bash -c "[ '$(jfield "$s" objects.pd)$(jfield "$s" objects.mr)$(jfield "$s" objects.cq)$(jfield "$s" objects.qp)' = 0000 ] &&
      ! grep -qE 'WARNING|BUG|Oops' '$work/two.kill' '$work/survivor.guest' && [ ! -s '$work/two.vrdmad' ]"
}
if [ -n "$PROVIDER" ]; then
  ip -n "$NS" addr add $PERFIP/24 dev br0
  ip -n "$NS" addr add $TCPHOST/24 dev tap0
  guest 30 "$work/devinfo.out" "ip addr add $TCPGUEST/24 dev eth0; arp -i eth0 -s $PERFIP 02:00:0a:4d:09:01; modprobe ib_uverbs; ls -l /dev/infiniband/uverbs0; ibv_devices; ibv_devinfo -v -d vrdma0; cd /sys/class/infiniband/vrdma0 && $GIDS" || true
  sed 's/^/  guest: /' "$work/devinfo.out" | grep -v "===" | grep -vE "^  guest: +(GID|\s*$)" | cut -c1-200 | head -60
  G=$(sed -n "s/^gid \([0-9]*\) $WANT_GID RoCE v2 eth0\$/\1/p" "$work/devinfo.out" | head -1)
  check "the provider's package (installed into the guest as dpkg does): $PPKG" \
    eval '[[ "$PPKG" =~ ^ibverbs-provider-vrdma_[0-9.]+_amd64\.deb\ ibverbs-provider-vrdma\ [0-9.]+\ amd64\ libibverbs1\ \(\>=\ [0-9] ]] &&
      [[ "$PROVIDER" =~ ^/usr/lib/x86_64-linux-gnu/libibverbs/libvrdma-rdmav[0-9]+\.so$ ]]'
  check "ibv_devices (Debian's, through libvrdma) lists vrdma0" bash -c "grep -qE '^\s+vrdma0\s+[0-9a-f]{16}\s*\$' '$work/devinfo.out'"
  check "ibv_devinfo -d vrdma0: port 1 PORT_ACTIVE, Ethernet, vrdmad's limits (max_qp 1000, max_qp_wr 512, max_cq 2000, max_mr 3000, max_pd 5)" \
    bash -c "grep -qE 'state:\s+PORT_ACTIVE \(4\)' '$work/devinfo.out' && grep -qE 'link_layer:\s+Ethernet' '$work/devinfo.out' &&
      grep -qE 'max_qp:\s+1000\s*\$' '$work/devinfo.out' && grep -qE 'max_qp_wr:\s+512\s*\$' '$work/devinfo.out' &&
      grep -qE 'max_cq:\s+2000\s*\$' '$work/devinfo.out' && grep -qE 'max_mr:\s+3000\s*\$' '$work/devinfo.out' && grep -qE 'max_pd:\s+5\s*\$' '$work/devinfo.out'"
  # RC: 4 KiB messages, 4 packets each at MTU 1024.
  pp_case rcpp ibv_rc_pingpong "--peer-format pingpong --size 4096 --iters 200 --mtu 1024" \
    "-d vrdma0 -g ${G:-1} -s 4096 -n 200 -c" 4096 200 800
  # UD: 1 KiB messages through an AH (40 bytes of GRH before each received one), one packet each.
  pp_case udpp ibv_ud_pingpong "--peer-format pingpong --connection UD --size 1024 --iters 200 --mtu 1024" \
    "-d vrdma0 -g ${G:-1} -s 1024 -n 200 -c" 1024 200 200
  # SRQ: 16 RC QPs a side (the tool's default), every receive from one SRQ; -n counts over all QPs.
  pp_case srqpp ibv_srq_pingpong "--peer-format pingpong --srq --size 4096 --iters 400 --mtu 1024" \
    "-d vrdma0 -g ${G:-1} -m 1024 -s 4096 -n 400 -c" 4096 400 1600
  # The extended send API (docs/virtio-rdma.md "The rdma-core provider"), uid 1000: every builder
  # and setter, wr_abort, the latched errors, UD addresses (verbs_wr.c); vrdmad saw exactly the
  # doorbells and send WQEs the program posted (one doorbell a batch; nothing of an aborted or
  # failed one) and refused none.
  s0=$(vstatus)
  guest 60 "$work/verbs_wr.out" "su -s /bin/sh vrdma -c \"id; timeout 40 verbs_wr ${G:-1}\"" || true
  s1=$(vstatus)
  sed 's/^/  guest: /' "$work/verbs_wr.out" | grep -v "===" | cut -c1-220
  rung=$(sed -n 's/^doorbells=\([0-9]*\) send_wqes=\([0-9]*\)$/\1 \2/p' "$work/verbs_wr.out")
  grew() { delta "$s0" "$s1" "$1"; }
  saw="$(grew doorbells) $(grew send_wqes)"
  check "verbs_wr (uid 1000): ibv_create_qp_ex send ops and every ibv_wr_* builder and setter, abort, latched errors, UD ($(grep -c '^ok ' "$work/verbs_wr.out") checks)" \
    bash -c "grep -q '^uid=1000(vrdma)' '$work/verbs_wr.out' && grep -q '^verbs_wr: 0 failed' '$work/verbs_wr.out' && [ \$(grep -c '^ok ' '$work/verbs_wr.out') -ge 20 ]"
  check "vrdmad counted exactly the program's doorbells and send WQEs (program: ${rung:-?}, vrdmad: $saw), no doorbell or WQE error" \
    bash -c "[ -n '$rung' ] && [ '$rung' = '$saw' ] && [ '$(grew doorbell_errors)' = 0 ] && [ '$(grew wqe_errors)' = 0 ]"
  # The extended CQ (verbs_wr's cq_ex mode, verbs_cqx.c), uid 1000: ibv_create_cq_ex's refusals, two RC QPs'
  # completions through start/next/end_poll with every field read and the bytes checked, the ring's
  # wrap, ibv_poll_cq and req_notify_cq on the same CQs.
  guest 60 "$work/verbs_cqx.out" "su -s /bin/sh vrdma -c \"id; timeout 40 verbs_wr ${G:-1} cq_ex\"" || true
  sed 's/^/  guest: /' "$work/verbs_cqx.out" | grep -v "===" | cut -c1-220
  check "verbs_wr cq_ex (uid 1000): ibv_create_cq_ex and ibv_start_poll/next_poll/end_poll, every field and byte, ibv_poll_cq on it ($(sed -n 's/^verbs_wr cq_ex: //p' "$work/verbs_cqx.out"))" \
    bash -c "grep -q '^uid=1000(vrdma)' '$work/verbs_cqx.out' && grep -qE '^verbs_wr cq_ex: [0-9]+ ok, 0 failed\$' '$work/verbs_cqx.out' &&
      [ \$(grep -c '^ok ' '$work/verbs_cqx.out') -ge 24 ]"
  # perftest with its defaults, the guest as client: every RC test; as server: the bandwidth
  # tests (vrdma-perf writes, reads, sends) and the latency tests (vrdma-perf --connect: WRITE and
  # SEND ping-pong, READs of the guest's buffer); and ib_send_bw over UD as client.
  pt_case write_bw_c client ib_write_bw write_bw 65536
  pt_case send_bw_c client ib_send_bw send_bw 65536
  pt_case read_bw_c client ib_read_bw read_bw 65536
  pt_case atomic_faa_c client ib_atomic_bw atomic_bw 8
  pt_case atomic_cas_c client ib_atomic_bw atomic_bw 8 "-A CMP_AND_SWAP"
  pt_case write_lat_c client ib_write_lat write_lat 64 "" "--iters 200"
  pt_case send_lat_c client ib_send_lat send_lat 64 "" "--iters 200"
  pt_case read_lat_c client ib_read_lat read_lat 4096 "" "--iters 200"
  pt_case write_bw_s server ib_write_bw write_bw 65536
  pt_case read_bw_s server ib_read_bw read_bw 65536
  pt_case send_bw_s server ib_send_bw send_bw 65536
  pt_case write_lat_s server ib_write_lat write_lat 64
  pt_case send_lat_s server ib_send_lat send_lat 64
  pt_case read_lat_s server ib_read_lat read_lat 4096
  pt_case send_bw_ud_c client ib_send_bw send_bw 1024 "-c UD" "--connection UD"
  no_syscall_per_post
  s=$(vwait objects.pd 0 5)
  check "the tools' PDs, MRs, CQs, QPs, AHs and SRQs were destroyed (vrdmad objects $(jfield "$s" objects))" \
    bash -c "[ '$(jfield "$s" objects.pd)$(jfield "$s" objects.mr)$(jfield "$s" objects.cq)$(jfield "$s" objects.qp)$(jfield "$s" objects.ah)$(jfield "$s" objects.srq)' = 000000 ]"
  t=$(date +%s); two_processes; echo "  (two processes: $(($(date +%s) - t)) s)"
  t=$(date +%s); mtu_and_loss; echo "  (MTU 4096 and loss: $(($(date +%s) - t)) s)"
  t=$(date +%s); rdma_cm_rping; echo "  (RDMA-CM: $(($(date +%s) - t)) s)"
  t=$(date +%s); rdma_cm_with_loss; echo "  (RDMA-CM with loss: $(($(date +%s) - t)) s)"
else
  echo "SKIP the provider's checks (4e): no provider in the guest"
fi

# 4i. NVMe over Fabrics (issue 31) on the kernel's own verbs: the guest's nvmet-rdma target
#     (a 16 MiB file namespace) listens on vrdma0's address, and the guest's nvme-rdma initiator
#     (Debian's unmodified nvme-cli) connects to it there: RDMA-CM through QP1 both ways, then
#     every I/O fast-registers its pages (ib_alloc_mr, ib_map_mr_sg, IB_WR_REG_MR through the
#     device's REG_MR WQE) and the target answers with SEND with Invalidate. 4 MiB of random data
#     written with O_DIRECT must read back the same, and be in the target's file; the initiator
#     disconnects cleanly; vrdmad's engine counts the fast registrations and remote invalidations.
nvme_of() {
  local s0 s1 fr ri c
  # One line: the guest's console takes a command a line. The target: tests/conformance/nvmet_target.sh.
  c="nvmet-target $DEVIP 16 && modprobe nvme-rdma &&"
  # The host NQN with a host ID of its own: Linux 6.12 refuses a host NQN given with the
  # kernel's default host's ID ("found same hostid but different hostnqn"); 6.1 took it.
  c+=" timeout 90 nvme connect -t rdma -a $DEVIP -s 4420 -n vrdma-nvme --hostnqn=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000a11c --hostid=00000000-0000-0000-0000-00000000a11c &&"
  c+=" for i in \$(seq 100); do [ -b /dev/nvme0n1 ] && break; sleep 0.1; done && echo CONNECTED \$(cat /sys/block/nvme0n1/size) &&"
  c+=" dd if=/dev/urandom of=/tmp/pat bs=64k count=64 2>/dev/null &&"
  c+=" timeout 60 dd if=/tmp/pat of=/dev/nvme0n1 bs=64k oflag=direct 2>/dev/null &&"
  c+=" timeout 60 dd if=/dev/nvme0n1 of=/tmp/back bs=64k count=64 iflag=direct 2>/dev/null &&"
  c+=" echo SUMS \$(md5sum < /tmp/pat | cut -c1-32) \$(md5sum < /tmp/back | cut -c1-32) \$(head -c 4194304 /tmp/ns.img | md5sum | cut -c1-32);"
  c+=" timeout 60 nvme disconnect -n vrdma-nvme; echo disconnect-rc=\$?; dmesg | grep -iE \"nvme|rdma\" | tail -n 12"
  s0=$(vstatus)
  guest 150 "$work/nvme.out" "$c" || true
  s1=$(vstatus)
  sed 's/^/  guest: /' "$work/nvme.out" | grep -v "===" | cut -c1-240
  # The engine's counters (vrdmad's status "wire").
  fr=$(delta "$s0" "$s1" wire.fast_registrations)
  ri=$(delta "$s0" "$s1" wire.remote_invalidations)
  echo "  (vrdmad's engine: $fr fast registrations, $ri remote invalidations)"
  check "nvme connect -t rdma over vrdma0 to the guest's own nvmet-rdma target: a 16 MiB namespace appears" \
    bash -c "grep -q '^CONNECTED 32768' '$work/nvme.out'"
  check "4 MiB written and read back with O_DIRECT through NVMe/RDMA are the same, and in the target's file" \
    bash -c "grep -qE '^SUMS ([0-9a-f]{32}) \\1 \\1\$' '$work/nvme.out'"
  check "nvme disconnect ends the association cleanly" has "$work/nvme.out" "^disconnect-rc=0"
  check "every I/O went through fast registration (REG_MR WQEs) and SEND with Invalidate ($fr and $ri)" \
    bash -c "[ $fr -ge 64 ] && [ $ri -ge 64 ]"
}
if grep -q "^NVME-SKIP" "$work/make_guest.err"; then
  echo "SKIP 4i (NVMe over Fabrics): $(sed -n 's/^NVME-SKIP: //p' "$work/make_guest.err")"
else
  t=$(date +%s); nvme_of; echo "  (NVMe over Fabrics: $(($(date +%s) - t)) s)"
fi

# 4j. UCX (issue 25): Debian's unmodified ucx_perftest 1.13, server and client as uid 1000 on
#     vrdma0 (rc_verbs, wired up over ud_verbs), with UCX's destination-GID filter on: it finds a
#     UD datagram's address family in the completion's SL, where the provider reports ConnectX's
#     IPv4 code (VIRTIO_RDMA_ABI_UCTX_IPV4). Queue lengths fit this test's vrdmad limits (512 WRs);
#     UCX's 8 MiB pools need the locked-memory limit raised, as UCX says. The bytes moved are
#     counted on vrdmad's engine (ucx_perftest checks no data).
ucx_case() {  # name, ucx_perftest test arguments
  local c s0 s1 tx
  # UCX 1.18 (Debian 13) is built with MPI: ucx_perftest calls MPI_Init first thing when its
  # stdin is not a terminal, and that fails fatally in this guest (no Open MPI runtime files);
  # so both run with a terminal, a fresh pty master, as stdin (1.13 has no MPI: no change).
  # UCX 1.18's new protocols pick the strong fence (ucp_put_bw fences before its last put),
  # whose flush(remote) needs a flush key only mlx5 devices have: on any other verbs device
  # (rxe, siw, ours) it fails "flush(remote) is not supported"; the weak fence (IBV_SEND_FENCE on
  # the one RC lane) is what 1.13 always used; 1.13 does not know the variable (and is told not
  # to warn about it).
  # The tool's status is the inner shell's $? (escaped for both shells). No single quote in c:
  # guest() wraps it in them.
  c="mkdir -p /dev/shm /dev/pts; mount -t tmpfs none /dev/shm 2>/dev/null; mount -t devpts devpts /dev/pts 2>/dev/null; chmod 1777 /dev/shm; touch /tmp/$1.s /tmp/$1.c; chmod 666 /tmp/$1.s /tmp/$1.c; ulimit -l unlimited;"
  c+=" su -s /bin/sh vrdma -c \"export UCX_NET_DEVICES=vrdma0:1 UCX_TLS=rc_verbs,ud_verbs,self UCX_FENCE_MODE=weak UCX_WARN_UNUSED_ENV_VARS=n UCX_RC_VERBS_RX_QUEUE_LEN=256 UCX_RC_VERBS_TX_QUEUE_LEN=256 UCX_UD_VERBS_RX_QUEUE_LEN=256 UCX_UD_VERBS_TX_QUEUE_LEN=128;"
  c+=" (timeout 60 ucx_perftest -p 13337 < /dev/ptmx > /tmp/$1.s 2>&1 &); sleep 2; timeout 60 ucx_perftest 127.0.0.1 -p 13337 $2 < /dev/ptmx > /tmp/$1.c 2>&1; echo UCX-rc=\\\$?; grep Final /tmp/$1.c; grep -i error /tmp/$1.c /tmp/$1.s; grep Fatal /tmp/$1.c /tmp/$1.s\"; killall ucx_perftest 2>/dev/null; true"
  s0=$(vstatus)
  guest 100 "$work/$1.out" "$c" || true
  s1=$(vstatus)
  sed 's/^/  guest: /' "$work/$1.out" | grep -v "===" | cut -c1-200
  tx=$(delta "$s0" "$s1" wire.tx_bytes)
  echo "  (vrdmad's engine sent $tx bytes)"
  check "ucx_perftest $2 (uid 1000, rc_verbs + ud_verbs on vrdma0, UCX's GID filter on) completes every iteration" \
    bash -c "grep -q '^UCX-rc=0' '$work/$1.out' && grep -qE 'Final: +200 ' '$work/$1.out' && ! grep -qE 'ERROR|Fatal' '$work/$1.out'"
  check "and the engine moved its bytes ($tx >= $3)" bash -c "[ $tx -ge $3 ]"
}
if [ -z "$PROVIDER" ]; then
  echo "SKIP 4j (UCX): no provider"
elif grep -q "^UCX-SKIP" "$work/make_guest.err"; then
  echo "SKIP 4j (UCX): $(sed -n 's/^UCX-SKIP: //p' "$work/make_guest.err")"
else
  t=$(date +%s)
  ucx_case ucx_put "-t ucp_put_bw -s 65536 -n 200" $((200 * 65536))
  ucx_case ucx_tag "-t tag_lat -s 64 -n 200" $((2 * 200 * 64))
  echo "  (UCX: $(($(date +%s) - t)) s)"
fi

# 5. Unload and load again with the address missing: the port waits for the netdev, the GID
#    comes when the address does; vrdmad serves throughout.
guest 60 "$work/reload.out" 'rmmod virtio_rdma; rmmod ib_uverbs; ls /sys/class/infiniband | grep vrdma; ip addr flush dev eth0; modprobe virtio_rdma; dmesg | tail -n 5 | grep -E "waits|registered"; cd /sys/class/infiniband/vrdma0 && '"$GIDS"'; echo ADDING; ip addr add '"$DEVIP"'/24 dev eth0; for i in $(seq 50); do grep -q ffff ports/1/gids/1 2>/dev/null && break; sleep 0.1; done; '"$GIDS"'; rdma link show' || true
sed 's/^/  guest: /' "$work/reload.out" | grep -v "===" | cut -c1-300
check "after unload and load the port waits for the address" has "$work/reload.out" "no netdev has the device's address $DEVIP yet"
check "no GID of $DEVIP before the address is added" bash -c "! sed -n '1,/^ADDING/p' '$work/reload.out' | grep -q '$WANT_GID'"
check "the GID of $DEVIP on eth0 once the address is added" bash -c "sed -n '/^ADDING/,\$p' '$work/reload.out' | grep -q '^gid [0-9]* $WANT_GID RoCE v2 eth0'"

# 6. The carrier moves to virtio_blk and back through sysfs (the unbind/bind path).
guest 60 "$work/move.out" "echo $CARRIER > /sys/bus/virtio/drivers/virtio_rdma/unbind; echo $CARRIER > /sys/bus/virtio/drivers/virtio_blk/bind; sleep 1; for d in /sys/block/vd*; do echo \"\$d size \$(cat \$d/size)\"; done; ls /sys/class/infiniband | grep vrdma; echo BACK; echo $CARRIER > /sys/bus/virtio/drivers/virtio_blk/unbind; echo $CARRIER > /sys/bus/virtio/drivers/virtio_rdma/bind; sleep 1; ls /sys/class/infiniband; rdma link show" || true
sed 's/^/  guest: /' "$work/move.out" | grep -v "===" | cut -c1-300
check "under virtio_blk the carrier is an empty disk and vrdma0 is gone" \
  bash -c "sed -n '1,/^BACK/p' '$work/move.out' | grep -q '/sys/block/vdb size 0' && ! sed -n '1,/^BACK/p' '$work/move.out' | grep -q '^vrdma'"
check "bound to virtio_rdma again: vrdma0 ACTIVE on eth0" \
  bash -c "sed -n '/^BACK/,\$p' '$work/move.out' | grep -q 'link vrdma0/1 state ACTIVE physical_state LINK_UP netdev eth0'"

# 6b. The driver goes away (unbind; a hot-unplug takes the same path) while a process holds a PD,
#     an MR, a CQ and 2 connected QPs with their rings mapped: ib_core disassociates the process
#     (its objects destroyed through the driver, its mappings zapped, IB_EVENT_DEVICE_FATAL)
#     instead of waiting for it to exit, so the unbind returns at once; the process lives on
#     without the device, and vrdma0 comes back on bind.
guest 30 "$work/held6.out" 'modprobe ib_uverbs; (uverbs_data /dev/infiniband/uverbs0 hold > /tmp/hold6.out 2>&1 &); for i in $(seq 100); do grep -q "^held\|failed" /tmp/hold6.out && break; sleep 0.1; done; cat /tmp/hold6.out' || true
held6=$(vwait objects.qp 2 10)
pid6=$(sed -n 's/^held pid=\([0-9]*\).*/\1/p' "$work/held6.out" | head -1)
guest 40 "$work/unbind6.out" "read s _ < /proc/uptime; echo $CARRIER > /sys/bus/virtio/drivers/virtio_rdma/unbind; read e _ < /proc/uptime; echo UNBOUND in \$((\${e%.*} - \${s%.*})) s; ls /sys/class/infiniband | grep vrdma; [ -d /proc/${pid6:-none} ] && echo holder still runs; kill -9 ${pid6:-none}; for i in \$(seq 50); do [ -d /proc/${pid6:-none} ] || break; sleep 0.1; done; [ -d /proc/${pid6:-none} ] || echo holder gone; echo $CARRIER > /sys/bus/virtio/drivers/virtio_rdma/bind; sleep 1; uverbs_probe /dev/infiniband/uverbs0 1 0; rdma link show" || true
after6=$(vwait objects.pd 0 10)
sed 's/^/  guest: /' "$work/held6.out" "$work/unbind6.out" | grep -v "===" | cut -c1-300
check "the driver was unbound while a process held a PD, an MR, a CQ and 2 QPs (objects $(jfield "$held6" objects)); the unbind returned at once, the process still running" \
  bash -c "grep -q '^held' '$work/held6.out' && [ '$(jfield "$held6" objects.qp)' = 2 ] && grep -qE '^UNBOUND in [0-4] s' '$work/unbind6.out' && grep -q '^holder still runs' '$work/unbind6.out'"
check "its objects were destroyed at the device when the driver went (vrdmad objects $(jfield "$after6" objects)); bound again, vrdma0 is ACTIVE and a new process gets a PD" \
  bash -c "[ '$(jfield "$after6" objects.pd)$(jfield "$after6" objects.mr)$(jfield "$after6" objects.cq)$(jfield "$after6" objects.qp)' = 0000 ] && grep -q '^pds freed=1' '$work/unbind6.out' && grep -q 'link vrdma0/1 state ACTIVE' '$work/unbind6.out'"

# 7. vrdmad saw every command and refused only that PD (its counters, before the restart below).
final=$(vstatus)
echo "vrdmad: $(echo "$final" | cut -c1-400)"
check "vrdmad has its frontend and counts $(jfield "$final" commands) commands, $(jfield "$final" command_errors) refused (the 6th PD)" \
  bash -c "[ '$(jfield "$final" connected)' = True ] && [ '$(jfield "$final" command_errors)' = 1 ] && [ '$(jfield "$final" commands)' -ge 20 ]"

# 8. The backend dies (SIGKILL) while a process holds 2 PDs and another a PD, an MR, a CQ and 2
#    connected QPs: the supervisor starts another, QEMU reconnects, the new backend says the
#    guest's objects died (DEVICE_FATAL, backend restarted). The driver tells ib_core's users
#    (IB_EVENT_DEVICE_FATAL) and registers vrdma0 again: the old registration's objects (and
#    their rings) are freed in the kernel without naming their handles again (the new backend's
#    handles start over), the processes' uverbs files are disassociated (their next call fails
#    with EIO), ib_mad makes its QP1 on the new backend, and RDMA-CM (ucmatose) and a new
#    process work again.
guest 30 "$work/hold.out" 'modprobe ib_uverbs; (uverbs_probe /dev/infiniband/uverbs0 2 /tmp/go2 > /tmp/fatal.out 2>&1 &); (uverbs_data /dev/infiniband/uverbs0 hold > /tmp/hold8.out 2>&1 &); for i in $(seq 100); do grep -q "^held\|failed" /tmp/hold8.out && break; sleep 0.1; done; cat /tmp/hold8.out' || true
killed=0 restarted=0
held2=$(vwait objects.pd 3 6)
pid8=$(sed -n 's/^held pid=\([0-9]*\).*/\1/p' "$work/hold.out" | head -1)
backend=$(awk '{print $1}' "/proc/$vrdmad_pid/task/$vrdmad_pid/children" 2>/dev/null || true)
[ -n "$held2" ] && [ -n "$backend" ] && kill -9 "$backend" && killed=1
sleep 0.5
[ -n "$(vwait migration.phase running 15)" ] && restarted=1
guest 40 "$work/fatal.out" 'for i in $(seq 150); do dmesg | grep -q "registered again\|could not be registered" && break; sleep 0.1; done; touch /tmp/go2; for i in $(seq 100); do grep -q "pds freed\|failed" /tmp/fatal.out && break; sleep 0.1; done; cat /tmp/fatal.out; kill -9 '"${pid8:-none}"'; for i in $(seq 50); do [ -d /proc/'"${pid8:-none}"' ] || break; sleep 0.1; done; [ -d /proc/'"${pid8:-none}"' ] || echo "held objects gone"; dmesg | grep "event: device fatal\|registered again\|could not be registered"; uverbs_probe /dev/infiniband/uverbs0 1 0; rdma link show; ip neigh; arp -i eth0 -s '"$PERFIP"' 02:00:0a:4d:09:01; cd /sys/class/infiniband/vrdma0 && '"$GIDS" || true
sed 's/^/  guest: /' "$work/fatal.out" | grep -v "===" | cut -c1-300
# ib_mad's QP1 (with its PD, DMA MR and CQ) died with the old backend; the new registration made
# them again on the new one.
KBASE='{"pd": 1, "mr": 1, "cq": 1, "qp": 1}'
after=$(vstatus)
check "the backend ($backend) was killed holding 3 PDs, an MR, a CQ and 2 QPs, and the supervisor's new one runs the guest" \
  test "$killed$restarted" = 11
check "the driver heard the device-fatal event and names the 4 lost PDs and 7 other objects (ib_mad's among them)" \
  has "$work/fatal.out" "event: device fatal (backend restarted): the device lost the guest's 4 PDs and 7 MRs, CQs, QPs, SRQs and AHs"
check "the driver registered vrdma0 again; the holders' uverbs files were disassociated (QUERY_PORT fails with EIO; destroys still answer), their objects freed (no handle named at the new backend: it refused nothing)" \
  bash -c "grep -q 'vrdma0 registered again after the device lost' '$work/fatal.out' && grep -q '^port1 after the hold: Input/output error' '$work/fatal.out' && grep -q '^pds freed=2' '$work/fatal.out' &&
    grep -q '^held objects gone' '$work/fatal.out' && [ '$(jfield "$after" command_errors)' = 0 ]"
check "a new process gets a PD from the new backend; vrdma0 ACTIVE; the new backend holds ib_mad's QP1, PD, MR and CQ again and no process's" \
  bash -c "grep -q '^pds freed=1' '$work/fatal.out' && grep -q 'link vrdma0/1 state ACTIVE' '$work/fatal.out' &&
    [ '$(jfield "$after" objects.pd)' = 0 ] && [ '$(jfield "$after" objects.qp)' = 0 ] && [ '$(jfield "$after" objects.cq)' = 0 ]"
check "the new backend holds a state area of the driver's (at least 1 MiB: $(jfield "$after" state_area_bytes) bytes), so the guest can still move" \
  bash -c "[ '$(jfield "$after" state_area_bytes)' -ge 1048576 ] 2>/dev/null"
echo "  new backend: $(jfield "$after" commands) commands, $(jfield "$after" command_errors) refused, $(jfield "$after" events) events"
# RDMA-CM over the new registration's QP1 (before, ib_mad's QP1 stayed dead until the module was
# reloaded): ucmatose in the guest as client against vrdma-perf on the host (the static neighbour
# of step 4e went with eth0's down in step 5: set again above).
[ -z "$PROVIDER" ] || ucmatose_case ucm_f client 50

# 9. No kernel warning in the whole run, and no refusal but the one asked for.
guest 30 "$work/dmesg.out" 'dmesg | grep -E "WARNING|BUG|Oops|refused|virtio_rdma.*(unbound|error)"' || true
sed 's/^/  guest: /' "$work/dmesg.out" | grep -v "===" | cut -c1-300
check "no kernel WARNING/BUG/Oops and no refusal but the one asked for in the guest's log" \
  bash -c "! grep -qE 'WARNING|BUG|Oops' '$work/dmesg.out' && [ \$(grep -c 'refused by the device (status' '$work/dmesg.out') -eq 1 ]"
sent=$(grep -o "unbound: [0-9]* control commands, [0-9]* refused" "$work/dmesg.out" | awk '{s += $2; r += $5} END {print s + 0, r + 0}')
echo "guest driver: $sent (control commands sent, refused) over the binds that ended"
check "vrdmad's log has that one refusal and no other" bash -c "[ \$(grep -c 'refused' '$work/vrdmad.log') -eq 1 ] && grep -q 'CREATE_PD refused' '$work/vrdmad.log'"

echo QUIT >&3
for _ in $(seq 100); do kill -0 "$qemu_pid" 2>/dev/null || break; sleep 0.1; done
echo "kmod test: $checks checks, $failed failed, $(echo "$(date +%s.%N) - $T0" | bc | cut -c1-5) s"
[ $failed -eq 0 ]
