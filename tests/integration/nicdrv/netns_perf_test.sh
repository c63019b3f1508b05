#!/usr/bin/env bash
# Two "hosts" (network namespaces joined by veth), a soft engine in each, vrdma-perf between
# them: every test with data verification, a tshark decode of the captured packets, and a run
# with nftables dropping a share of RoCE packets on the veth.
#   netns_perf_test.sh PATH/TO/vrdma-perf
set -euo pipefail
PERF=$(readlink -f "$1")
if [ "$(id -u)" -ne 0 ] || ! ip netns list >/dev/null 2>&1; then
  echo "SKIP: needs root to create network namespaces"; exit 0
fi
tag=np$$
A=${tag}a B=${tag}b
IPA=10.231.0.1 IPB=10.231.0.2
work=$(mktemp -d)
cleanup() {
  ip netns pids "$A" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns pids "$B" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$B" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$A"; ip netns add "$B"
ip link add "${A}v" netns "$A" mtu 9000 type veth peer name "${B}v" netns "$B" mtu 9000
ip -n "$A" addr add $IPA/24 dev "${A}v"; ip -n "$B" addr add $IPB/24 dev "${B}v"
ip -n "$A" link set "${A}v" up; ip -n "$B" link set "${B}v" up
ip -n "$A" link set lo up; ip -n "$B" link set lo up

fail=0; passed=0
run_pair() {  # name, extra args...
  local name=$1; shift
  timeout 60 ip netns exec "$A" "$PERF" --device soft:$IPA "$@" >"$work/$name.srv" 2>&1 &
  local spid=$!
  sleep 0.3
  if timeout 60 ip netns exec "$B" "$PERF" --device soft:$IPB --connect $IPA --json --verify "$@" >"$work/$name.cli" 2>&1 \
     && wait $spid && grep -q '"verified":true' "$work/$name.cli"; then
    echo "ok   $name: $(cat "$work/$name.cli")"; passed=$((passed+1))
  else
    echo "FAIL $name"; cat "$work/$name.cli" "$work/$name.srv"; fail=$((fail+1)); wait $spid 2>/dev/null || true
  fi
}
run_lat() {
  local name=$1; shift
  timeout 60 ip netns exec "$A" "$PERF" --device soft:$IPA "$@" >"$work/$name.srv" 2>&1 &
  local spid=$!
  sleep 0.3
  if timeout 60 ip netns exec "$B" "$PERF" --device soft:$IPB --connect $IPA --json "$@" >"$work/$name.cli" 2>&1 \
     && wait $spid && grep -q '"lat_us"' "$work/$name.cli"; then
    echo "ok   $name: $(cat "$work/$name.cli")"; passed=$((passed+1))
  else
    echo "FAIL $name"; cat "$work/$name.cli" "$work/$name.srv"; fail=$((fail+1)); wait $spid 2>/dev/null || true
  fi
}

# During the captured runs the kernel cuts the engines' UDP_SEGMENT runs itself, as a NIC would
# (tx-udp-segmentation off on both veths): tshark sees single packets, and every receiver checks
# each ICRC against the IPv4 ID the kernel gave the segment (the engine computed it in advance).
# Afterwards runs cross the veth whole again, and the receiving engines cut them.
seg_off=0
if command -v ethtool >/dev/null; then
  ip netns exec "$A" ethtool -K "${A}v" tx-udp-segmentation off
  ip netns exec "$B" ethtool -K "${B}v" tx-udp-segmentation off
  seg_off=1
else
  echo "note: ethtool is not installed: runs cross the veth whole during the capture too"
fi
# Capture the first runs for tshark.
have_tshark=0
if command -v tshark >/dev/null; then
  have_tshark=1
  ip netns exec "$B" tshark -q -i "${B}v" -s 0 -f "udp port 4791" -w "$work/cap.pcapng" -c 3000 >/dev/null 2>&1 &
  cap=$!
  # Capturing once tshark has written the file's header (a fixed sleep missed the first run on a
  # loaded host), then a little more for the capture to be live.
  for _ in $(seq 100); do [ -s "$work/cap.pcapng" ] && break; sleep 0.1; done
  sleep 0.3
fi
run_pair write_small --test write_bw --size 3000 --iters 200 --mtu 1024
run_pair send_small --test send_bw --size 2500 --iters 200 --mtu 1024
run_pair read_small --test read_bw --size 5000 --iters 100 --mtu 1024
run_pair atomic --test atomic_bw --iters 300
if [ $have_tshark = 1 ]; then
  sleep 0.5; kill -INT $cap 2>/dev/null || true; wait $cap 2>/dev/null || true
  tshark -r "$work/cap.pcapng" -T fields -e frame.number -e infiniband.bth.opcode -e infiniband.bth.destqp \
    -e infiniband.bth.psn -e _ws.expert.message -E separator=';' > "$work/decode.txt" 2>"$work/decode.err" || true
  total=$(wc -l < "$work/decode.txt")
  bth=$(awk -F';' '$2!=""' "$work/decode.txt" | wc -l)
  malformed=$(grep -ci malformed "$work/decode.txt" || true)
  ops=$(awk -F';' '{print $2}' "$work/decode.txt" | sort -u | tr '\n' ' ')
  echo "tshark: $total packets, $bth with a BTH, $malformed malformed; opcodes seen: $ops"
  if [ "$total" -gt 100 ] && [ "$bth" -eq "$total" ] && [ "$malformed" -eq 0 ]; then
    # The opcodes of these runs: RC WRITE first/middle/last (6,7,8), SEND first/last (0,2),
    # READ request/response (12,13,15), ACK (17), atomic fetch-add and its ack (20,18).
    for op in 6 7 8 0 2 12 13 15 17 18 20; do
      if ! awk -F';' -v o=$op '$2==o{f=1} END{exit !f}' "$work/decode.txt"; then echo "FAIL tshark: opcode $op missing"; fail=$((fail+1)); fi
    done
    passed=$((passed+1))
  else
    echo "FAIL tshark decode"; head -20 "$work/decode.txt"; cat "$work/decode.err"; fail=$((fail+1))
  fi
fi

run_pair write_64k_segmented --test write_bw --size 65536 --iters 300 --mtu 4096
run_pair read_64k_segmented --test read_bw --size 65536 --iters 100 --mtu 4096
if [ $seg_off = 1 ]; then
  ip netns exec "$A" ethtool -K "${A}v" tx-udp-segmentation on
  ip netns exec "$B" ethtool -K "${B}v" tx-udp-segmentation on
fi
run_pair write_64k --test write_bw --size 65536 --iters 2000 --mtu 4096
run_pair read_1m --test read_bw --size 1048576 --iters 50 --mtu 4096
run_pair send_16m --test send_bw --size 16777216 --iters 4 --depth 2 --mtu 4096
run_lat send_lat --test send_lat --size 64 --iters 500
run_lat write_lat --test write_lat --size 64 --iters 500
# CMP_AND_SWAP: the k-th compares with what the (k-1)-th left, so the target ends 300 above its
# start only if every one matched (verified); read_lat reads one message at a time (verified,
# and a latency figure).
run_pair atomic_cas --test atomic_bw -A CMP_AND_SWAP --iters 300
run_pair read_lat --test read_lat --size 4096 --iters 200
grep -q '"lat_us"' "$work/read_lat.cli" || { echo "FAIL read_lat gave no latency"; fail=$((fail+1)); }

# The pingpong peer's --rate: of 200 messages at 100 a second the last goes 1.99 s after the first (ibv_srq_pingpong's
# exchange, 16 QPs on one SRQ, both sides vrdma-perf, every message checked).
run_pair srq_pingpong_rate --peer-format pingpong --srq --size 4096 --iters 200 --rate 100
secs=$(grep -o '"seconds":[0-9.]*' "$work/srq_pingpong_rate.cli" | cut -d: -f2)
if [ -n "$secs" ] && [ "$(echo "$secs >= 1.95" | bc)" = 1 ]; then
  echo "ok   srq_pingpong_rate: 200 messages at --rate 100 took $secs s"; passed=$((passed+1))
else
  echo "FAIL srq_pingpong_rate: 200 messages at --rate 100 took ${secs:-?} s, less than the 1.99 s the pacing needs"; fail=$((fail+1))
fi

# Real loss on the veth: nftables drops 2% of RoCE packets in both namespaces.
if command -v nft >/dev/null; then
  for ns in "$A" "$B"; do
    ip netns exec "$ns" nft add table inet vrdma_loss
    ip netns exec "$ns" nft add chain inet vrdma_loss out '{ type filter hook output priority 0; }'
    ip netns exec "$ns" nft add rule inet vrdma_loss out udp dport 4791 numgen random mod 100 '<' 2 counter drop
  done
  run_pair write_loss --test write_bw --size 65536 --iters 300 --mtu 4096
  run_pair send_loss --test send_bw --size 20000 --iters 300 --mtu 1024
  run_pair read_loss --test read_bw --size 100000 --iters 100 --mtu 1024
  dropped=$(ip netns exec "$A" nft list table inet vrdma_loss | grep -o 'packets [0-9]*' | awk '{s+=$2} END{print s+0}')
  echo "nftables dropped $dropped packets in namespace $A"
  if [ "$dropped" -eq 0 ]; then echo "FAIL: nftables dropped nothing"; fail=$((fail+1)); fi
fi
echo "netns_perf: $passed passed, $fail failed"
[ $fail -eq 0 ]
