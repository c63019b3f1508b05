#!/usr/bin/env bash
# Paravirtual verbs inside a real QEMU 7.2 VM with no guest kernel module (docs/virtio-rdma.md
# "Inside a VM"): vrdmad (soft engine) serves the device over vhost-user to QEMU's own
# vhost-user-blk-pci, the carrier; in the guest (Debian kernel, busybox initramfs, TCG),
# pvverbs-bind takes the function from virtio_blk and gives it to uio_pci_generic, and
# vrdma-perf over pv:pci:auto (libpvverbs' virtio-pci transport, hugepage DMA memory) moves
# data to a vrdma-perf on the soft engine at another address of the namespace, data checked
# (--verify) on both sides. Then the backend (vrdmad --supervise) is SIGKILLed under a running
# vrdma-perf: QEMU reconnects to its successor, the application fails at once with the reason
# (DEVICE_FATAL, backend restarted), and a new one runs on the new backend. Every guest command
# runs under `timeout`.
#   vm_test.sh VRDMA_PERF VRDMAD PVVERBS_BIND VRDMA_STREAM     exits 77 (skip) without root, QEMU or the guest
#   KEEP_WORK=1 keeps the logs.
set -euo pipefail
PERF=$(readlink -f "$1"); VRDMAD=$(readlink -f "$2"); BIND=$(readlink -f "$3"); STREAM=$(readlink -f "$4")
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../serial_lib.sh"  # skip, rig_start, wait_serial, guest_run, vm_rig_cleanup
rig_start "$HERE/make_guest.sh" "$PERF" "$BIND" "$STREAM"

T0=$(date +%s.%N)
NS=vm7$$
BRIDGE=10.77.7.1 GUEST=10.77.7.2 PEER=10.77.7.3 DEVIP=10.77.7.12
work=$(mktemp -d)
qemu_pid="" cat_pid="" vrdmad_pid=""
trap vm_rig_cleanup EXIT

# One "host": a bridge holding the tap of the guest's virtio-net (TCP for vrdma-perf's
# exchange), the guest device's RDMA address (vrdmad's soft engine) and the peer's address.
ip netns add "$NS"
ip -n "$NS" link set lo up
ip -n "$NS" link add br0 type bridge
ip -n "$NS" addr add $BRIDGE/24 dev br0
ip -n "$NS" addr add $PEER/24 dev br0
ip -n "$NS" addr add $DEVIP/24 dev br0
ip -n "$NS" tuntap add tap0 mode tap
ip -n "$NS" link set tap0 master br0 up
ip -n "$NS" link set br0 up

ip netns exec "$NS" "$VRDMAD" --socket "$work/vrdma.sock" --engine soft:$DEVIP --control "$work/vrdma.ctl" --supervise \
  >"$work/vrdmad.log" 2>&1 &
vrdmad_pid=$!
for _ in $(seq 100); do [ -S "$work/vrdma.sock" ] && break; sleep 0.05; done
[ -S "$work/vrdma.sock" ] || { echo "FAIL: vrdmad did not start"; cat "$work/vrdmad.log"; exit 1; }

mkfifo "$work/con.in" "$work/con.out"
cat "$work/con.out" > "$work/serial.log" &
cat_pid=$!
# A real virtio-blk disk beside the carrier (1 MiB, 2048 sectors): pvverbs-bind must leave it alone
# without touching its config space.
truncate -s 1M "$work/disk.raw"
ip netns exec "$NS" qemu-system-x86_64 -accel tcg -cpu max -m 1G -smp 1,maxcpus=2 -display none -monitor none -no-reboot \
  -object memory-backend-memfd,id=mem,size=1G,share=on -numa node,memdev=mem \
  -kernel "$KERNEL" -initrd "$INITRD" -append "console=ttyS0 quiet panic=-1" \
  -chardev pipe,id=con,path="$work/con" -serial chardev:con \
  -chardev socket,id=vr,path="$work/vrdma.sock",reconnect=1 -device vhost-user-blk-pci,chardev=vr,num-queues=4,queue-size=256 \
  -netdev tap,id=n0,ifname=tap0,script=no,downscript=no -device virtio-net-pci,netdev=n0,mac=52:54:00:77:07:02 \
  -drive file="$work/disk.raw",format=raw,if=none,id=disk0 -device virtio-blk-pci,drive=disk0 \
  >"$work/qemu.log" 2>&1 &
