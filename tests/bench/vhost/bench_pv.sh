#!/usr/bin/env bash
# Benchmark of paravirtual verbs: vrdma-perf over `pv` (libpvverbs -> vrdmad -> soft engine)
# against the same test over `soft` directly, same run, same veth, same peer (a soft engine in
# the other namespace). Host A's side is pinned to core 0 in both runs (application, engine and,
# for pv, vrdmad), the peer to core 1.
#   RC RDMA WRITE 64 KiB bandwidth: pv / soft                         target >= 0.9x
#   64 B SEND ping-pong latency: pv - soft (one-way, p50)             target < 5 us
#   host CPU seconds per GiB moved on host A (application + vrdmad)
#   the same pv rounds with libpvverbs ringing through a doorbell ring (the way a process rings
#   under the guest kernel driver, docs/virtio-rdma.md "Doorbell rings"): ring / queue
# Prints the figures and ratios, writes JSON (and a PNG plot if gnuplot is present) to $OUT.
#   bench_pv.sh VRDMA_PERF VRDMAD [OUT_DIR]
set -euo pipefail
[ -n "${BENCH_TRACE:-}" ] && set -x
PERF=$(readlink -f "$1"); VRDMAD=$(readlink -f "$2"); OUT=${3:-$PWD/bench-out}
mkdir -p "$OUT"
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root for network namespaces"; exit 0; fi
A=bp$$a B=bp$$b IPA=10.238.0.1 IPB=10.238.0.2 SECS=${BENCH_SECONDS:-4} ITERS=${BENCH_LAT_ITERS:-20000}
TMP=$(mktemp -d)
cleanup() {
  for ns in $A $B; do ip netns pids $ns 2>/dev/null | xargs -r kill 2>/dev/null || true; ip netns del $ns 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT
. "$(dirname "${BASH_SOURCE[0]}")/../bench_lib.sh"
bench_veth $A $B $IPA $IPB
inA() { ip netns exec $A taskset -c 0 "$@"; }
inB() { ip netns exec $B taskset -c 1 "$@"; }
cpu_of() { awk '{print ($14 + $15) / 100}' /proc/$1/stat; }  # utime + stime in seconds (USER_HZ 100)

# One measurement: run_test PORT TEST DEVICE SIZE "SERVER ARGS" CLIENT ARGS... prints the client's JSON.
run_test() {
  local port=$1 test=$2 dev=$3 size=$4 sargs=$5; shift 5
  # shellcheck disable=SC2086
  inB timeout 120 "$PERF" -d soft:$IPB -t "$test" -s "$size" -m 4096 -p "$port" $sargs >/dev/null 2>"$TMP/server.err" &
  sleep 0.3
  inA timeout 120 "$PERF" -d "$dev" -c $IPB -t "$test" -s "$size" -m 4096 -p "$port" --json "$@"
  wait || true
}

# Baseline: soft directly.
soft_bw=$(run_test 18901 write_bw soft:$IPA 65536 "-q 64" -q 64 -D $SECS)
soft_lat=$(run_test 18902 send_lat soft:$IPA 64 "-n $ITERS" -n $ITERS)

# pv: vrdmad on host A with the soft engine on A's address. pv_round NAME PORT [vrdmad args]
# sets NAME_bw, NAME_lat and NAME_cpu (vrdmad's CPU seconds over the bandwidth run). PV_OPTS:
# more pv device options.
pv_round() {
  local name=$1 port=$2 vpid c0 c1 bw lat dev; shift 2
  inA "$VRDMAD" --socket "$TMP/$name.sock" --engine soft:$IPA --control "$TMP/$name.ctl" "$@" 2>"$TMP/$name.log" &
  for _ in $(seq 50); do [ -S "$TMP/$name.ctl" ] && break; sleep 0.1; done
  vpid=$(pgrep -f "vrdmad --socket $TMP/$name.sock" | head -1)
  c0=$(cpu_of "$vpid")
  dev="pv:$TMP/$name.sock?ram_mib=64${PV_OPTS:-}"
  bw=$(run_test "$port" write_bw "$dev" 65536 "-q 64" -q 64 -D $SECS)
  c1=$(cpu_of "$vpid")
  lat=$(run_test $((port + 1)) send_lat "$dev" 64 "-n $ITERS" -n $ITERS)
  kill "$vpid"; wait "$vpid" 2>/dev/null || true
  printf -v "${name}_bw" '%s' "$bw"; printf -v "${name}_lat" '%s' "$lat"
  printf -v "${name}_cpu" '%s' "$(python3 -c "print($c1 - $c0)")"
}
pv_round pv 18903
# The same device with vrdmad polling (--poll-us 200): no kicks waited for, no engine thread hop.
pv_round poll 18905 --poll-us 200
# Both again with a doorbell ring instead of the doorbell queue.
PV_OPTS="&doorbells=ring" pv_round ring 18907
PV_OPTS="&doorbells=ring" pv_round ringpoll 18909 --poll-us 200

python3 - "$OUT" "$soft_bw" "$soft_lat" "$pv_bw" "$pv_lat" "$pv_cpu" "$poll_bw" "$poll_lat" "$poll_cpu" \
  "$ring_bw" "$ring_lat" "$ring_cpu" "$ringpoll_bw" "$ringpoll_lat" "$ringpoll_cpu" <<'PY'
import json, sys
out = sys.argv[1]
sb, sl, pb, pl = (json.loads(a) for a in sys.argv[2:6])
vrdmad_cpu = float(sys.argv[6])
qb, ql = json.loads(sys.argv[7]), json.loads(sys.argv[8])
poll_cpu = float(sys.argv[9])
rb, rl, ring_cpu = json.loads(sys.argv[10]), json.loads(sys.argv[11]), float(sys.argv[12])
rqb, rql, ringpoll_cpu = json.loads(sys.argv[13]), json.loads(sys.argv[14]), float(sys.argv[15])
gib = lambda r: r["gbit_per_s"] * 1e9 * r["seconds"] / 8 / 2**30
r = {
  "soft_write_bw_64k_gbit": sb["gbit_per_s"], "pv_write_bw_64k_gbit": pb["gbit_per_s"],
  "bw_ratio": pb["gbit_per_s"] / sb["gbit_per_s"],
  "soft_send_lat_64b_p50_us": sl["lat_us"]["p50"], "pv_send_lat_64b_p50_us": pl["lat_us"]["p50"],
  "soft_send_lat_64b_avg_us": sl["lat_us"]["avg"], "pv_send_lat_64b_avg_us": pl["lat_us"]["avg"],
  "added_latency_p50_us": pl["lat_us"]["p50"] - sl["lat_us"]["p50"],
  "added_latency_avg_us": pl["lat_us"]["avg"] - sl["lat_us"]["avg"],
  "soft_cpu_s_per_gib": sb["cpu_seconds"] / gib(sb),
  "pv_cpu_s_per_gib": (pb["cpu_seconds"] + vrdmad_cpu) / gib(pb),
  "pv_vrdmad_cpu_s": vrdmad_cpu, "pv_app_cpu_s": pb["cpu_seconds"],
  "polling": {"vrdmad_args": "--poll-us 200", "pv_write_bw_64k_gbit": qb["gbit_per_s"],
              "bw_ratio": qb["gbit_per_s"] / sb["gbit_per_s"], "pv_send_lat_64b_p50_us": ql["lat_us"]["p50"],
              "added_latency_p50_us": ql["lat_us"]["p50"] - sl["lat_us"]["p50"],
              "added_latency_avg_us": ql["lat_us"]["avg"] - sl["lat_us"]["avg"],
              "pv_cpu_s_per_gib": (qb["cpu_seconds"] + poll_cpu) / gib(qb)},
  "targets": {"bw_ratio": ">= 0.9", "added_latency_p50_us": "< 5"},
}
def vs_queue(b, l, cpu, qb_, ql_, qcpu):
  return {"pv_write_bw_64k_gbit": b["gbit_per_s"], "bw_ratio_vs_queue": b["gbit_per_s"] / qb_["gbit_per_s"],
          "pv_send_lat_64b_p50_us": l["lat_us"]["p50"], "lat_p50_minus_queue_us": l["lat_us"]["p50"] - ql_["lat_us"]["p50"],
          "pv_cpu_s_per_gib": (b["cpu_seconds"] + cpu) / gib(b),
          "cpu_per_gib_ratio_vs_queue": ((b["cpu_seconds"] + cpu) / gib(b)) / ((qb_["cpu_seconds"] + qcpu) / gib(qb_))}
r["doorbell_ring"] = {"sleeping": vs_queue(rb, rl, ring_cpu, pb, pl, vrdmad_cpu),
                      "polling": vs_queue(rqb, rql, ringpoll_cpu, qb, ql, poll_cpu)}
json.dump(r, open(out + "/bench_pv.json", "w"), indent=1)
print("vrdmad sleeping on the guest's kicks (no --poll-us; for idle guests):")
print(f"RC WRITE 64 KiB: pv {r['pv_write_bw_64k_gbit']:.2f} Gbit/s vs soft {r['soft_write_bw_64k_gbit']:.2f} Gbit/s -> ratio {r['bw_ratio']:.2f} (target >= 0.9)")
print(f"SEND 64 B ping-pong (one-way): pv {r['pv_send_lat_64b_p50_us']:.1f} us p50 vs soft {r['soft_send_lat_64b_p50_us']:.1f} us -> added {r['added_latency_p50_us']:.1f} us p50, {r['added_latency_avg_us']:.1f} us avg (target < 5)")
print(f"host CPU per GiB written: pv {r['pv_cpu_s_per_gib']:.2f} s (app {r['pv_app_cpu_s']:.2f} s + vrdmad {vrdmad_cpu:.2f} s) vs soft {r['soft_cpu_s_per_gib']:.2f} s")
q = r["polling"]
print(f"vrdmad --poll-us 200 (the latency mode): WRITE pv {q['pv_write_bw_64k_gbit']:.2f} Gbit/s -> ratio {q['bw_ratio']:.2f} (target >= 0.9); SEND 64 B p50 {q['pv_send_lat_64b_p50_us']:.1f} us -> added {q['added_latency_p50_us']:.1f} us p50, {q['added_latency_avg_us']:.1f} us avg (target < 5); CPU per GiB {q['pv_cpu_s_per_gib']:.2f} s")
for mode, d in r["doorbell_ring"].items():
  print(f"doorbell ring instead of the doorbell queue, vrdmad {mode}: WRITE {d['pv_write_bw_64k_gbit']:.2f} Gbit/s -> {d['bw_ratio_vs_queue']:.2f}x the queue's; SEND 64 B p50 {d['pv_send_lat_64b_p50_us']:.1f} us ({d['lat_p50_minus_queue_us']:+.1f} us); CPU per GiB {d['cpu_per_gib_ratio_vs_queue']:.2f}x")
with open(out + "/bench_pv.dat", "w") as f:
    f.write(f"bandwidth {r['bw_ratio']}\ncpu_per_GiB {r['pv_cpu_s_per_gib'] / r['soft_cpu_s_per_gib']}\n")
    d = r["doorbell_ring"]["sleeping"]
    f.write(f"ring_bandwidth {d['pv_write_bw_64k_gbit'] / r['soft_write_bw_64k_gbit']}\n"
            f"ring_cpu_per_GiB {d['pv_cpu_s_per_gib'] / r['soft_cpu_s_per_gib']}\n")
PY
bench_plot bench_pv 'pv over vrdmad vs soft directly (same run)' 'pv / soft' ratio 1 parity
