#!/usr/bin/env bash
# The demo of vrdma's main job: a guest with paravirtual RDMA moves live between two libvirt
# hosts while it streams checked RDMA traffic to a peer, and nobody notices.
#
#   scripts/demo.sh          the migration demo (about 3 minutes here, TCG)
#   scripts/demo.sh --perf   bandwidth and latency of the soft RoCEv2 engine and of pv verbs
#
# Two real libvirt instances ("host a", "host b": tests/integration/integration/two_hosts.sh)
# run on this machine; the guest (Debian's kernel under TCG, vrdma's tools in its initramfs)
# gets the virtio RDMA device from `vrdmactl domain attach`; the libvirt hook starts vrdmad on
# each host. The guest streams messages over RDMA (vrdma-stream on pv verbs, every byte checked
# on both sides) to a peer on the soft engine, through a switch that drops 1 % of the RoCE
# packets. The guest then moves a -> b with plain `virsh migrate --live` and back b -> a with
# `vrdmactl migrate`; after each move the guest's memory at the destination is compared with the
# source's before it runs on (vrdma-memcmp). At the end: each move's time and downtime, the longest pause between two
# completions, every message checked, and a plot (build/demo/migration.png, figures in build/demo/demo.json).
# Needs root (namespaces, libvirt); installs what it needs (scripts/setup.sh). VRDMA_BUILD=DIR
# uses that build as it is (no set-up, no build).
set -uo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
usage() {
  cat <<U
usage: scripts/demo.sh [--perf] [--help]
  (no option)  a guest with paravirtual RDMA migrates live between two libvirt hosts while it
               streams checked RDMA traffic; prints each move's figures and plots them
               (build/demo/migration.png, build/demo/demo.json)
  --perf       bandwidth and latency of the soft RoCEv2 engine and of pv verbs (two namespaces)
  --help       this text
U
}
case "${1:-}" in
  "") ;;
  --perf) exec "$SRC/scripts/demo_perf.sh" ;;
  -h|--help) usage; exit 0 ;;
  *) echo "demo: unknown option '$1' (scripts/demo.sh --help lists the options)" >&2; exit 2 ;;
esac
[ "$(id -u)" -eq 0 ] || { echo "demo: run as root (it creates network namespaces and runs libvirt)" >&2; exit 1; }
T0=$(date +%s)
say() { printf '[%4ds] %s\n' $(( $(date +%s) - T0 )) "$*"; }
if [ -n "${VRDMA_BUILD:-}" ]; then  # a build that exists (tests/integration/integration/demo_test.sh)
  B=$(readlink -f "$VRDMA_BUILD")
else
  say "installing what is missing (scripts/setup.sh) and building (scripts/build.sh build)"
  ./scripts/setup.sh >/dev/null || { echo "demo: scripts/setup.sh failed (it installs Debian 12 packages with apt)" >&2; exit 1; }
  ./scripts/build.sh build >/dev/null || { echo "demo: the build failed: run ./scripts/build.sh build to see why" >&2; exit 1; }
  B=$SRC/build
fi
export VRDMACTL=$B/integration/vrdmactl VRDMAD=$B/daemon/vrdmad STREAM=$B/tests/tools/vrdma-stream MEMCMP=$B/tests/tools/vrdma-memcmp
say "preparing the guest: Debian's kernel and an initramfs with vrdma's guest tools (cached after the first run)"
G=$("$SRC/tests/conformance/vm/make_guest.sh" "$B/nicdrv/vrdma-perf" "$B/guest/pvverbs-bind" "$STREAM" 2>&1) ||
  { echo "demo: cannot build the guest: $G" >&2; exit 1; }
export KERNEL=$(echo "$G" | sed -n 's/.*KERNEL=\([^ ]*\).*/\1/p') INITRD=$(echo "$G" | sed -n 's/.*INITRD=\([^ ]*\).*/\1/p')
export OUT=$B/demo W=$(mktemp -d /tmp/vrdma-demo.XXXXXX)
mkdir -p "$OUT"
export SWNS=vdemosw PNS=vdemop LV_PREFIX=vdm LV_NET=10.97.7 HERE=$SRC/tests/integration/integration
. "$HERE/fabric_lib.sh"  # fabric_cleanup (and the fabric, in inner)
cleanup() {
  fabric_cleanup
  rm -rf "$W"
}
trap cleanup EXIT
. "$HERE/vm_domain.sh"
vm_hook VRDMA_WRITE_JOURNAL=$W/journal-%p.bin VRDMA_VRDMAD=$VRDMAD
export T0
export -f vm_domain_xml say

