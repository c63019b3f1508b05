# The reference-peer rig shared by rxe_test.sh and verbs_guest_test.sh (sourced, not run): a
# network namespace with a bridge and a tap, the make_guest.sh guest under QEMU (TCG) on it, and
# the serial-console protocol of guest_init.sh ("STEP <n> <command>" in, "=== BEGIN/END <n>" out).
#
# The TCG guest's virtio-net transmit queue sometimes stops for good in the middle of a bulk run
# (about 1 run in 40-100 of ib_send_bw at 64 KiB; the guest logs "NETDEV WATCHDOG: ... transmit
# queue 0 timed out", once its ring is full, and QEMU writes nothing more to the tap). Nothing on
# the wire is wrong at that point: the guest's NIC is. A case that fails with that in the guest's
# log, or after which the guest answers no ping (the watchdog can take minutes), is run once more
# on a freshly booted guest (at most RIG_REBOOTS times per run), and the rig says so; QEMU's own
# view of the queues is printed first (QMP "info virtio-queue-status") for whoever digs further.
#
# The sourcing script sets NS, HOST, GUEST_MAC, KERNEL, GUEST_INITRD and work (GUEST_MEM_MB: the
# guest's memory, 1024 MiB unless set), defines
# after_boot (run after every boot, e.g. to set the guest's address), optionally before_reboot
# (run on the stalled guest before it goes), and calls rig_net, then guest_boot.

qemu_pid="" cat_pid="" boots=0
RIG_REBOOTS=${RIG_REBOOTS:-2}
RIG_RETRY=0 RIG_IN_RETRY=0

rig_net() {  # the namespace: bridge br0 with $HOST, tap0 on it for QEMU
  ip netns add "$NS"
  ip -n "$NS" link set lo up
  ip -n "$NS" link add br0 mtu 9000 type bridge
  ip -n "$NS" addr add "$HOST/24" dev br0
  ip -n "$NS" tuntap add tap0 mode tap
  ip -n "$NS" link set tap0 mtu 9000 master br0 up
  ip -n "$NS" link set br0 up
}

rig_cleanup() {
  guest_stop
  ip netns pids "$NS" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
}

guest_stop() {
  exec 3>&- 2>/dev/null || true
  if [ -n "$qemu_pid" ]; then
    kill "$qemu_pid" 2>/dev/null || true
    wait "$qemu_pid" 2>/dev/null || true
  fi
  if [ -n "$cat_pid" ]; then
    kill "$cat_pid" 2>/dev/null || true
    wait "$cat_pid" 2>/dev/null || true
  fi
  qemu_pid="" cat_pid=""
}

# Boots the guest (stopping a running one first; its serial log is kept as serial.<boot>.log)
# and waits for guest_init.sh's ready line, then runs after_boot.
guest_boot() {
  guest_stop
  boots=$((boots + 1))
  [ -f "$work/serial.log" ] && mv "$work/serial.log" "$work/serial.$((boots - 1)).log"
  rm -f "$work/con.in" "$work/con.out" "$work/qmp.sock"
  mkfifo "$work/con.in" "$work/con.out"
  cat "$work/con.out" > "$work/serial.log" &
  cat_pid=$!
  ip netns exec "$NS" qemu-system-x86_64 -accel tcg -cpu max -m ${GUEST_MEM_MB:-1024} -smp 1 -display none -monitor none \
    -qmp unix:"$work/qmp.sock",server=on,wait=off \
    -no-reboot -kernel "$KERNEL" -initrd "$GUEST_INITRD" -append "console=ttyS0 quiet panic=-1 no_timer_check" \
    -chardev pipe,id=con,path="$work/con" -serial chardev:con \
    -netdev tap,id=n0,ifname=tap0,script=no,downscript=no -device virtio-net-pci,netdev=n0,mac="$GUEST_MAC" \
    >"$work/qemu.log" 2>&1 &
  qemu_pid=$!
  exec 3>"$work/con.in"
  wait_serial "VRDMA-GUEST-READY" 180 || { echo "FAIL: the guest did not come up (boot $boots)"; tail -30 "$work/serial.log"; return 1; }
  after_boot
}

. "$(dirname "${BASH_SOURCE[0]}")/../serial_lib.sh"  # wait_serial

