# The host's side of a rig guest, shared by the VM rigs (vm_test.sh, kmod_test.sh, vm_lib.sh,
# rxe/peer_rig.sh, the libvirt VM tests): building it, its serial console, ending it. Sourced;
# wait_serial uses the caller's $work (serial.log, qemu.log) and $qemu_pid.

# guest_build BUILDER [ARG...]: runs a guest builder (a make_guest.sh) and sets KERNEL and INITRD
# from its answer. A part that cannot be had (status 3) skips the test through the caller's
# skip(); any other failure ends the test with the builder's output.
guest_build() {
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  if [ $rc -eq 3 ]; then skip "guest unavailable: $out"; elif [ $rc -ne 0 ]; then echo "$out"; exit 1; fi
  KERNEL=$(echo "$out" | sed -n 's/.*KERNEL=\([^ ]*\).*/\1/p')
  INITRD=$(echo "$out" | sed -n 's/.*INITRD=\([^ ]*\).*/\1/p')
}

# vm_rig_cleanup: the exit trap of a one-VM rig: closes the console (fd 3), ends $qemu_pid,
# $cat_pid, $vrdmad_pid and every process in namespace $NS, deletes $NS, and removes $work
# unless KEEP_WORK is set.
vm_rig_cleanup() {
  exec 3>&- 2>/dev/null || true
  for p in $qemu_pid $cat_pid $vrdmad_pid; do kill "$p" 2>/dev/null || true; done
  ip netns pids "$NS" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
  if [ -n "${KEEP_WORK:-}" ]; then echo "work dir kept: $work"; else rm -rf "$work"; fi
}

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
