#!/usr/bin/env bash
# One run of the migration memory study (memcheck_study.sh): a guest boots on host A and QEMU's
# own migrate moves it A -> B -> A -> ... MOVES times; after each move both QEMUs are paused and
# their RAM compared page by page (vrdma-memcmp, each differing page told apart as vrdmad's or
# QEMU's by vrdmad's write journal), then the guest must go on making checked progress.
#   memcheck_run.sh VRDMA_PERF VRDMAD PVVERBS_BIND VRDMA_STREAM VRDMA_MEMCMP
# Environment: QEMU, DEVICE (vrdma | virtio-blk), BANDWIDTH (vm_lib.sh); MOVES (default 10);
# MEMCHECK_LOG (required): one JSON line per move, and one for a guest that died or stalled.
# Exits 0 when every move was made, 4 when the guest died or stalled after a move (recorded),
# 77 without root, QEMU or the guest. KEEP_WORK=1 keeps the logs.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
[ -n "${MEMCHECK_LOG:-}" ] || { echo "memcheck_run.sh: set MEMCHECK_LOG" >&2; exit 2; }
MOVES=${MOVES:-10}
MSGS=100000000
MEMCHECK=record
if [ "${DEVICE:-vrdma}" = vrdma ]; then GUEST_ARGS="vrdma.stream=$MSGS"; STEP=300; else GUEST_ARGS="vrdma.blkload=8"; STEP=2; fi
. "$HERE/vm_lib.sh"
vm_rig "$@"
vm_fabric

gave_up() {  # gave_up MOVE NAME WHY: the guest did not go on after move MOVE (its QEMU is NAME)
  local console vs rip c0 c1
  console=$(tr -d '\r' < "$work/serial-$2.log" | grep -E -m3 "Kernel panic|BUG:|Oops|general protection|stack guard|corruption|\"error\"" |
            tr '"\\' "''" | tr '\n' ' ' || true)
  # Does the guest run (and where: a user or a kernel address), and does its device still move work?
  vs=$(hmp "$2" "info status" 2>/dev/null | tr -d '\r' | sed -n 's/^VM status: //p')
  rip=$(hmp "$2" "info registers" 2>/dev/null | tr -d '\r' | sed -n 's/.*\(RIP=[0-9a-f]*\).*/\1/p' | head -1)
  c0=$(ctl "$2" | sed -n 's/.*"cqes":\([0-9]*\).*/\1/p'); sleep 2; c1=$(ctl "$2" | sed -n 's/.*"cqes":\([0-9]*\).*/\1/p')
  printf '{"qemu":"%s","device":"%s","bandwidth":%s,"after_move":%s,"guest_failed":"%s","console":"%s","vm":"%s","rip":"%s","cqes":"%s -> %s in 2 s"}\n' \
    "$("$QEMU" --version | head -1 | sed 's/.*version \([0-9.]*\).*/\1/')" "$DEVICE" "$BANDWIDTH" "$1" "$3" "$console" \
    "$vs" "$rip" "$c0" "$c1" >> "$MEMCHECK_LOG"
  echo "the guest did not go on after move $1 ($3)"
  for f in "$work"/serial-"$2".log "$work"/vrdmad-"$2".log; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done
  exit 4
}

[ "$DEVICE" != vrdma ] || { ip netns exec $P timeout 1500 "$STREAM" -d soft:$PEER -n "$MSGS" --limit 1400 >"$work/peer.log" 2>&1 & pids+=($!); }
vrdmad A h0
qemu A h0
wait_progress "$STEP" 240 || gave_up 0 h0 "no progress after boot"
for ((m = 1; m <= MOVES; m++)); do
  if ((m % 2)); then from=A to=B ip=$MB; else from=B to=A ip=$MA; fi
  migrate "$from" "h$((m - 1))" "$to" "h$m" "$ip"
  p=$(progress)
  wait_progress $((p + STEP)) 120 || gave_up "$m" "h$m" "no progress within 120 s (at $(progress))"
done
echo "memcheck run: $MOVES moves made"
