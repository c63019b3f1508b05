# Sourced by the libvirt VM migration tests (two_hosts.sh rigs): the guest memory check after a
# move (docs/migration.md "Guest memory after a move"). libvirt ends the source QEMU as soon as a
# move completes, so the source's RAM (its memory-backend-memfd) is held open before the move;
# the move leaves the domain paused on the destination (virsh migrate --suspend, vrdmactl migrate
# --suspend), vrdma-memcmp compares both, and the domain is resumed.
#   mem_hold SRC_HOST_DIR DOMAIN PIDFILE   before the move: hold the source's RAM; PIDFILE is
#                                          the source backend's (the hook's SOCKET.pid)
#   mem_check DST_HOST_DIR DOMAIN LABEL    after it: compare, print, resume; returns 1 when a page
#                                          differs
# Needs MEMCMP (vrdma-memcmp) and W (the test's folder; backends write their journals there as
# journal-PID.bin: the hook's environment sets VRDMA_WRITE_JOURNAL=$W/journal-%p.bin).
MEM_FD="" MEM_SRC="" MEM_JOURNALS=()

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
  "$MEMCMP" "$MEM_SRC" "pid:$dpid" "${MEM_JOURNALS[@]}" > "$W/memcmp.txt" 2>&1 || rc=$?
  exec {MEM_FD}<&-
  sed "s/^/  $3: /" "$W/memcmp.txt"
  virsh -q -c "qemu+unix:///system?socket=$1/run/libvirt/libvirt-sock" resume "$2" >/dev/null ||
    { echo "mem_check: virsh resume $2 failed" >&2; return 1; }
  [ $rc -le 1 ] || { echo "mem_check: the comparison could not run (status $rc)" >&2; return 1; }
  return $rc
}