demo() {
  set -u
  . "$HERE/fabric_lib.sh"
  . "$HERE/memcheck_lib.sh"
  GIP=10.88.7.12 GMAC=52:54:00:88:07:0c GUEST=10.88.7.2 NICMAC=52:54:00:88:07:02 PEER=10.88.7.3
  A="virsh -q -c $LV_A_URI" Bv="virsh -q -c $LV_B_URI"
  fail() {
    echo "demo: FAILED: $*" >&2
    echo "--- the guest's console (last lines)" >&2; tr -d '\r' < "$W/console.log" 2>/dev/null | grep -v progress | tail -8 >&2
    echo "--- the libvirt hook's log" >&2; tail -8 "$W/hook.log" 2>/dev/null >&2
    exit 1
  }
  say "two libvirt hosts are up (a: $LV_A_IP, b: $LV_B_IP); building the switch and the peer (1 % RoCE loss)"
  guest_fabric || fail "cannot build the network"
  # The peer streams until told to stop (end-file), at most 900 s.
  ip netns exec $PNS timeout 900 "$STREAM" -d soft:$PEER -n 100000000 --limit 800 --progress --end-file "$W/end-stream" \
    > "$W/peer.log" 2>&1 &
  peer_pid=$!
  vm_domain_xml vdemo 512 "vrdma.ip=$GUEST vrdma.peer=$PEER vrdma.stream=100000000" "$NICMAC" vmtap0 "$W/console.log" > "$W/base.xml"
  "$VRDMACTL" domain attach --xml "$W/base.xml" --socket "$W/vdemo.sock" --engine soft:$GIP --mac $GMAC --announce vg \
    > "$W/dom.xml" || fail "vrdmactl domain attach failed"
  say "starting the guest on host a (vrdmactl domain attach added the virtio RDMA device; the hook starts vrdmad)"
  $A create "$W/dom.xml" > /dev/null || fail "virsh create on host a failed"
  # What the peer has received, sampled every 100 ms: the plot and the longest pause.
  count() { sed -n 's/^progress \([0-9]*\)/\1/p' "$W/peer.log" | tail -1; }
  ( while [ ! -e "$W/end-stream" ]; do echo "$(date +%s.%N) $(count)"; sleep 0.1; done ) > "$W/samples" &
  sampler=$!
  wait_count() {  # N SECONDS WHAT
    local i
    for i in $(seq $(($2 * 10))); do
      [ "$(count)" -ge "$1" ] 2>/dev/null && return 0
      [ $((i % 100)) = 0 ] && say "  ... $3 (the peer has ${4:-}$(count || true) messages)"
      sleep 0.1
    done
    return 1
  }
  wait_count 2000 300 "waiting for the guest to boot and stream" || fail "the guest's stream did not start within 300 s"
  say "the guest streams RDMA messages to the peer ($(count) so far, each one checked on arrival)"
  sleep 5
  moves=()
  # After a move that left the guest paused on host TO: its memory compared with the source's,
  # then it runs on; the move's figures recorded; the stream must go on there.
  after_move() {  # NAME TOOL START END TO
    local dir virsh h dt c from
    if [ "$5" = a ]; then dir=$LV_A_DIR virsh=$A from=b; else dir=$LV_B_DIR virsh=$Bv from=a; fi
    say "the guest's memory on $5 compared with $from's while it is paused there:"
    mem_check_or_rerun "$dir" vdemo "$1"
    h=$(date +%s.%N)
    [ "$($virsh domstate vdemo 2>/dev/null)" = running ] || fail "the guest does not run on host $5 after $2"
    dt=$($virsh domjobinfo --completed vdemo 2>/dev/null | awk '/^Total downtime:/ {print $3}')
    moves+=("$1|$2|$3|$4|${dt:-?}|$h")
    c=$(count); wait_count $((c + 2000)) 240 "the guest runs on $5" || fail "the stream made no progress on host $5"
    say "the guest runs on host $5; the stream goes on ($(count) messages)"
  }
  # 1. a -> b with plain virsh: only the hook knows about vrdma.
  # --bandwidth 32 MiB/s: QEMU 7.2 under TCG loses guest memory now and then without a limit
  # (docs/integration.md "QEMU 7.2 TCG and unlimited bandwidth").
  # After each move the guest stays paused at the destination (--suspend) while its memory is
  # compared with the source's (vrdma-memcmp, memcheck_lib.sh), then runs on.
  say "moving the guest a -> b: virsh migrate --live --p2p (the hook starts vrdmad --incoming on b)"
  mem_hold "$LV_A_DIR" vdemo "$W/vdemo.sock.pid" || fail "cannot hold the source's guest memory for the comparison"
  s=$(date +%s.%N)
  $A migrate --live --p2p --suspend --bandwidth 32 vdemo "$LV_B_TCP" --migrateuri "tcp://$LV_B_IP" ||
    fail "virsh migrate a -> b failed"
  e=$(date +%s.%N)
  after_move "a -> b" "virsh migrate" "$s" "$e" b
  sleep 5
  # 2. b -> a with vrdmactl migrate: progress while it copies, the figures at the end.
  say "moving the guest b -> a: vrdmactl migrate (progress, then libvirt's figures)"
  mem_hold "$LV_B_DIR" vdemo "$W/vdemo.${LV_PREFIX}-b.sock.pid" || fail "cannot hold the source's guest memory for the comparison"
  s=$(date +%s.%N)
  "$VRDMACTL" migrate vdemo "$LV_A_TCP" --connect "$LV_B_URI" --migrateuri "tcp://$LV_A_IP" --timeout 240 --bandwidth 32 \
    --suspend 2>&1 | sed 's/^/         vrdmactl: /' || true
  e=$(date +%s.%N)
  after_move "b -> a" "vrdmactl migrate" "$s" "$e" a
  say "ending the stream"
  sleep 3
  touch "$W/end-stream"
  wait $sampler 2>/dev/null
  for _ in $(seq 600); do grep -q "VRDMA-GUEST-DONE" "$W/console.log" 2>/dev/null && break; sleep 0.1; done
  wait $peer_pid
  guest=$(tr -d '\r' < "$W/console.log" | grep "^VRDMA-STREAM {" | tail -1)
  guest=${guest#VRDMA-STREAM }
  peer=$(tail -1 "$W/peer.log")
  $A destroy vdemo > /dev/null 2>&1
  printf '%s\n' "${moves[@]}" > "$W/moves"
  python3 - "$W/samples" "$W/moves" "$OUT" "$guest" "$peer" "$(fabric_dropped)" <<'PY' || fail "the stream did not check out"
import json, sys
samples_f, moves_f, out, guest, peer, dropped = sys.argv[1:]
pts = []
for line in open(samples_f):
    p = line.split()
    if len(p) == 2 and p[1].isdigit():
        pts.append((float(p[0]), int(p[1])))
t0 = pts[0][0]
g, pe = json.loads(guest), json.loads(peer)
moves = []
for line in open(moves_f):
    name, tool, s, e, dt, h = line.rstrip("\n").split("|")
    s, e, h = float(s), float(e), float(h)
    moves.append({"move": name, "tool": tool, "start_s": round(s - t0, 2), "end_s": round(e - t0, 2),
                  "wall_ms": round((e - s) * 1000), "downtime_ms": None if dt == "?" else int(dt),
                  "held_for_memory_check_ms": round((h - e) * 1000)})
ok = g.get("ok") and pe.get("ok") and g.get("received") == pe.get("messages") and pe.get("received") == pe.get("messages")
result = {"ok": bool(ok), "moves": moves, "guest": g, "peer": pe, "roce_packets_dropped_by_switch": int(dropped or 0)}
json.dump(result, open(f"{out}/demo.json", "w"), indent=1)
with open(f"{out}/samples.dat", "w") as f:
    for t, n in pts:
        f.write(f"{t - t0:.2f} {n}\n")
with open(f"{out}/migration.gp", "w") as f:
    f.write(f"set terminal pngcairo size 1000,420 noenhanced\nset output '{out}/migration.png'\n"
            "set title 'RDMA messages the peer received while the guest moved live (vrdma demo)'\n"
            "set xlabel 'seconds'\nset ylabel 'messages'\nset key right bottom\nset grid\n")
    for i, m in enumerate(moves, 1):
        f.write(f"set object {i} rect from {m['start_s']}, graph 0 to {m['end_s'] + m['held_for_memory_check_ms'] / 1000}, graph 1 "
                "fc rgb '#ffd8a0' fs solid 0.5 noborder behind\n")
        f.write(f"set label {i} '{m['move']}: {m['tool']}' at {m['start_s']}, graph 0.95 offset 0.5,0\n")
    f.write(f"plot '{out}/samples.dat' using 1:2 with lines lw 2 title 'messages received by the peer (moves and memory checks shaded)'\n")
print()
print("  move     tool              wall      downtime (libvirt)  then held paused for the memory check")
for m in moves:
    dt = "?" if m["downtime_ms"] is None else f"{m['downtime_ms']} ms"
    print(f"  {m['move']:<8} {m['tool']:<17} {m['wall_ms']/1000:6.1f} s  {dt:>8}            "
          f"{m['held_for_memory_check_ms']/1000:.1f} s")
print()
print(f"  messages: {pe.get('messages')} each way; the guest received {g.get('received')} and the peer {pe.get('received')},")
print(f"  each one in order and byte for byte as sent ({'all checked' if ok else 'NOT all checked'});"
      f" the switch dropped {int(dropped or 0)} RoCE packets on the way")
print(f"  the longest time between two completions: {pe.get('longest_gap_ms', 0):.0f} ms at the peer, "
      f"{g.get('longest_gap_ms', 0):.0f} ms in the guest")
print("  (vrdma-stream's own measure; it includes the pause for the memory check, which a real move does not have,")
print("  and the peer's RDMA retransmission timeout of about 1 s when a packet was lost during the pause)")
sys.exit(0 if ok else 1)
PY
  gnuplot "$OUT/migration.gp" 2>"$W/gnuplot.err" || { sed -n 1,3p "$W/gnuplot.err" >&2; fail "gnuplot could not draw the plot"; }
  say "plot: $OUT/migration.png   figures: $OUT/demo.json"
}
export -f demo
say "starting two libvirt hosts in namespaces (the first start on a machine probes QEMU: up to a minute)"
. "$HERE/memcheck_lib.sh"
memcheck_scenario "$SRC/tests/integration/integration/two_hosts.sh" bash -c demo
rc=$?
[ $rc = 77 ] && { echo "demo: the libvirt rig cannot run here (see the line above)" >&2; exit 1; }
[ $rc = 0 ] && say "demo: done" || echo "demo: failed (status $rc)" >&2
exit $rc
