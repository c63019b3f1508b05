#!/usr/bin/env bash
# Loss benchmark of the soft RoCEv2 engine (issue 23): two network namespaces over veth, nftables
# dropping a share of the RoCE packets in both directions (0.1 %, 1 %, 2 %), vrdma-perf on both
# sides with --verify. For RDMA WRITE, READ and SEND at 64 KiB and 4 MiB, path MTU 1024:
#   wire packets per delivered packet: the data side's packets sent (the client's requests for
#     WRITE and SEND, the server's responses for READ) per packet the transfer needs;
#   goodput as a share of the loss-free figure of the same operation and size, same run.
# Target: <= 1.5 wire packets per delivered packet at 2 % loss. JSON (and a PNG plot if gnuplot
# is present) in $OUT; exits 1 if a run fails or its data does not verify, not on a missed target.
#   bench_loss.sh VRDMA_PERF [OUT_DIR]
set -euo pipefail
PERF=$(readlink -f "$1"); OUT=${2:-$PWD/bench-out}
mkdir -p "$OUT"
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root for network namespaces"; exit 0; fi
if ! command -v nft >/dev/null; then echo "SKIP: nft is not installed (scripts/setup.sh installs nftables)"; exit 0; fi
A=bl$$a B=bl$$b IPA=10.235.0.1 IPB=10.235.0.2 MTU=1024
cleanup() {
  for ns in $A $B; do ip netns pids $ns 2>/dev/null | xargs -r kill 2>/dev/null || true; ip netns del $ns 2>/dev/null || true; done
}
trap cleanup EXIT
ip netns add $A; ip netns add $B
ip link add ${A}v netns $A type veth peer name ${B}v netns $B
ip -n $A addr add $IPA/24 dev ${A}v; ip -n $B addr add $IPB/24 dev ${B}v
ip -n $A link set ${A}v up; ip -n $B link set ${B}v up; ip -n $A link set lo up; ip -n $B link set lo up

# Loss in B, both ways: `numgen random mod 1000 < N` drops N per mille of RoCEv2 packets.
set_loss() {  # per mille
  ip netns exec $B nft delete table inet vrdma_bench_loss 2>/dev/null || true
  [ "$1" -eq 0 ] && return 0
  ip netns exec $B nft -f - <<EOF
table inet vrdma_bench_loss {
  chain in { type filter hook input priority 0; udp dport 4791 numgen random mod 1000 < $1 counter drop; }
  chain out { type filter hook output priority 0; udp dport 4791 numgen random mod 1000 < $1 counter drop; }
}
EOF
}

results="$OUT/bench_loss.runs"
: > "$results"
port=18900
failed=0
run() {  # per mille, test, size, iters
  local pm=$1 t=$2 size=$3 iters=$4 srv cli
  port=$((port + 1))
  set_loss "$pm"
  ip netns exec $A timeout 120 "$PERF" -d soft:$IPA -t "$t" -s "$size" -n "$iters" -m $MTU -p $port --verify --json \
    >"$OUT/srv.json" 2>"$OUT/srv.err" &
  local sp=$!
  sleep 0.3
  if ! cli=$(ip netns exec $B timeout 120 "$PERF" -d soft:$IPB -c $IPA -t "$t" -s "$size" -n "$iters" -m $MTU -p $port \
      --verify --json 2>"$OUT/cli.err") || ! wait $sp; then
    echo "FAIL: $t $size x $iters at $pm per mille:"; cat "$OUT/cli.err" "$OUT/srv.err" >&2
    failed=$((failed + 1)); wait $sp 2>/dev/null || true; return 0
  fi
  srv=$(grep -o '{.*}' "$OUT/srv.json" | tail -1)
  echo "$pm $t $size $iters $cli $srv" | python3 -c '
import json, sys
pm, t, size, iters, rest = sys.stdin.read().split(" ", 4)
dec = json.JSONDecoder()
cli, end = dec.raw_decode(rest)
srv, _ = dec.raw_decode(rest[end:].lstrip())
data_side = srv if t == "read_bw" else cli
print(json.dumps({"per_mille": int(pm), "test": t, "size": int(size), "iters": int(iters),
  "verified": cli.get("verified") is True and srv.get("verified") is True,
  "wire_packets": data_side["engine"]["tx_packets"], "seconds": cli["seconds"],
  "gbit_per_s": cli["gbit_per_s"], "rereads": cli["engine"].get("read_rereads", 0),
  "retransmits": data_side["engine"]["retransmits"]}))' >> "$results"
}

for t in write_bw read_bw send_bw; do
  for size in 65536 4194304; do
    iters=$([ $size -eq 65536 ] && echo 800 || echo 16)
    for pm in 0 1 10 20; do run $pm $t $size $iters; done
  done
done
set_loss 0

python3 - "$OUT" "$MTU" <<'PY'
import json, sys
out, mtu = sys.argv[1], int(sys.argv[2])
runs = [json.loads(l) for l in open(out + "/bench_loss.runs")]
base = {(r["test"], r["size"]): r for r in runs if r["per_mille"] == 0}
rows, bad = [], 0
for r in runs:
    needed = r["iters"] * -(-r["size"] // mtu)
    b = base.get((r["test"], r["size"]))
    row = dict(r, needed_packets=needed, wire_per_delivered=r["wire_packets"] / needed,
               goodput_share=(r["gbit_per_s"] / b["gbit_per_s"]) if b and b["gbit_per_s"] > 0 else None)
    rows.append(row)
    if not r["verified"]:
        bad += 1
miss = [r for r in rows if r["per_mille"] == 20 and r["wire_per_delivered"] > 1.5]
json.dump({"mtu": mtu, "runs": rows, "target": "wire_per_delivered <= 1.5 at 2 % loss",
           "target_met": not miss, "unverified_runs": bad}, open(out + "/bench_loss.json", "w"), indent=1)
print(f"{'test':9} {'size':>8} {'loss':>6} {'wire/needed':>11} {'goodput':>8} {'re-reads':>8}")
for r in rows:
    share = "-" if r["goodput_share"] is None else f"{100 * r['goodput_share']:.0f} %"
    print(f"{r['test']:9} {r['size']:>8} {r['per_mille'] / 10:>5.1f}% {r['wire_per_delivered']:>11.3f} {share:>8} {r['rereads']:>8}")
print("target (<= 1.5 wire packets per delivered packet at 2 % loss):", "met" if not miss else
      "MISSED by " + ", ".join(f"{r['test']} {r['size']}: {r['wire_per_delivered']:.2f}" for r in miss))
with open(out + "/bench_loss.dat", "w") as f:
    for r in rows:
        if r["per_mille"] == 20:
            f.write(f"{r['test']}_{r['size'] // 1024}K {r['wire_per_delivered']}\n")
sys.exit(1 if bad else 0)
PY
status=$?
. "$(dirname "${BASH_SOURCE[0]}")/../bench_lib.sh"
bench_plot bench_loss 'soft engine at 2 % loss: wire packets per delivered packet' '' 'wire/delivered' 1.5 target
[ $failed -eq 0 ] && [ $status -eq 0 ]
