# Sourced by the libvirt VM migration tests (two_hosts.sh rigs): the guest memory check after a
# move (docs/migration.md "Guest memory after a move"). libvirt ends the source QEMU as soon as a
# move completes, so the source's RAM (its memory-backend-memfd) is held open before the move;
# the move leaves the domain paused on the destination (virsh migrate --suspend, vrdmactl migrate
# --suspend), vrdma-memcmp compares both, and the domain is resumed.
#   mem_hold SRC_HOST_DIR DOMAIN PIDFILE   before the move: hold the source's RAM; PIDFILE is
#                                          the source backend's (the hook's SOCKET.pid)
#   mem_check DST_HOST_DIR DOMAIN LABEL    after it: compare, print, resume; returns 0 when the
#                                          memory is the same, 3 when pages differ but none was
#                                          written by the backend and it wrote nothing after the
#                                          stop (QEMU lost them), 1 otherwise
# libvirt has ended the source by then, so a move cannot be made again from it: a test that
# gets 3 runs its whole scenario again, once (MEMCHECK_RERUN_STATUS, below).
# Needs MEMCMP (vrdma-memcmp) and W (the test's folder; backends write their journals there as
# journal-PID.bin: the hook's environment sets VRDMA_WRITE_JOURNAL=$W/journal-%p.bin).
MEM_FD="" MEM_SRC="" MEM_JOURNALS=()
MEMCHECK_RERUN_STATUS=75  # what a scenario exits with when QEMU lost guest memory in a move

mem_hold() {
  local pid f sup p
  pid=$(cat "$1/run/libvirt/qemu/$2.pid" 2>/dev/null) || { echo "mem_hold: no QEMU pid for $2 in $1" >&2; return 1; }
  MEM_SRC=""
  for f in /proc/"$pid"/fd/*; do
    case "$(readlink "$f" 2>/dev/null)" in
      /memfd:memory-backend-memfd*) exec {MEM_FD}<"$f"; MEM_SRC=/proc/$BASHPID/fd/$MEM_FD; break ;;
    esac
  done
  [ -n "$MEM_SRC" ] || { echo "mem_hold: QEMU $pid holds no memory-backend-memfd (is the domain's memory memfd?)" >&2; return 1; }
  # The source backend, and under --supervise the process serving (its child), wrote the journals.
  MEM_JOURNALS=()
  sup=$(cat "$3" 2>/dev/null) || return 0
  for p in "$sup" $(pgrep -P "$sup" 2>/dev/null); do
    [ -f "$W/journal-$p.bin" ] && MEM_JOURNALS+=(--journal "$W/journal-$p.bin")
  done
  return 0
}

mem_check() {
  local dpid rc=0 vs
  dpid=$(cat "$1/run/libvirt/qemu/$2.pid" 2>/dev/null) || { echo "mem_check: no QEMU pid for $2 in $1" >&2; return 1; }
  if [ -n "${LV_MEMCHECK_LOSE_ONCE:-}" ] && [ ! -e "$W/.lost-once" ]; then
    # Rehearses the rerun: the destination "loses" 8 bytes at 200 MiB before the comparison.
    touch "$W/.lost-once"
    local f
    f=$(ls -l /proc/"$dpid"/fd | sed -n 's/.* \([0-9]*\) -> \/memfd:memory-backend-memfd.*/\1/p')
    printf LOSTPAGE | dd of=/proc/"$dpid"/fd/"$f" bs=1 seek=$((200 << 20)) conv=notrunc status=none
  fi
  rm -f "$W/memcmp.json"
  "$MEMCMP" "$MEM_SRC" "pid:$dpid" "${MEM_JOURNALS[@]}" --report "$W/memcmp.json" > "$W/memcmp.txt" 2>&1 || rc=$?
  exec {MEM_FD}<&-
  sed "s/^/  $3: /" "$W/memcmp.txt"
  virsh -q -c "qemu+unix:///system?socket=$1/run/libvirt/libvirt-sock" resume "$2" >/dev/null ||
    { echo "mem_check: virsh resume $2 failed" >&2; return 1; }
  [ $rc -le 1 ] || { echo "mem_check: the comparison could not run (status $rc)" >&2; return 1; }
  [ $rc -eq 1 ] || return 0
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r["backend_pages"] == 0 and r["journal_after_stop"] == 0 else 1)' \
    "$W/memcmp.json" && return 3
  return 1
}

