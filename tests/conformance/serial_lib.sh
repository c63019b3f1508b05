# The host's side of a rig guest, shared by the VM rigs (vm_test.sh, kmod_test.sh, vm_lib.sh,
# rxe/peer_rig.sh, the libvirt VM tests): building it, its serial console, ending it. Sourced;
# wait_serial uses the caller's $work (serial.log, qemu.log) and $qemu_pid.

# skip REASON: ends the test as skipped (ctest's 77) with the reason, unless the rig has its own.
declare -F skip >/dev/null || skip() { echo "SKIP: $*"; exit 77; }

# rig_require: skips the test through the caller's skip() unless it runs as root with network
# namespaces and QEMU ($QEMU, default qemu-system-x86_64) is installed.
rig_require() {
  [ "$(id -u)" -eq 0 ] && ip netns list >/dev/null 2>&1 || skip "needs root to create network namespaces"
  command -v "${QEMU:-qemu-system-x86_64}" >/dev/null || skip "${QEMU:-qemu-system-x86_64} is not installed (apt-get install qemu-system-x86)"
}

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

# rig_tools TOOL...: skips the test through skip() unless it runs as root with every TOOL installed.
rig_tools() {
  local t
  [ "$(id -u)" -eq 0 ] || skip "needs root"
  for t in "$@"; do
    command -v "$t" >/dev/null || skip "$t is not installed (scripts/setup.sh installs it)"
  done
}

# rig_start BUILDER [ARG...]: rig_require, then guest_build.
rig_start() {
  rig_require
  guest_build "$@"
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

# guest_run SECONDS OUTFILE COMMAND: COMMAND (one string, as the guest's sh -c reads it) under
# `timeout SECONDS` in the guest (guest_steps.sh's serve_steps on the console, fd 3); its output
# lands in OUTFILE, and the return status is the command's (124 when the step never ended).
step=0
guest_run() {
  local secs=$1 f=$2 rc
  step=$((step + 1))
  echo "STEP $step timeout $secs $3" >&3
  wait_serial "=== END $step rc=" $((secs + 15)) || { echo "(guest step $step timed out)" > "$f"; return 124; }
  tr -d '\r' < "$work/serial.log" | sed -n "/^=== BEGIN $step\$/,/^=== END $step rc=/p" > "$f"
  rc=$(sed -n "s/^=== END $step rc=\([0-9]*\).*/\1/p" "$f")
  return "${rc:-1}"
}

# stream_verdict CONSOLE PEER_LOG PEER_PID MIN: the end of a vrdma-stream run between a guest and
# a peer. Waits (bounded) for the guest's VRDMA-GUEST-DONE on its console log and for the peer,
# prints both results, and fails (the caller's fail()) unless both say ok, the stream reached MIN
# messages and each side received every one.
stream_verdict() {
  local console=$1 peer_log=$2 peer_pid=$3 min=$4 guest peer n
  for _ in $(seq 3000); do grep -q "VRDMA-GUEST-DONE" "$console" 2>/dev/null && break; sleep 0.1; done
  guest=$(tr -d '\r' < "$console" | grep "^VRDMA-STREAM {" | tail -1 || true)
  wait "$peer_pid" || true
  peer=$(tail -1 "$peer_log")
  echo "guest: ${guest#VRDMA-STREAM }"
  echo "peer:  $peer"
  echo "$guest" | grep -q '"ok":true' || fail "the guest's stream failed"
  echo "$peer" | grep -q '"ok":true' || fail "the peer's stream failed"
  n=$(echo "$peer" | sed -n 's/.*"messages":\([0-9]*\).*/\1/p')
  [ -n "$n" ] && [ "$n" -ge "$min" ] || fail "the stream ended at ${n:-?} messages, before the $min the guest had received"
  echo "$peer" | grep -q "\"received\":$n," || fail "the peer did not receive every message ($n)"
  echo "$guest" | grep -q "\"received\":$n," || fail "the guest did not receive every message ($n)"
}