qemu_pid=$!
exec 3>"$work/con.in"

failed=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
wait_serial "VRDMA-GUEST-READY" 120 || { echo "FAIL: the guest did not come up"; tail -30 "$work/serial.log"; cat "$work/qemu.log"; exit 1; }
boot=$(echo "$(date +%s.%N) - $T0" | bc)
echo "guest ready after ${boot} s wall: $(grep -a "VRDMA-GUEST-READY" "$work/serial.log" | tr -d '\r')"

# guest SECONDS OUTFILE COMMAND...: the words as the guest's command line (guest_run).
guest() { guest_run "$1" "$2" "${*:3}"; }

# 1. The carrier function: virtio_blk took it at boot (an empty disk); pvverbs-bind finds it by
#    its signature, moves it to uio_pci_generic and prints its address.
#    A real disk beside it is named as skipped, unread, and keeps its driver.
disks='for d in /sys/block/vd*; do echo "disk ${d##*/} $(cat $d/size)"; done'
guest 30 "$work/list.out" "pvverbs-bind --list; $disks" || true
cat "$work/list.out"
grep -q " carrier driver=virtio-pci virtio=virtio_blk" "$work/list.out" ||
  fail "pvverbs-bind --list does not show the carrier function under virtio-pci with virtio_blk on top"
grep -q "^disk vd[a-z]* 0$" "$work/list.out" || fail "virtio_blk made no disk of the carrier (the guest kernel did not take it as a blk device)"
grep -qE "skipped: the virtio_blk disk vd[a-z]+ \(2048 sectors\), not the carrier" "$work/list.out" ||
  fail "pvverbs-bind --list does not name the real 2048-sector disk as skipped"
guest 30 "$work/bind.out" pvverbs-bind || fail "pvverbs-bind failed: $(cat "$work/bind.out")"
ADDR=$(grep -oE '^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$' "$work/bind.out" | head -1 || true)
[ -n "$ADDR" ] || fail "pvverbs-bind printed no PCI address"
guest 10 "$work/drv.out" "readlink /sys/bus/pci/devices/$ADDR/driver; cat /sys/bus/pci/devices/$ADDR/driver_override; $disks" || true
grep -q "uio_pci_generic$" "$work/drv.out" || fail "$ADDR is not bound to uio_pci_generic: $(cat "$work/drv.out")"
grep -q "^disk vd[a-z]* 0$" "$work/drv.out" && fail "virtio_blk still has a disk on the carrier after pvverbs-bind: $(cat "$work/drv.out")"
grep -q "^disk vd[a-z]* 2048$" "$work/drv.out" || fail "the real disk is gone after pvverbs-bind: $(cat "$work/drv.out")"
[ "$(grep -cE '^[0-9a-f]{4}:' "$work/bind.out")" = 1 ] || fail "pvverbs-bind bound more than the carrier: $(cat "$work/bind.out")"
echo "bound $ADDR: $(grep -v '===' "$work/drv.out" | tr '\n' ' ')"

# 2. vrdma-perf over pv in the guest against vrdma-perf on the soft engine at $PEER; the peer
#    serves, the guest connects; --verify compares CRC-32s of the moved bytes on both sides.
run_case() {  # name, guest-secs, vrdma-perf args
  local name=$1 secs=$2 args=$3 port=$((18600 + step)) hp ok=0
  # shellcheck disable=SC2086
  timeout $((secs + 20)) ip netns exec "$NS" "$PERF" -d soft:$PEER -p $port $args --verify --json \
    >"$work/$name.host" 2>&1 &
  hp=$!
  sleep 0.3
  if ! guest "$secs" "$work/$name.guest" vrdma-perf -d "pv:pci:$ADDR?ram_mib=64" -c $PEER -p $port $args --verify --json; then
    ok=1
  fi
  wait $hp || ok=1
  local line
  line=$(grep -o '{.*}' "$work/$name.guest" | tail -1 || true)
  if [ $ok -eq 0 ] && echo "$line" | grep -q '"verified":true' && echo "$line" | grep -q '"device":"pv:pci:'; then
    echo "ok   $name: $line"
  else
    fail "$name"; echo "--- guest:"; cat "$work/$name.guest"; echo "--- host:"; cat "$work/$name.host"
  fi
}
run_case write_bw_64k 90 "-t write_bw -s 65536 -n 400 -q 16"
run_case send_bw_4k 60 "-t send_bw -s 4096 -n 400 -q 16"
run_case read_bw_64k 60 "-t read_bw -s 65536 -n 200 -q 8"
run_case send_lat_64 60 "-t send_lat -s 64 -n 300"

