#!/usr/bin/env bash
# Conformance against Linux's own RDMA stack: a QEMU (TCG) guest running Debian's kernel with
# rdma_rxe and the Debian rdma-core/perftest tools, on a bridge in a network namespace; our soft
# engine (vrdma-perf) on the host side of the bridge. Each tool pair runs at path MTU 1024 and
# 4096, then again with nftables dropping 2 % of RoCE packets both ways. The packets are
# captured and decoded by tshark; our engine counts ICRC failures of what rxe sent (the raw
# receive path sees the IP IDs rxe puts in); the guest's kernel log shows whether rxe rejected
# any ICRC of ours. Guest commands run under `timeout 60`, host commands under `timeout 90`.
# The namespace, QEMU and the console protocol are peer_rig.sh's (with its one rerun of a case
# on a fresh guest when the TCG guest's NIC stalls).
#   rxe_test.sh PATH/TO/vrdma-perf          exits 77 (skip) when root, QEMU or the guest is missing
#   ONLY=<regex> runs only the matching cases; KEEP_WORK=1 keeps the logs.
set -euo pipefail
PERF=$(readlink -f "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../serial_lib.sh"  # skip, rig_start, wait_serial, vm_rig_cleanup
rig_start "$HERE/make_guest.sh"

T0=$(date +%s)
NS=vrxe$$
HOST=10.77.0.1 GUEST=10.77.0.2 GUEST_MAC=52:54:00:77:00:02 GUEST_INITRD=$INITRD
work=$(mktemp -d)
cap_pid=""
. "$HERE/peer_rig.sh"
cleanup() {
  [ -z "$cap_pid" ] || kill "$cap_pid" 2>/dev/null || true
  rig_cleanup
  if [ -n "${KEEP_WORK:-}" ]; then echo "work dir kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
after_boot() { :; }  # guest_init.sh's defaults are this rig's: eth0 10.77.0.2, rxe0 (and siw0) on it
icrc_earlier=0
before_reboot() {  # the stalled guest's console still answers: keep its count of ICRC complaints
  local n
  if guest_run "$work/icrc.$boots.guest" 20 "echo BAD_ICRC=\$(dmesg | grep -ci 'icrc')"; then
    n=$(sed -n 's/^BAD_ICRC=\([0-9]*\).*/\1/p' "$work/icrc.$boots.guest")
    icrc_earlier=$((icrc_earlier + ${n:-0}))
  fi
}

rig_net
guest_boot || exit 1
grep "VRDMA-GUEST-READY" "$work/serial.log" | tr -d '\r'
# A guest built with siw must show its link next to rxe's.
case "$INITRD" in *-siw.cpio.gz)
  grep "VRDMA-GUEST-READY" "$work/serial.log" | grep -q "link siw0/1 state ACTIVE" || { echo "FAIL: siw0 is not up in the guest"; siw_fail=1; } ;;
esac
echo "guest ready after $(($(date +%s) - T0)) s"

# Local ACK timeout 4.096 us x 2^17 = 0.5 s: rxe under TCG takes longer than the default 67 ms to
# work through a 512-packet window, and retransmitting the window into its backlog every 67 ms
# keeps it behind until the retry count runs out.
QP_TIMEOUT=17
passed=0 failed=${siw_fail:-0}
declare -a summary
host_ok() {  # the host side's JSON: exit status 0, no ICRC failures on our side, verified if asked,
  local f=$1  # no packet longer than our path MTU
  grep -q '"rx_dropped_icrc":0[,}]' "$f" && ! grep -q '"verified":false' "$f" && ! grep -q '"rx_longer_than_mtu":[1-9]' "$f"
}
# The data moved (issue 23 point 3): our engine's packet counts against what the case asked for,
# so that no case passes having moved nothing. The guest tool's -n and -s (perftest, pingpong)
# give the messages and their size; the path MTU is the smaller of its -m and our --mtu. The side
# that carries the data is ours for what we send (our WRITE/SEND as client, READ responses as
# server) and the guest's for the rest; latency and ping-pong tests send both ways. Lower bounds:
# retransmissions under loss add packets. rping and perftest -R runs check their data themselves
# (write_bw -R: our engine's packets since the listener opened, too).
moved_ok() {  # our role (server|client), vrdma-perf args, guest command, host log
  python3 - "$@" <<'PY'
import json, re, sys
role, args, cmd, log = sys.argv[1:5]
def opt(text, flag, default=None):
    m = re.search(r"(?:^|\s)" + re.escape(flag) + r"\s+(\S+)", text)
    return m.group(1) if m else default
test = "pingpong" if "pingpong" in cmd else opt(args, "--test")
if test is None or ("--cm" in args and test != "write_bw") or "rping" in cmd:
    sys.exit(0)
n, size = int(opt(cmd, "-n", "1000")), int(opt(cmd, "-s", "65536"))
mtus = [int(m) for m in (opt(cmd, "-m"), opt(args, "--mtu")) if m]
mtu = min(mtus) if mtus else 1024
if "--cm" in args:  # RDMA-CM takes the route's path MTU: 4096 at most
    mtu = 4096
per_msg = max(1, -(-size // mtu))
n *= int(opt(cmd, "-q", "1")) if ("ib_" in cmd) else 1  # perftest -q N: -n on each QP
if re.search(r"(?:^|\s)-a(?:\s|$)", cmd):  # perftest -a: n messages of each size 2 B .. 8 MiB
    per_msg = sum(max(1, -(-(1 << k) // mtu)) for k in range(1, 24))
line = [l for l in open(log) if l.lstrip().startswith("{")]
eng = json.loads(line[-1]).get("engine", {}) if line else {}
rx, tx = eng.get("rx_packets", 0), eng.get("tx_packets", 0)
if test in ("pingpong", "send_lat", "write_lat"):
    need = {"rx": n * per_msg, "tx": n * per_msg}
elif test in ("read_bw", "read_lat"):
    need = {"tx" if role == "server" else "rx": n * per_msg}
else:  # write_bw, send_bw, atomic_bw
    need = {"rx" if role == "server" else "tx": n * per_msg}
if re.search(r"(?:^|\s)-b(?:\s|$)", cmd):  # both sides ran the test: data both ways
    need = {"rx": n * per_msg, "tx": n * per_msg}
got = {"rx": rx, "tx": tx}
# A SEND server counts the messages it received: all of them (UD drops what finds no receive).
ops = json.loads(line[-1]).get("ops", 0) if line else 0
if test == "send_bw" and role == "server" and "--cm" not in args and ops < n:
    print(f"  data did not move: the server received {ops} of {n} messages")
    sys.exit(1)
short = [f"{k} {got[k]} < {v}" for k, v in need.items() if got[k] < v]
if short:
    print(f"  data did not move: {test}, {n} x {size} B at MTU {mtu}: our " + ", ".join(short) + " packets")
    sys.exit(1)
PY
}
record() {  # name, ok(0/1), host log, guest log
  local name=$1 ok=$2
  local line
  line=$(grep -o '{.*}' "$3" 2>/dev/null | tail -1 | sed 's/"records":\[[0-9,]*\],//' || true)
  if [ "$ok" -eq 0 ]; then
    passed=$((passed + 1)); summary+=("ok   $name $line")
    echo "ok   $name: $line"
  elif rig_should_retry "$name"; then
    return 0
  else
    failed=$((failed + 1)); summary+=("FAIL $name")
    echo "FAIL $name"; echo "--- host:"; cat "$3" 2>/dev/null || true; echo "--- guest:"; cat "$4" 2>/dev/null || true
  fi
}

# A tool in the guest as client against vrdma-perf serving on the host.
guest_client() {  # name, vrdma-perf args, guest command
  local name=$1 args=$2 cmd=$3 ok=1 hp
  [[ -z "${ONLY:-}" || "$name" =~ $ONLY ]] || return 0
  timeout 90 ip netns exec "$NS" "$PERF" --device soft:$HOST $args --qp-timeout $QP_TIMEOUT >"$work/$name.host" 2>&1 &
  hp=$!
  if wait_listen; then
    guest_start "timeout 60 $cmd $HOST"
    if guest_wait "$work/$name.guest" 90 && wait $hp && host_ok "$work/$name.host" \
       && moved_ok server "$args" "$cmd" "$work/$name.host"; then ok=0; fi
  fi
  kill $hp 2>/dev/null || true  # the guest gave up: so does our side, not at its own timeout
  wait $hp 2>/dev/null || true
  record "$name" $ok "$work/$name.host" "$work/$name.guest"
}
# A tool in the guest as server, vrdma-perf connecting from the host.
guest_server() {
  local name=$1 args=$2 cmd=$3 ok=1
  [[ -z "${ONLY:-}" || "$name" =~ $ONLY ]] || return 0
  guest_start "timeout 60 $cmd"
  # Over TCP (perftest's and the pingpong exchange) vrdma-perf retries its connection for 10 s;
  # through RDMA-CM a connection before the guest's tool listens is rejected: give it a second.
  case "$args" in *"--peer-format rping"* | *"--peer-format ucmatose"* | *"--cm"*) sleep 1 ;; esac
  if timeout 90 ip netns exec "$NS" "$PERF" --device soft:$HOST --connect $GUEST $args --qp-timeout $QP_TIMEOUT >"$work/$name.host" 2>&1 \
     && guest_wait "$work/$name.guest" 90 && host_ok "$work/$name.host" \
     && moved_ok client "$args" "$cmd" "$work/$name.host"; then ok=0; fi
  # On failure the guest's tool may still wait for us: let its timeout end it before going on.
  [ $ok -eq 0 ] || guest_wait "$work/$name.guest" 90 || true
  record "$name" $ok "$work/$name.host" "$work/$name.guest"
}

# RDMA-CM: the guest's kernel CM (ib_cm, rdma_cm) against ours on QP1. A tool in the guest as
# client against vrdma-perf listening through our CM (no TCP port to wait for: the listener is
# up as soon as the device is open).
cm_guest_client() {  # name, vrdma-perf args, guest command
  local name=$1 args=$2 cmd=$3 ok=1 hp
  [[ -z "${ONLY:-}" || "$name" =~ $ONLY ]] || return 0
  timeout 90 ip netns exec "$NS" "$PERF" --device soft:$HOST $args --qp-timeout $QP_TIMEOUT >"$work/$name.host" 2>&1 &
  hp=$!
  sleep 1
  guest_start "timeout 60 $cmd"
  if guest_wait "$work/$name.guest" 90 && wait $hp && host_ok "$work/$name.host"; then ok=0; fi
  kill $hp 2>/dev/null || true
  wait $hp 2>/dev/null || true
  record "$name" $ok "$work/$name.host" "$work/$name.guest"
}
run_cm() {  # (mtu: the CM's path MTU is the route's, 4096 here), suffix
  local sfx=$2
  run_case cm_guest_client "rping_c$sfx" "--peer-format rping --size 4096" "rping -c -a $HOST -C 40 -S 4096 -V"
  run_case guest_server "rping_s$sfx" "--peer-format rping --size 4096 --iters 40" "rping -s -a $GUEST -S 4096 -V"
  run_case cm_guest_client "send_bw_R_c$sfx" "--peer-format perftest --cm --test send_bw --size 4096" \
    "ib_send_bw -R -d rxe0 -x 1 -F -n 200 -s 4096 $HOST"
  run_case cm_guest_client "write_bw_R_c$sfx" "--peer-format perftest --cm --test write_bw --size 65536" \
    "ib_write_bw -R -d rxe0 -x 1 -F -n 200 -s 65536 $HOST"
  run_case cm_guest_client "ucmatose_c$sfx" "--peer-format ucmatose --size 4096 --iters 100" "ucmatose -s $HOST -C 100 -S 4096"
  run_case guest_server "ucmatose_s$sfx" "--peer-format ucmatose --size 4096 --iters 100" "ucmatose -b $GUEST -C 100 -S 4096"
}

run_all() {  # mtu, suffix
  local m=$1 sfx=$2 pt="-d rxe0 -x 1 -F -m $1"
  run_case guest_client "pingpong_c_$m$sfx" "--peer-format pingpong --size 4096 --iters 200 --mtu $m" \
    "ibv_rc_pingpong -d rxe0 -g 1 -m $m -s 4096 -n 200 -c"
  run_case guest_server "pingpong_s_$m$sfx" "--peer-format pingpong --size 4096 --iters 200 --mtu $m" \
    "ibv_rc_pingpong -d rxe0 -g 1 -m $m -s 4096 -n 200 -c"
  run_case guest_client "write_bw_$m$sfx" "--peer-format perftest --test write_bw --size 65536 --mtu $m" \
    "ib_write_bw $pt -s 65536 -n 200"
  run_case guest_client "read_bw_$m$sfx" "--peer-format perftest --test read_bw --size 65536 --mtu $m" \
    "ib_read_bw $pt -s 65536 -n 200"
  run_case guest_client "send_bw_$m$sfx" "--peer-format perftest --test send_bw --size 65536 --mtu $m" \
    "ib_send_bw $pt -s 65536 -n 200"
  run_case guest_client "send_lat_$m$sfx" "--peer-format perftest --test send_lat --size 64 --iters 200 --mtu $m" \
    "ib_send_lat $pt -s 64 -n 200"
  local t
  for t in write_bw read_bw send_bw; do
    run_case guest_server "${t}_s_$m$sfx" "--peer-format perftest --test $t --size 65536 --iters 200 --mtu $m" \
      "ib_$t $pt -s 65536 -n 200"
  done
  run_case guest_server "send_lat_s_$m$sfx" "--peer-format perftest --test send_lat --size 64 --iters 200 --mtu $m" \
    "ib_send_lat $pt -s 64 -n 200"
}

# Each round's first 30000 RoCE packets (both ways) are captured for tshark.
capture() {  # round name, then the run_all arguments
  local name=$1; shift
  if command -v tshark >/dev/null; then
    ip netns exec "$NS" tshark -q -i br0 -s 0 -f "udp port 4791" -w "$work/cap_$name.pcapng" -c 30000 >/dev/null 2>&1 &
    cap_pid=$!
    # tshark writes the file header once it captures; on a loaded machine that takes seconds.
    local i
    for ((i = 0; i < 150; i++)); do [ -s "$work/cap_$name.pcapng" ] && break; sleep 0.1; done
    sleep 1
  fi
  "${RUNNER:-run_all}" "$@"
  # TERM, not INT: a background job of a non-interactive shell ignores SIGINT, so a round with
  # fewer packets than -c (the CM round, any ONLY= subset) would wait here forever.
  if [ -n "$cap_pid" ]; then sleep 0.5; kill -TERM "$cap_pid" 2>/dev/null || true; wait "$cap_pid" 2>/dev/null || true; cap_pid=""; fi
}
capture 1024 1024 ""
capture 4096 4096 ""
RUNNER=run_cm capture cm 4096 ""
# Path MTUs that differ (issue 23): perftest's sides each take the smaller; so does vrdma-perf,
# as server (it answers the client's MTU record with its own) and as client.
# perftest prints the MTU it runs ("Mtu : 1024[B]"); vrdma-perf says when it took the peer's.
mtu_case() {  # name, what our log must say, run_case arguments...
  local name=$1 note=$2; shift 2
  [[ -z "${ONLY:-}" || "$name" =~ $ONLY ]] || return 0
  run_case "$@"
  if ! grep -Eq 'Mtu +: 1024\[B\]' "$work/$name.guest" 2>/dev/null || ! grep -q "$note" "$work/$name.host" 2>/dev/null; then
    echo "FAIL $name: the two sides did not both run path MTU 1024"; failed=$((failed + 1))
  fi
}
mtu_case write_bw_mtu_4096_vs_1024 '"rx_longer_than_mtu":0' guest_client write_bw_mtu_4096_vs_1024 \
  "--peer-format perftest --test write_bw --size 65536 --mtu 1024" "ib_write_bw -d rxe0 -x 1 -F -m 4096 -s 65536 -n 200"
mtu_case read_bw_s_mtu_1024_vs_4096 "both use 1024" guest_server read_bw_s_mtu_1024_vs_4096 \
  "--peer-format perftest --test read_bw --size 65536 --iters 200 --mtu 4096" "ib_read_bw -d rxe0 -x 1 -F -m 1024 -s 65536 -n 200"
# The rest of perftest's RC tests (issue 23 point 2), path MTU 1024: write_lat (perftest's server
# writes first, each side watches the last byte of the other's WRITE), read_lat (one READ at a
# time), atomic_bw with CMP_AND_SWAP (perftest's -A), each in both roles.
pt1="-d rxe0 -x 1 -F -m 1024"
run_case guest_client write_lat_c "--peer-format perftest --test write_lat --size 64 --iters 200 --mtu 1024" \
  "ib_write_lat $pt1 -s 64 -n 200"
run_case guest_server write_lat_s "--peer-format perftest --test write_lat --size 64 --iters 200 --mtu 1024" \
  "ib_write_lat $pt1 -s 64 -n 200"
run_case guest_client read_lat_c "--peer-format perftest --test read_lat --size 4096 --iters 200 --mtu 1024" \
  "ib_read_lat $pt1 -s 4096 -n 200"
run_case guest_server read_lat_s "--peer-format perftest --test read_lat --size 4096 --iters 200 --mtu 1024" \
  "ib_read_lat $pt1 -s 4096 -n 200"
run_case guest_client atomic_cas_c "--peer-format perftest --test atomic_bw --size 8 --mtu 1024" \
  "ib_atomic_bw $pt1 -A CMP_AND_SWAP -s 8 -n 200"
run_case guest_server atomic_cas_s "--peer-format perftest --test atomic_bw -A CMP_AND_SWAP --size 8 --iters 200 --mtu 1024" \
  "ib_atomic_bw $pt1 -A CMP_AND_SWAP -s 8 -n 200"
# ibv_ud_pingpong over UD QPs (Q_Key 0x11111111, 40 bytes of GRH before each message), every
# echoed datagram checked byte for byte.
run_case guest_client ud_pingpong_c "--peer-format pingpong --connection UD --size 1024 --iters 200 --mtu 1024" \
  "ibv_ud_pingpong -d rxe0 -g 1 -s 1024 -n 200 -c"
run_case guest_server ud_pingpong_s "--peer-format pingpong --connection UD --size 1024 --iters 200 --mtu 1024" \
  "ibv_ud_pingpong -d rxe0 -g 1 -s 1024 -n 200 -c"
# ibv_srq_pingpong: 16 RC QPs a side (the tool's default), every receive from one SRQ; -n counts
# messages over all QPs.
run_case guest_client srq_pingpong_c "--peer-format pingpong --srq --size 4096 --iters 400 --mtu 1024" \
  "ibv_srq_pingpong -d rxe0 -g 1 -m 1024 -s 4096 -n 400 -c"
run_case guest_server srq_pingpong_s "--peer-format pingpong --srq --size 4096 --iters 400 --mtu 1024" \
  "ibv_srq_pingpong -d rxe0 -g 1 -m 1024 -s 4096 -n 400 -c"
# perftest over UD (-c UD; Q_Key 0x11111111, the GRH before each message): SEND bandwidth and latency.
run_case guest_client send_bw_ud_c "--peer-format perftest --connection UD --test send_bw --size 1024 --mtu 1024" \
  "ib_send_bw $pt1 -c UD -s 1024 -n 200"
run_case guest_server send_bw_ud_s "--peer-format perftest --connection UD --test send_bw --size 1024 --iters 200 --mtu 1024" \
  "ib_send_bw $pt1 -c UD -s 1024 -n 200"
run_case guest_client send_lat_ud_c "--peer-format perftest --connection UD --test send_lat --size 64 --iters 200 --mtu 1024" \
  "ib_send_lat $pt1 -c UD -s 64 -n 200"
run_case guest_server send_lat_ud_s "--peer-format perftest --connection UD --test send_lat --size 64 --iters 200 --mtu 1024" \
  "ib_send_lat $pt1 -c UD -s 64 -n 200"
# perftest -a: every size from 2 B to 8 MiB, 5 messages each (~80 MiB each way).
run_case guest_client write_bw_a_c "--peer-format perftest --test write_bw -a --mtu 1024" \
  "ib_write_bw $pt1 -a -n 5"
run_case guest_server read_bw_a_s "--peer-format perftest --test read_bw -a --iters 5 --mtu 1024" \
  "ib_read_bw $pt1 -a -n 5"
# perftest -b: both sides run the test at once (WRITEs or READs each way).
run_case guest_client write_bw_b_c "--peer-format perftest --test write_bw -b --size 65536 --iters 200 --mtu 1024" \
  "ib_write_bw $pt1 -b -s 65536 -n 200"
run_case guest_server write_bw_b_s "--peer-format perftest --test write_bw -b --size 65536 --iters 200 --mtu 1024" \
  "ib_write_bw $pt1 -b -s 65536 -n 200"
run_case guest_client read_bw_b_c "--peer-format perftest --test read_bw -b --size 65536 --iters 200 --mtu 1024" \
  "ib_read_bw $pt1 -b -s 65536 -n 200"
# perftest -q 4: four QPs, each connected to one of ours, each carrying -n messages.
run_case guest_client write_bw_q4_c "--peer-format perftest --test write_bw --size 65536 --mtu 1024" \
  "ib_write_bw $pt1 -q 4 -s 65536 -n 200"
run_case guest_client send_bw_q4_c "--peer-format perftest --test send_bw --size 65536 --mtu 1024" \
  "ib_send_bw $pt1 -q 4 -s 65536 -n 200"
# What vrdma-perf cannot serve it refuses in a sentence (exit 1), never an empty run that exits 0:
# perftest -q 2 where only one QP is served (atomics) and -c UD against an RC run. The guest's tool fails too.
refused_case() {  # name, what our log must say, vrdma-perf args, guest command
  local name=$1 note=$2 args=$3 cmd=$4 ok=1 hp rc=0
  [[ -z "${ONLY:-}" || "$name" =~ $ONLY ]] || return 0
  timeout 90 ip netns exec "$NS" "$PERF" --device soft:$HOST $args --qp-timeout $QP_TIMEOUT >"$work/$name.host" 2>&1 &
  hp=$!
  if wait_listen; then
    guest_start "timeout 30 $cmd $HOST"
    wait $hp || rc=$?
    guest_wait "$work/$name.guest" 90 || true
    if [ "$rc" -eq 1 ] && grep -q "$note" "$work/$name.host"; then ok=0; fi
  fi
  kill $hp 2>/dev/null || true
  wait $hp 2>/dev/null || true
  if [ $ok -eq 0 ]; then echo "  $name: $(tail -1 "$work/$name.host")"; fi
  record "$name" $ok "$work/$name.host" "$work/$name.guest"
}
run_case refused_case atomic_q2_refused "more than one QP" "--peer-format perftest --test atomic_bw --size 8 --mtu 1024" \
  "ib_atomic_bw $pt1 -q 2 -s 8 -n 200"
run_case refused_case send_bw_ud_refused "UC or UD" "--peer-format perftest --test send_bw --size 1024 --mtu 1024" \
  "ib_send_bw $pt1 -c UD -s 1024 -n 200"

# The guest's DREQ lost: Linux does not resend it once rping (or ib_send_bw -R) has destroyed its
# cm_id, so nothing tells our server the run is over; it must end it itself (10 s of silence
# after the last message), not wait for ever. nftables drops the guest's DREQs (MAD attribute
# 0x0015 at UDP payload byte 36).
if [[ -z "${ONLY:-}" || "rping_c_lost_dreq" =~ $ONLY || "send_bw_R_c_lost_dreq" =~ $ONLY ]]; then
  ip netns exec "$NS" nft -f - <<'EOF'
table inet vrdma_dreq {
  chain in { type filter hook input priority 0; udp dport 4791 @th,352,16 0x0015 counter drop; }
}
EOF
  run_case cm_guest_client "rping_c_lost_dreq" "--peer-format rping --size 4096" "rping -c -a $HOST -C 10 -S 4096 -V"
  run_case cm_guest_client "send_bw_R_c_lost_dreq" "--peer-format perftest --cm --test send_bw --size 4096" \
    "ib_send_bw -R -d rxe0 -x 1 -F -n 200 -s 4096 $HOST"
  for c in rping_c_lost_dreq send_bw_R_c_lost_dreq; do
    [[ -z "${ONLY:-}" || "$c" =~ $ONLY ]] || continue
    if ! grep -q '"client_idle":true' "$work/$c.host" 2>/dev/null; then
      echo "FAIL $c: our server did not end the run on its own"; failed=$((failed + 1))
    fi
  done
  ip netns exec "$NS" nft list table inet vrdma_dreq | grep -o 'counter packets [0-9]*' | sed 's/^/  DREQs dropped: /'
  ip netns exec "$NS" nft delete table inet vrdma_dreq
fi

# Real loss on the bridge: nftables drops 2 % of RoCE packets in and out of the host side.
ip netns exec "$NS" nft -f - <<'EOF'
table inet vrdma_loss {
  chain in { type filter hook input priority 0; udp dport 4791 numgen random mod 100 < 2 counter drop; }
  chain out { type filter hook output priority 0; udp dport 4791 numgen random mod 100 < 2 counter drop; }
}
EOF
capture 1024_loss 1024 "_loss"
capture 4096_loss 4096 "_loss"
RUNNER=run_cm capture cm_loss 4096 "_loss"
# Loss amplification (issue 23 point 4): five READs of 4 MiB from rxe at path MTU 1024 under the
# same 2 % loss each way. A lost response costs a re-read of the lost packets only (rxe takes a
# re-read of part of a READ), so rxe's responses that reached us stay under 1.5 per packet
# needed (20,480); re-reading the rest of the message each time cost ~58 per packet.
if [[ -z "${ONLY:-}" || "read_bw_s_4MiB_loss" =~ $ONLY ]]; then
  run_case guest_server read_bw_s_4MiB_loss "--peer-format perftest --test read_bw --size 4194304 --iters 5 --mtu 1024" \
    "ib_read_bw -d rxe0 -x 1 -F -m 1024 -s 4194304 -n 5"
  rx=$(grep -o '"rx_packets":[0-9]*' "$work/read_bw_s_4MiB_loss.host" 2>/dev/null | tail -1 | cut -d: -f2)
  rr=$(grep -o '"read_rereads":[0-9]*' "$work/read_bw_s_4MiB_loss.host" 2>/dev/null | tail -1 | cut -d: -f2)
  echo "  4 MiB READs under loss: ${rx:-?} response packets received for 20480 needed, ${rr:-?} re-reads"
  if [ -z "$rx" ] || [ "$rx" -lt 20480 ] || [ "$rx" -gt 30720 ]; then
    echo "FAIL read_bw_s_4MiB_loss: ${rx:-no} response packets for 20480 needed (bound 30720)"; failed=$((failed + 1))
  fi
fi
dropped=$(ip netns exec "$NS" nft list table inet vrdma_loss | grep -o 'packets [0-9]*' | awk '{s+=$2} END{print s+0}')
echo "nftables dropped $dropped RoCE packets"
[ "$dropped" -gt 0 ] || [ -n "${ONLY:-}" ] || { echo "FAIL: nftables dropped nothing"; failed=$((failed + 1)); }
ip netns exec "$NS" nft delete table inet vrdma_loss

# Our ACKs lost, half of them: with ibv_rc_pingpong serving, the ACK of its last SEND is lost in
# half the runs, and the tool's retransmissions must find our QP still there (vrdma-perf stays
# 1 s after the last message). Without that the tool hangs until its timeout (3 of 4 runs failed
# at 40 % ACK loss); two runs here catch it 3 times in 4.
ip netns exec "$NS" nft -f - <<'EOF'
table inet vrdma_ackloss {
  chain out { type filter hook output priority 0; udp dport 4791 @th,64,8 0x11 numgen random mod 100 < 50 counter drop; }
}
EOF
for r in 1 2; do
  run_case guest_server "pingpong_s_ackloss_$r" "--peer-format pingpong --size 4096 --iters 200 --mtu 1024" \
    "ibv_rc_pingpong -d rxe0 -g 1 -m 1024 -s 4096 -n 200 -c"
done
if [[ -z "${ONLY:-}" || "pingpong_s_ackloss_1" =~ $ONLY ]]; then
  ip netns exec "$NS" nft list table inet vrdma_ackloss | grep -o 'counter packets [0-9]*' | sed 's/^/  our ACKs dropped: /'
fi
ip netns exec "$NS" nft delete table inet vrdma_ackloss

# rxe's view: its counters and whether it logged any bad ICRC.
guest_start "rdma statistic show link rxe0/1; echo BAD_ICRC=\$(dmesg | grep -ci 'icrc')"
guest_wait "$work/rxe_stats.guest" 90 || true
cat "$work/rxe_stats.guest"
if ! grep -q "^BAD_ICRC=0" "$work/rxe_stats.guest" || [ "$icrc_earlier" -ne 0 ]; then echo "FAIL: rxe logged ICRC errors"; dmesg_fail=1; failed=$((failed + 1)); fi

# Every packet our engine sent in the captures: decoded with a BTH, nothing malformed.
for cap in "$work"/cap_*.pcapng; do
  [ -f "$cap" ] && [ -z "${ONLY:-}" ] || continue
  round=$(basename "$cap" .pcapng)
  # Without the RPC-over-RDMA heuristic: it claims small SEND payloads (rping's and perftest's
  # records) as its own and reports them malformed; our headers are not what it judges.
  tshark --disable-protocol rpcordma -r "$cap" -Y "ip.src == $HOST" -T fields -e frame.number -e infiniband.bth.opcode \
    -e _ws.expert.message -E separator=';' > "$work/decode_$round.txt" 2>"$work/decode_$round.err" || true
  total=$(wc -l < "$work/decode_$round.txt")
  bth=$(awk -F';' '$2!=""' "$work/decode_$round.txt" | wc -l)
  bad=$(grep -ciE 'malformed|exception|bad' "$work/decode_$round.txt" || true)
  ops=$(awk -F';' '{print $2}' "$work/decode_$round.txt" | sort -un | tr '\n' ' ')
  echo "tshark $round: $total packets from our engine, $bth with a BTH, $bad with decode errors; opcodes: $ops"
  if [ "$total" -gt 100 ] && [ "$bth" -eq "$total" ] && [ "$bad" -eq 0 ]; then passed=$((passed + 1))
  else echo "FAIL tshark decode of $round"; head -20 "$work/decode_$round.txt"; cat "$work/decode_$round.err"; failed=$((failed + 1)); fi
done

# Our CM MADs (packets to QP1) in the CM rounds: each message we send decoded by tshark's CM
# dissector (REQ, MRA, REP, RTU as client and server; DREQ and DREP), none malformed.
for cap in "$work"/cap_cm*.pcapng; do
  [ -f "$cap" ] && [ -z "${ONLY:-}" ] || continue
  round=$(basename "$cap" .pcapng)
  tshark -r "$cap" -Y "ip.src == $HOST && infiniband.bth.destqp == 1" -T fields -e infiniband.mad.attributeid \
    -e _ws.col.Info -e _ws.expert.message -E separator='|' > "$work/mads_$round.txt" 2>/dev/null || true
  attrs=$(awk -F'|' '{print $1}' "$work/mads_$round.txt" | sort -u | tr '\n' ' ')
  bad=$(grep -ciE 'malformed|exception' "$work/mads_$round.txt" || true)
  echo "tshark $round: $(wc -l < "$work/mads_$round.txt") CM MADs from our engine, attributes $attrs; $bad with decode errors"
  if [ "$bad" -eq 0 ] && [ "$attrs" = "0x0010 0x0011 0x0013 0x0014 0x0015 0x0016 " ]; then passed=$((passed + 1))
  else echo "FAIL tshark CM decode of $round"; cat "$work/mads_$round.txt"; failed=$((failed + 1)); fi
done

echo QUIT >&3
wait "$qemu_pid" 2>/dev/null || true
qemu_pid=""
echo "rxe conformance: $passed passed, $failed failed, $(($(date +%s) - T0)) s$([ $boots -le 1 ] || echo ", the guest rebooted $((boots - 1)) time(s) after its NIC stalled")"
[ $failed -eq 0 ]
