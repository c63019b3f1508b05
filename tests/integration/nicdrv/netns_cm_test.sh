#!/usr/bin/env bash
# RDMA-CM between two soft engines in two network namespaces joined by veth: vrdma-perf speaking
# rping's protocol (server in one namespace, client in the other) connects through our IB CM on
# QP1, moves data with SEND/READ/WRITE, checks it, and disconnects; tshark decodes every CM MAD
# on the veth (REQ, MRA, REP, RTU, DREQ, DREP, nothing malformed). Then again with nftables
# dropping 10 % of RoCE packets both ways (lost MADs are resent, lost data retransmitted). The
# same for ucmatose's protocol (vrdma-perf --peer-format ucmatose in both roles) and perftest -R's
# (--peer-format perftest --cm, server and client).
#   netns_cm_test.sh PATH/TO/vrdma-perf          exits 77 (skip) without root
set -euo pipefail
PERF=$(readlink -f "$1")
if [ "$(id -u)" -ne 0 ] || ! ip netns list >/dev/null 2>&1; then
  echo "SKIP: needs root to create network namespaces"; exit 77
fi
A=hcm-a$$ B=hcm-b$$
IPA=10.91.0.1 IPB=10.91.0.2
work=$(mktemp -d)
cap_pid=""
cleanup() {
  [ -n "$cap_pid" ] && kill "$cap_pid" 2>/dev/null
  ip netns pids "$A" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns pids "$B" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$B" 2>/dev/null || true
  if [ -n "${KEEP_WORK:-}" ]; then echo "work dir kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
ip netns add "$A"; ip netns add "$B"
ip link add hcmv$$a netns "$A" mtu 9000 type veth peer name hcmv$$b netns "$B" mtu 9000
ip -n "$A" addr add $IPA/24 dev hcmv$$a; ip -n "$B" addr add $IPB/24 dev hcmv$$b
ip -n "$A" link set hcmv$$a up; ip -n "$B" link set hcmv$$b up
ip -n "$A" link set lo up; ip -n "$B" link set lo up

fail=0 passed=0
run_rping() {  # name, iterations, size
  local name=$1 iters=$2 size=$3 spid
  timeout 60 ip netns exec "$A" "$PERF" --device soft:$IPA --peer-format rping --size "$size" >"$work/$name.srv" 2>&1 &
  spid=$!
  sleep 0.3
  if timeout 60 ip netns exec "$B" "$PERF" --device soft:$IPB --peer-format rping --connect $IPA --size "$size" \
       --iters "$iters" --qp-timeout 14 >"$work/$name.cli" 2>&1 \
     && wait $spid && grep -q '"verified":true' "$work/$name.cli" && grep -q '"verified":true' "$work/$name.srv" \
     && grep -q "\"pings\":$iters," "$work/$name.srv"; then
    echo "ok   $name: $(cat "$work/$name.cli")"; passed=$((passed + 1))
  else
    echo "FAIL $name"; cat "$work/$name.cli" "$work/$name.srv"; fail=$((fail + 1)); wait $spid 2>/dev/null || true
  fi
}
# ucmatose's protocol (the server SENDs N messages, the client answers with N, the server
# disconnects): both sides count every message and its length.
# ucmatose_ok JSON-FILE MESSAGES SIZE: every message arrived, SIZE bytes each; the server's sends
# all completed (the client's last ones may be flushed by the server's disconnect once they
# arrived: the server's count says so).
ucmatose_ok() {
  grep -q '"ok":true' "$1" && grep -q "\"received\":$2," "$1" && grep -q "\"bytes_received\":$(($2 * $3))," "$1" &&
    { grep -q '"role":"client"' "$1" || grep -q "\"sent\":$2," "$1"; }
}
run_ucmatose() {  # name, messages, size
  local name=$1 n=$2 size=$3 spid
  timeout 60 ip netns exec "$A" "$PERF" --device soft:$IPA --peer-format ucmatose --size "$size" --iters "$n" >"$work/$name.srv" 2>&1 &
  spid=$!
  sleep 0.3
  if timeout 60 ip netns exec "$B" "$PERF" --device soft:$IPB --peer-format ucmatose --connect $IPA --size "$size" \
       --iters "$n" --qp-timeout 14 >"$work/$name.cli" 2>&1 && wait $spid &&
     ucmatose_ok "$work/$name.cli" $n $size && ucmatose_ok "$work/$name.srv" $n $size; then
    echo "ok   $name: $(cat "$work/$name.cli")"; passed=$((passed + 1))
  else
    echo "FAIL $name"; cat "$work/$name.cli" "$work/$name.srv"; fail=$((fail + 1)); wait $spid 2>/dev/null || true
  fi
}
# perftest -R's exchange (vrdma-perf --cm as perftest's server and as its client): the records in
# the order perftest's own client sends them, the test QP's second connection, every SEND
# received (send_bw) or every WRITE's packets at the server's engine (write_bw).
run_perftest_cm() {  # name, test, messages, size
  local name=$1 test=$2 n=$3 size=$4 spid want
  timeout 60 ip netns exec "$A" "$PERF" --device soft:$IPA --peer-format perftest --cm --test "$test" --size "$size" \
    >"$work/$name.srv" 2>&1 &
  spid=$!
  sleep 0.3
  want='"records":[16,4,4,2,56,56,56,56,56,56,56]'
  [ "$test" = send_bw ] || want='"records":[16,4,4,2,56,56,56,56,56,56,8,8,8,8,8,56]'
  if timeout 60 ip netns exec "$B" "$PERF" --device soft:$IPB --peer-format perftest --cm --test "$test" --size "$size" \
       --iters "$n" --connect $IPA --qp-timeout 14 >"$work/$name.cli" 2>&1 && wait $spid &&
     grep -q "\"ops\":$n," "$work/$name.cli" && grep -qF "$want" "$work/$name.cli" && grep -qF "$want" "$work/$name.srv" &&
     grep -q '"peer_disconnected":true' "$work/$name.srv" &&
     { [ "$test" = write_bw ] || grep -q "\"ops\":$n," "$work/$name.srv"; } &&
     python3 -c 'import json,sys; e=json.loads(open(sys.argv[1]).read().splitlines()[-1])["engine"]; sys.exit(0 if e["rx_bytes"] >= int(sys.argv[2]) else 1)' \
       "$work/$name.srv" $((n * size)); then
    echo "ok   $name: $(cat "$work/$name.cli")"; passed=$((passed + 1))
  else
    echo "FAIL $name"; cat "$work/$name.cli" "$work/$name.srv"; fail=$((fail + 1)); wait $spid 2>/dev/null || true
  fi
}

have_tshark=0
if command -v tshark >/dev/null; then
  have_tshark=1
  ip netns exec "$A" tshark -q -i hcmv$$a -s 0 -f "udp port 4791" -w "$work/cm.pcapng" >/dev/null 2>&1 &
  cap_pid=$!
  # tshark writes the file header once it captures; on a loaded machine that takes seconds.
  for ((i = 0; i < 150; i++)); do [ -s "$work/cm.pcapng" ] && break; sleep 0.1; done
  sleep 0.5
fi
run_rping rping_4k 100 4096
run_rping rping_64k 20 65535
run_ucmatose ucmatose 100 4096
run_perftest_cm send_bw_R send_bw 200 65536
run_perftest_cm write_bw_R write_bw 200 65536
if [ -n "$cap_pid" ]; then sleep 0.5; kill -TERM "$cap_pid"; wait "$cap_pid" 2>/dev/null || true; cap_pid=""; fi

if [ $have_tshark -eq 1 ]; then
  # Every MAD (packets to QP1): its attribute, and any expert message (malformed, bad field).
  tshark -r "$work/cm.pcapng" -Y "infiniband.bth.destqp == 1" -T fields -e ip.src -e infiniband.mad.attributeid \
    -e _ws.col.Info -e _ws.expert.message -E separator='|' >"$work/mads.txt" 2>/dev/null || true
  bad=$(grep -ciE 'malformed|exception' "$work/mads.txt" || true)
  attrs=$(awk -F'|' '{print $2}' "$work/mads.txt" | sort -u | tr '\n' ' ')
  echo "tshark: $(wc -l <"$work/mads.txt") CM MADs, attributes: $attrs; $bad with decode errors"
  if [ "$bad" -eq 0 ] && [ "$attrs" = "0x0010 0x0011 0x0013 0x0014 0x0015 0x0016 " ]; then passed=$((passed + 1))
  else echo "FAIL tshark decode of the CM MADs"; cat "$work/mads.txt"; fail=$((fail + 1)); fi
else
  echo "tshark is not installed: CM MADs not decoded"
fi

for ns in "$A" "$B"; do
  ip netns exec "$ns" nft -f - <<'EOF'
table inet hcm_loss {
  chain out { type filter hook output priority 0; udp dport 4791 numgen random mod 100 < 10 counter drop; }
}
EOF
done
run_rping rping_loss 200 4096
run_ucmatose ucmatose_loss 200 4096
run_perftest_cm send_bw_R_loss send_bw 100 65536
run_perftest_cm write_bw_R_loss write_bw 100 65536
dropped=$(for ns in "$A" "$B"; do ip netns exec "$ns" nft list table inet hcm_loss; done | grep -o 'packets [0-9]*' | awk '{s+=$2} END{print s+0}')
echo "nftables dropped $dropped RoCE packets; CM resends: $(grep -ho '"cm_resends":[0-9]*' "$work/rping_loss.cli" "$work/rping_loss.srv" | tr '\n' ' ')"
[ "$dropped" -gt 0 ] || { echo "FAIL nftables dropped nothing"; fail=$((fail + 1)); }

echo "netns CM: $passed passed, $fail failed"
[ $fail -eq 0 ]
