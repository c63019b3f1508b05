# The host's side of a rig guest's serial console, shared by the VM rigs (vm_test.sh,
# kmod_test.sh, rxe/peer_rig.sh). Sourced; uses the caller's $work (serial.log, qemu.log) and
# $qemu_pid.

# Waits (bounded) for a line matching $1 in the serial log within $2 seconds; QEMU exiting or a
# kernel oops ends the wait (and says so).
wait_serial() {
  local pat=$1 secs=$2 i
  for ((i = 0; i < secs * 10; i++)); do
    grep -q -- "$pat" "$work/serial.log" 2>/dev/null && return 0
    kill -0 "$qemu_pid" 2>/dev/null || { echo "QEMU exited:"; cat "$work/qemu.log"; return 1; }
    if grep -qE "BUG: |Oops: |Kernel panic" "$work/serial.log" 2>/dev/null; then
      echo "the guest kernel oopsed:"; grep -A30 -E "BUG: |Oops: |Kernel panic" "$work/serial.log" | head -40; return 1
    fi
    sleep 0.1
  done
  return 1
}
