#!/usr/bin/env bash
# Benchmark of the soft RoCEv2 engine between two network namespaces over veth, one core each
# (taskset), with baselines measured in the same run on the same veth:
#   RC RDMA WRITE 64 KiB bandwidth  vs  one TCP stream (iperf3)         target >= 1.0x
#   64 B SEND ping-pong latency      vs  64 B UDP ping-pong              target <= 1.5x
# Prints the figures and ratios, writes JSON (and a PNG plot if gnuplot is present) to $OUT.
#   bench_soft.sh VRDMA_PERF UDP_PINGPONG [OUT_DIR]
set -euo pipefail
PERF=$(readlink -f "$1"); UDP=$(readlink -f "$2"); OUT=${3:-$PWD/bench-out}
mkdir -p "$OUT"
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root for network namespaces"; exit 0; fi
if ! command -v iperf3 >/dev/null; then echo "SKIP: iperf3 is not installed (scripts/setup.sh installs it)"; exit 0; fi
A=bs$$a B=bs$$b IPA=10.234.0.1 IPB=10.234.0.2 SECS=${BENCH_SECONDS:-4}
cleanup() {
  for ns in $A $B; do ip netns pids $ns 2>/dev/null | xargs -r kill 2>/dev/null || true; ip netns del $ns 2>/dev/null || true; done
}
trap cleanup EXIT
. "$(dirname "${BASH_SOURCE[0]}")/../bench_lib.sh"
bench_veth $A $B $IPA $IPB
inA() { ip netns exec $A taskset -c 0 "$@"; }
inB() { ip netns exec $B taskset -c 1 "$@"; }

# TCP baseline: one stream, same duration.
inA iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
sleep 0.5
tcp=$(inB iperf3 -c $IPA -p 5201 -t $SECS -J | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9)')
wait || true
# RDMA WRITE 64 KiB, path MTU 4096.
inA timeout 60 "$PERF" -d soft:$IPA -t write_bw -s 65536 -q 64 -m 4096 -p 18700 >/dev/null &
sleep 0.3
rdma=$(inB timeout 60 "$PERF" -d soft:$IPB -c $IPA -t write_bw -s 65536 -q 64 -m 4096 -D $SECS -p 18700 --json)
wait || true
# UDP ping-pong baseline and SEND ping-pong, 64 B.
inA timeout 60 "$UDP" server $IPA 18800 &
sleep 0.3
udp=$(inB timeout 60 "$UDP" client $IPA 18800 20000)
kill %1 2>/dev/null || true; wait 2>/dev/null || true
inA timeout 60 "$PERF" -d soft:$IPA -t send_lat -s 64 -n 20000 -p 18701 >/dev/null &
sleep 0.3
lat=$(inB timeout 60 "$PERF" -d soft:$IPB -c $IPA -t send_lat -s 64 -n 20000 -p 18701 --json)
wait || true

python3 - "$OUT" "$tcp" "$rdma" "$udp" "$lat" <<'PY'
import json, sys
out, tcp, rdma, udp, lat = sys.argv[1], float(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4]), json.loads(sys.argv[5])
r = {
  "write_bw_64k_gbit": rdma["gbit_per_s"], "tcp_stream_gbit": tcp, "bw_ratio": rdma["gbit_per_s"] / tcp,
  "write_bw_cpu_seconds": rdma["cpu_seconds"], "write_bw_seconds": rdma["seconds"],
  "send_lat_64b_us": lat["lat_us"]["avg"], "send_lat_64b_p50_us": lat["lat_us"]["p50"],
  "udp_pingpong_64b_us": udp["avg_us"], "udp_pingpong_64b_p50_us": udp["p50_us"],
  "lat_ratio": lat["lat_us"]["avg"] / udp["avg_us"], "lat_ratio_p50": lat["lat_us"]["p50"] / udp["p50_us"],
  "targets": {"bw_ratio": ">= 1.0", "lat_ratio": "<= 1.5"},
}
json.dump(r, open(out + "/bench_soft.json", "w"), indent=1)
print(f"RC WRITE 64 KiB: {r['write_bw_64k_gbit']:.2f} Gbit/s vs TCP stream {tcp:.2f} Gbit/s -> ratio {r['bw_ratio']:.2f} (target >= 1.0)")
print(f"SEND 64 B ping-pong: {r['send_lat_64b_us']:.1f} us avg ({r['send_lat_64b_p50_us']:.1f} p50) vs UDP {r['udp_pingpong_64b_us']:.1f} us ({r['udp_pingpong_64b_p50_us']:.1f} p50) -> ratio {r['lat_ratio']:.2f} avg, {r['lat_ratio_p50']:.2f} p50 (target <= 1.5)")
with open(out + "/bench_soft.dat", "w") as f:
    f.write(f"bandwidth {r['bw_ratio']}\nlatency {r['lat_ratio']}\n")
PY
bench_plot bench_soft 'soft engine vs baseline (same veth, same run)' ratio ratio 1 parity