# 3. vrdmad saw a guest through the carrier: QEMU's frontend, our commands and doorbells.
vstatus() {
  timeout 5 python3 -c 'import socket,sys
s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b"{\"cmd\":\"status\"}\n")
print(s.makefile().readline().strip())' "$work/vrdma.ctl" 2>/dev/null || true
}
stats=$(vstatus)
echo "vrdmad: $stats" | cut -c1-400
if [ -n "$stats" ]; then echo "$stats" | grep -q '"connected":true' || fail "vrdmad reports no frontend"; fi

# 4. The backend dies while the guest's application holds objects and moves data: the
#    supervisor starts it again, QEMU reconnects, and the restarted backend, with no device state
#    in guest memory, tells the driver (DEVICE_FATAL): the application fails with the reason at
#    once instead of waiting for completions that cannot come. A new application then gets a
#    working device from the new backend.
port=$((18700 + step))
timeout 150 ip netns exec "$NS" "$PERF" -d soft:$PEER -p $port -t send_bw -s 4096 -n 2000000 -q 16 \
  >"$work/restart.host" 2>&1 &
hp=$!
sleep 0.3
(
  # The moment the guest's QP exists (bounded: 60 s), the backend dies with SIGKILL.
  for _ in $(seq 600); do
    vstatus | grep -q '"qp":[1-9]' && break
    sleep 0.1
  done
  sleep 2
  backend=$(awk '{print $1}' "/proc/$vrdmad_pid/task/$vrdmad_pid/children" 2>/dev/null || true)
  [ -n "$backend" ] && kill -9 "$backend" && echo "$(date +%s.%N) $backend" >"$work/killed"
) &
killer=$!
rc=0
guest 90 "$work/restart.guest" vrdma-perf -d "pv:pci:$ADDR?ram_mib=64" -c $PEER -p $port -t send_bw -s 4096 \
  -n 2000000 -q 16 || rc=$?
t_end=$(date +%s.%N)
wait $killer 2>/dev/null || true
kill $hp 2>/dev/null || true
wait $hp 2>/dev/null || true
if [ -f "$work/killed" ]; then
  read -r t_kill pid_killed <"$work/killed"
  echo "restart: backend $pid_killed killed; the guest's vrdma-perf ended with rc=$rc" \
    "$(echo "$t_end - $t_kill" | bc) s later (its step's end seen on the serial console)"
fi
grep -i "backend restarted\|error" "$work/restart.guest" | head -3
if [ ! -f "$work/killed" ]; then
  fail "restart: the guest's QP never showed in vrdmad's status, so the backend was not killed"
elif [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
  fail "restart: the guest's vrdma-perf did not fail at once after its backend died (rc=$rc)"
  cat "$work/restart.guest"
elif ! grep -q "backend restarted" "$work/restart.guest"; then
  fail "restart: the guest's vrdma-perf failed without naming the restarted backend"
  cat "$work/restart.guest"
fi
grep -q "starting it again" "$work/vrdmad.log" || fail "restart: the supervisor did not say it started the backend again"
grep -q "replaces one that died" "$work/vrdmad.log" || fail "restart: the new backend did not say the guest's objects died"
run_case send_lat_after_restart 60 "-t send_lat -s 64 -n 300"

echo QUIT >&3
for _ in $(seq 100); do kill -0 "$qemu_pid" 2>/dev/null || break; sleep 0.1; done
echo "vm conformance: $failed failed, $(echo "$(date +%s.%N) - $T0" | bc) s"
[ $failed -eq 0 ]