# mem_check_or_rerun DST_HOST_DIR DOMAIN LABEL: mem_check; a failure fails the test (fail), QEMU's
# loss ends the scenario with MEMCHECK_RERUN_STATUS.
mem_check_or_rerun() {
  local rc=0
  mem_check "$@" || rc=$?
  [ $rc -ne 3 ] || { echo "QEMU lost guest memory in the move $3, none of it written by the backend" >&2; exit $MEMCHECK_RERUN_STATUS; }
  [ $rc -eq 0 ] || fail "after the move $3 the guest memory at the destination differs from the source's (above)"
}

# virsh_move_a_to_b DOMAIN SOCK_PID_FILE: moves DOMAIN from host a to host b ($A, $B, LV_*) with
# plain `virsh migrate --live --p2p --suspend --bandwidth 32` (QEMU 7.2 loses TCG guest memory
# now and then without a limit: docs/integration.md "QEMU 7.2 TCG and unlimited bandwidth"), the
# source's guest memory held (mem_hold, SOCK_PID_FILE naming its backend) and compared with the
# paused destination's (mem_check_or_rerun), which then runs. Sets t1 (ns) when virsh returned.
virsh_move_a_to_b() {
  mem_hold "$LV_A_DIR" "$1" "$2" || fail "cannot hold the source's guest memory"
  $A migrate --live --p2p --suspend --bandwidth 32 "$1" "$LV_B_TCP" --migrateuri "tcp://$LV_B_IP" || fail "virsh migrate a -> b failed"
  t1=$(date +%s%N)
  [ "$($B domstate "$1" 2>/dev/null)" = paused ] || fail "the guest is not paused on host b after virsh migrate --suspend"
  mem_check_or_rerun "$LV_B_DIR" "$1" "a -> b"
  [ "$($B domstate "$1" 2>/dev/null)" = running ] || fail "the guest does not run on host b after virsh migrate"
}

# vrdmactl_move_b_to_a DOMAIN SOURCE_PIDFILE: the same move back with `vrdmactl migrate --suspend`
# (its last lines printed, prefixed "vrdmactl:"), which must say the domain is paused on a.
vrdmactl_move_b_to_a() {
  local out rc=0
  mem_hold "$LV_B_DIR" "$1" "$2" || fail "cannot hold the source's guest memory"
  out=$("$VRDMACTL" migrate "$1" "$LV_A_TCP" --connect "$LV_B_URI" --migrateuri "tcp://$LV_A_IP" --timeout 240 \
    --bandwidth 32 --suspend 2>&1) || rc=$?
  echo "$out" | sed 's/^/  vrdmactl: /' | tail -4
  [ $rc = 0 ] || fail "vrdmactl migrate b -> a failed (status $rc)"
  echo "$out" | grep -q "is now paused on" || fail "vrdmactl migrate --suspend did not say the domain is paused"
  [ "$($A domstate "$1" 2>/dev/null)" = paused ] || fail "the guest is not paused on host a after vrdmactl migrate --suspend"
  mem_check_or_rerun "$LV_A_DIR" "$1" "b -> a"
  [ "$($A domstate "$1" 2>/dev/null)" = running ] || fail "the guest does not run on host a after vrdmactl migrate"
}

# memcheck_scenario CMD...: runs the scenario; when it ended because QEMU lost guest memory, runs
# it again (fresh hosts, fresh guest), up to MEMCHECK_RUNS times in all (default 3: QEMU 7.2 lost
# pages in two runs in a row of one CI rehearsal, 2026-12-07), and says so. An earlier run's logs
# go to $W/runN (the next must not find them).
memcheck_scenario() {
  local rc=0 f run=1 runs=${MEMCHECK_RUNS:-3}
  "$@" || rc=$?
  while [ $rc -eq $MEMCHECK_RERUN_STATUS ] && [ $run -lt "$runs" ]; do
    echo "QEMU lost guest memory in a move (none of it the backend's: docs/migration.md \"Guest memory after a move\"); the scenario runs once more"
    mkdir -p "$W/run$run"
    for f in "$W"/*; do case $f in */hook|*/run[0-9]*|*.xml) ;; *) mv "$f" "$W/run$run/" ;; esac; done
    run=$((run + 1))
    rc=0
    "$@" || rc=$?
  done
  [ $rc -ne $MEMCHECK_RERUN_STATUS ] || { echo "FAIL: QEMU lost guest memory in each of $run runs"; rc=1; }
  return $rc
}