step=0
guest_start() { step=$((step + 1)); echo "STEP $step $*" >&3; }
guest_wait() {  # prints the step's output into $1; returns its exit status
  wait_serial "=== END $step rc=" "${2:-150}" || { echo "(guest step $step timed out)" > "$1"; return 124; }
  tr -d '\r' < "$work/serial.log" | sed -n "/^=== BEGIN $step\$/,/^=== END $step rc=/p" > "$1"
  local rc
  rc=$(sed -n "s/^=== END $step rc=\([0-9]*\).*/\1/p" "$1")
  return "${rc:-1}"
}
guest_run() {  # output file, seconds, command: runs it and waits
  local f=$1 secs=$2; shift 2
  guest_start "$*"
  guest_wait "$f" $((secs + 30))
}

wait_listen() {  # TCP port 18515 listening in the namespace (a host-side server)
  local i
  for ((i = 0; i < 50; i++)); do
    ip netns exec "$NS" ss -ltn 2>/dev/null | grep -q ":18515 " && return 0
    sleep 0.1
  done
  return 1
}

# A human monitor command through QEMU's QMP socket.
qemu_hmp() {
  python3 - "$work/qmp.sock" "$1" <<'PY' 2>&1 || true
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(sys.argv[1])
f = s.makefile("rw")
f.readline()
f.write(json.dumps({"execute": "qmp_capabilities"}) + "\n"); f.flush(); f.readline()
f.write(json.dumps({"execute": "human-monitor-command", "arguments": {"command-line": sys.argv[2]}}) + "\n"); f.flush()
while True:
    r = json.loads(f.readline())
    if "return" in r or "error" in r:
        print(r.get("return", r))
        break
PY
}

# The guest's NIC stalled: its kernel said so, or (the watchdog speaks only once the transmit
# ring is full, which a few failed connections take minutes to fill) it answers no ping.
guest_tx_stalled() {
  grep -qE "NETDEV WATCHDOG|TX timeout on queue" "$work/serial.log" 2>/dev/null && return 0
  local i
  for i in 1 2 3; do ip netns exec "$NS" ping -c 1 -W 2 -q "$GUEST" >/dev/null 2>&1 && return 1; done
  STALL_HOW="the guest answers no ping from $HOST"
  return 0
}

# Called by a script's record() for a failed case: true (and RIG_RETRY=1) when the guest's NIC
# stalled and a reboot is left in the budget; the case is then not counted but run again.
rig_should_retry() {
  local name=$1
  [ "$RIG_REBOOTS" -gt 0 ] && [ "$RIG_IN_RETRY" -eq 0 ] || return 1
  STALL_HOW=""
  guest_tx_stalled || return 1
  RIG_REBOOTS=$((RIG_REBOOTS - 1))
  [ -n "$STALL_HOW" ] || STALL_HOW="its log: $(grep -m1 -oE "NETDEV WATCHDOG.*" "$work/serial.log" | tr -d '\r')"
  echo "RETRY $name: the guest's virtio-net transmit queue stalled ($STALL_HOW); QEMU's view of the queues:"
  local q
  for q in 0 1; do
    qemu_hmp "info virtio-queue-status /machine/peripheral-anon/device[0]/virtio-backend $q" |
      grep -E "queue_index|inuse|used_idx|signalled|avail_idx" | tr -s ' ' | tr '\n' ' ' || true
    echo
  done
  # The transmit queue's rings as the guest wrote them (avail idx and flags, used idx and flags).
  qemu_hmp "info virtio-queue-element /machine/peripheral-anon/device[0]/virtio-backend 1" |
    grep -A3 -E "^ *(avail|used):" | tr -s ' ' | tr '\n' ' ' || true
  echo
  echo "    rebooting the guest and running $name again ($RIG_REBOOTS reboot(s) left)"
  RIG_RETRY=1
  return 0
}

# Runs a case function; when its record() asked for a retry, reboots the guest and runs it again.
run_case() {
  RIG_RETRY=0
  "$@"
  if [ "$RIG_RETRY" -eq 1 ]; then
    RIG_RETRY=0
    if declare -F before_reboot >/dev/null; then before_reboot || true; fi
    guest_boot || { echo "FAIL: the guest did not come back for a second run of $*"; exit 1; }
    RIG_IN_RETRY=1
    "$@"
    RIG_IN_RETRY=0
  fi
}
