#!/usr/bin/env bash
# Benchmark (issue 25): the two ways a guest reaches the virtio RDMA device, in the same TCG guest
# and the same run, against the same peer (vrdma-perf on a soft engine on the host's bridge):
#   driver  Debian's unmodified perftest (-Q 1: every WRITE signalled, as vrdma-perf does) through virtio_rdma.ko (from its DKMS package, as
#           tests/conformance/vm/kmod_test.sh builds it) and the rdma-core provider (guest/provider)
#   pv      vrdma-perf over libpvverbs' user-space virtio-pci path (pv:pci: pvverbs-bind gives the
#           function to uio_pci_generic, DMA memory from hugepages; --busy-poll as perftest), through
#           the doorbell queue and again through a doorbell ring (bandwidth only)
# Figures (docs/virtio-rdma.md "Which to choose"):
#   RC RDMA WRITE 64 KiB, depth 64: bandwidth driver / pv
#   RC RDMA WRITE 64 B ping-pong: one-way latency (perftest's t_typical, vrdma-perf's p50),
#     driver - pv
#   the CPU cost of a post: the tool's guest CPU time in the kernel per 4 KiB post (its user time
#     is printed too, but both tools busy-poll, so it is their wall time), and vrdmad's host CPU
#     per GiB over the bandwidth runs
#   system calls per post: strace -f -c of the same 4 KiB write_bw at two counts of posts, the
#     difference in calls over the difference in posts (set-up and tear-down cancel out); 0 for
#     both: the provider rings through its doorbell ring and notify page, libpvverbs through the
#     notify BAR, neither through the kernel.
# Under TCG the figures are for correctness and proportion, not for speed. Prints them, writes
# $OUT/bench_kmod.json (and bench_kmod.png when gnuplot is present).
#   bench_kmod.sh SOURCE_DIR VRDMAD VRDMA-PERF PVVERBS-BIND [OUT_DIR]   exits 77 (skip) as kmod_test.sh does
#   KEEP_WORK=1 keeps the logs; BENCH_BW_ITERS (default 10000), BENCH_LAT_ITERS (2000) change the counts.
set -euo pipefail
[ -n "${BENCH_TRACE:-}" ] && set -x
SRC=$(readlink -f "$1"); VRDMAD=$(readlink -f "$2"); PERF=$(readlink -f "$3"); BIND=$(readlink -f "$4")
OUT=${5:-$PWD/bench-out}
mkdir -p "$OUT"
VM=$SRC/tests/conformance/vm
. "$SRC/tests/conformance/serial_lib.sh"  # skip, rig_require, wait_serial, guest_run, vm_rig_cleanup
. "$SRC/tests/bench/bench_lib.sh"
. "$VM/kmod_lib.sh"  # kmod_build, kmod_install, guest_provider, kmod_host, kmod_boot
rig_require
BW_N=${BENCH_BW_ITERS:-10000} LAT_N=${BENCH_LAT_ITERS:-2000} SYS_N1=1000 SYS_N2=3000 CPU_N1=2000 CPU_N2=20000
T0=$(date +%s.%N)
work=$(mktemp -d)
NS=bkm$$
qemu_pid="" cat_pid="" vrdmad_pid=""
trap vm_rig_cleanup EXIT

# ---- The guest: Debian's kernel, virtio_rdma.ko, the provider, perftest, strace, vrdma-perf ----
kmod_guest_more() {
  mkdir -p "$1/usr/bin"
  cp "$PERF" "$1/usr/bin/vrdma-perf"
  cp "$BIND" "$1/usr/bin/pvverbs-bind"
  guest_libs "$1" "$PERF" "$BIND"
}
kmod_guest "$work" "ib_write_bw ib_write_lat strace" uio_pci_generic

# ---- The host: vrdmad's soft engine at the device's address and vrdma-perf's at PERFIP, both on
# br0 (MTU 9000: both engines run path MTU 4096); the guest's NIC on tap0 carries only the tools'
# TCP exchange, on a subnet of its own (the device's address is the guest's, as in kmod_test.sh).
DEVIP=10.77.9.12 GMAC=52:54:00:77:09:0c PERFIP=10.77.9.1 TCPHOST=10.77.19.1 TCPGUEST=10.77.19.2 MTU=4096
kmod_host
ip -n "$NS" addr add $PERFIP/24 dev br0
ip -n "$NS" addr add $TCPHOST/24 dev tap0
ip netns exec "$NS" "$VRDMAD" --socket "$work/vrdma.sock" --engine soft:$DEVIP --mac $GMAC --control "$work/vrdma.ctl" \
  >"$work/vrdmad.log" 2>&1 &
vrdmad_pid=$!
for _ in $(seq 100); do [ -S "$work/vrdma.sock" ] && break; sleep 0.05; done
[ -S "$work/vrdma.sock" ] || { echo "FAIL: vrdmad did not start"; cat "$work/vrdmad.log"; exit 1; }
vcpu() { awk '{print ($14 + $15) / 100}' "/proc/$vrdmad_pid/stat"; }  # vrdmad's utime + stime, seconds

kmod_boot 1G
wait_serial "VRDMA-GUEST-READY" 120 || { echo "FAIL: the guest did not come up"; tail -30 "$work/serial.log"; exit 1; }
echo "guest ready after $(echo "$(date +%s.%N) - $T0" | bc | cut -c1-5) s wall"
guest() { guest_run "$1" "$2" "sh -c '${*:3}'"; }
die() { echo "FAIL: $1"; [ -n "${2:-}" ] && sed 's/^/  /' "$2" | grep -v "===" | tail -40; exit 1; }

# cpu_run SECONDS OUTFILE COMMAND: COMMAND in the guest, then the CPU its children used, in
# seconds, as "CPU <user> <system>" (the shell's cutime and cstime once it has waited for them).
cpu_run() { guest "$1" "$2" "$3; r=\$?; read -r p c s x1 x2 x3 x4 x5 x6 x7 x8 x9 x10 ut st cut cst x < /proc/\$\$/stat; echo CPU \$cut \$cst; exit \$r"; }

# host_perf NAME ARGS...: vrdma-perf serving on the host's soft engine, in the background ($hp).
host_perf() {
  local name=$1; shift
  timeout 120 ip netns exec "$NS" "$PERF" --device soft:$PERFIP --mtu $MTU "$@" >"$work/$name.host" 2>&1 &
  hp=$!
  for _ in $(seq 100); do ip netns exec "$NS" ss -ltn 2>/dev/null | grep -q ':18515 ' && break; sleep 0.1; done
}

# ---- 1. The driver: virtio_rdma binds the carrier; perftest as root on vrdma0 -------------------
IFS=. read -r a b c d <<<"$DEVIP"
WANT_GID=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d")
guest 60 "$work/load.out" "modprobe virtio_rdma; modprobe ib_uverbs; echo clocksource \$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource); ip addr add $TCPGUEST/24 dev eth0; arp -i eth0 -s $PERFIP 02:00:0a:4d:09:01; cd /sys/class/infiniband/vrdma0 && for i in 0 1 2 3; do echo gid \$i \$(cat ports/1/gids/\$i); done" ||
  die "virtio_rdma did not load" "$work/load.out"
G=$(sed -n "s/^gid \([0-9]*\) $WANT_GID\$/\1/p" "$work/load.out" | head -1)
[ -n "$G" ] || die "vrdma0 shows no GID for $DEVIP" "$work/load.out"
PT="-d vrdma0 -x $G -F -m $MTU --report_gbits -Q 1"

host_perf drv_bw --peer-format perftest --test write_bw --size 65536
c0=$(vcpu)
cpu_run 120 "$work/drv_bw.guest" "ib_write_bw $PT -s 65536 -n $BW_N -t 64 $TCPHOST" || die "ib_write_bw failed" "$work/drv_bw.guest"
drv_vcpu=$(echo "$(vcpu) - $c0" | bc)
wait $hp || die "vrdma-perf (perftest peer of ib_write_bw) failed" "$work/drv_bw.host"
# " 65536      10000   peak   average   msgrate": average in Gb/s (--report_gbits).
drv_bw=$(awk -v n="$BW_N" '$1 == 65536 && $2 == n {print $4}' "$work/drv_bw.guest" | tr -d '\r' | tail -1)
[ -n "$drv_bw" ] || die "ib_write_bw printed no result line" "$work/drv_bw.guest"

host_perf drv_lat --peer-format perftest --test write_lat --size 64 --iters "$LAT_N"
guest 120 "$work/drv_lat.guest" "ib_write_lat $PT -s 64 -n $LAT_N $TCPHOST" || die "ib_write_lat failed" "$work/drv_lat.guest"
wait $hp || die "vrdma-perf (perftest peer of ib_write_lat) failed" "$work/drv_lat.host"
# " 64  2000  t_min  t_max  t_typical  t_avg  t_stdev  99%  99.9%" (microseconds, one way)
read -r drv_lat drv_lat_avg < <(awk -v n="$LAT_N" '$1 == 64 && $2 == n {print $5, $6}' "$work/drv_lat.guest" | tr -d '\r' | tail -1) || true
[ -n "${drv_lat:-}" ] || die "ib_write_lat printed no result line" "$work/drv_lat.guest"

# sys_run PATH N OUTFILE COMMAND: N posts of 4 KiB under strace -f -c; sets calls (every system
# call strace counted) and cpu ("user system" seconds without strace: a second run).
for n in $SYS_N1 $SYS_N2; do
  host_perf "drv_sys$n" --peer-format perftest --test write_bw --size 4096
  guest 120 "$work/drv_sys$n.guest" "strace -f -c ib_write_bw $PT -s 4096 -n $n -t 64 $TCPHOST" || die "ib_write_bw under strace failed" "$work/drv_sys$n.guest"
  wait $hp || die "vrdma-perf (peer of ib_write_bw under strace) failed" "$work/drv_sys$n.host"
done
for n in $CPU_N1 $CPU_N2; do
  host_perf "drv_cpu$n" --peer-format perftest --test write_bw --size 4096
  cpu_run 120 "$work/drv_cpu$n.guest" "ib_write_bw $PT -s 4096 -n $n -t 64 $TCPHOST" || die "ib_write_bw failed" "$work/drv_cpu$n.guest"
  wait $hp || die "vrdma-perf (peer of ib_write_bw) failed" "$work/drv_cpu$n.host"
done

# ---- 2. libpvverbs: the function to uio_pci_generic; vrdma-perf over pv:pci ----------------------
guest 60 "$work/bind.out" "rmmod virtio_rdma; modprobe uio_pci_generic; mkdir -p /dev/hugepages; mount -t hugetlbfs none /dev/hugepages; echo 64 > /proc/sys/vm/nr_hugepages; pvverbs-bind" ||
  die "pvverbs-bind failed" "$work/bind.out"
ADDR=$(grep -oE '^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]' "$work/bind.out" | head -1 || true)
[ -n "$ADDR" ] || die "pvverbs-bind printed no PCI address" "$work/bind.out"
PV="-d pv:pci:$ADDR?ram_mib=64 -c $TCPHOST -m $MTU --busy-poll --json"
json_of() { grep -o '{.*}' "$1" | tail -1; }

host_perf pv_bw -t write_bw -s 65536 -q 64
c0=$(vcpu)
cpu_run 120 "$work/pv_bw.guest" "vrdma-perf $PV -t write_bw -s 65536 -q 64 -n $BW_N" || die "vrdma-perf over pv failed" "$work/pv_bw.guest"
pv_vcpu=$(echo "$(vcpu) - $c0" | bc)
wait $hp || die "vrdma-perf (peer of the pv write_bw) failed" "$work/pv_bw.host"
pv_bw=$(json_of "$work/pv_bw.guest")

# The same with a doorbell ring instead of the doorbell queue (the provider's way).
host_perf pv_ring_bw -t write_bw -s 65536 -q 64
c0=$(vcpu)
guest 120 "$work/pv_ring_bw.guest" "vrdma-perf ${PV/ram_mib=64/\"ram_mib=64\&doorbells=ring\"} -t write_bw -s 65536 -q 64 -n $BW_N" ||
  die "vrdma-perf over pv with a doorbell ring failed" "$work/pv_ring_bw.guest"
pv_ring_vcpu=$(echo "$(vcpu) - $c0" | bc)
wait $hp || die "vrdma-perf (peer of the pv write_bw with a doorbell ring) failed" "$work/pv_ring_bw.host"

host_perf pv_lat -t write_lat -s 64 -n "$LAT_N"
guest 120 "$work/pv_lat.guest" "vrdma-perf $PV -t write_lat -s 64 -n $LAT_N" || die "vrdma-perf write_lat over pv failed" "$work/pv_lat.guest"
wait $hp || die "vrdma-perf (peer of the pv write_lat) failed" "$work/pv_lat.host"
pv_lat=$(json_of "$work/pv_lat.guest")

for n in $SYS_N1 $SYS_N2; do
  host_perf "pv_sys$n" -t write_bw -s 4096 -q 64
  guest 120 "$work/pv_sys$n.guest" "strace -f -c vrdma-perf $PV -t write_bw -s 4096 -q 64 -n $n" || die "vrdma-perf under strace failed" "$work/pv_sys$n.guest"
  wait $hp || die "vrdma-perf (peer of the pv run under strace) failed" "$work/pv_sys$n.host"
done
for n in $CPU_N1 $CPU_N2; do
  host_perf "pv_cpu$n" -t write_bw -s 4096 -q 64
  cpu_run 120 "$work/pv_cpu$n.guest" "vrdma-perf $PV -t write_bw -s 4096 -q 64 -n $n" || die "vrdma-perf over pv failed" "$work/pv_cpu$n.guest"
  wait $hp || die "vrdma-perf (peer of the pv run) failed" "$work/pv_cpu$n.host"
done
guest 10 "$work/quit.out" "true" || true

# ---- Figures ---------------------------------------------------------------------------------
python3 - "$OUT" "$work" "$BW_N" "$LAT_N" "$SYS_N1" "$SYS_N2" "$CPU_N1" "$CPU_N2" "$drv_bw" "$drv_lat" "$drv_lat_avg" \
  "$drv_vcpu" "$pv_vcpu" "$pv_ring_vcpu" <<'PY'
import json, re, sys
a = sys.argv[1:]
out, work = a[0], a[1]
bw_n, lat_n, n1, n2, c1, c2 = (int(x) for x in a[2:8])
drv_bw, drv_lat, drv_lat_avg, drv_vcpu, pv_vcpu, pv_ring_vcpu = (float(x) for x in a[8:14])
def text(name): return open(f"{work}/{name}.guest", errors="replace").read().replace("\r", "")
def fail(why): sys.exit(f"FAIL: {why}")
def syscalls(name):  # strace -c's table: {syscall: calls}
    t = {}
    for l in text(name).splitlines():
        f = l.split()
        if len(f) >= 5 and re.fullmatch(r"[0-9.]+", f[0]) and f[3].isdigit(): t[f[-1]] = int(f[3])
    if "total" not in t: fail(f"strace -c printed no table in {name}")
    return t
def cpu(name):  # "CPU <user ticks> <system ticks>" (USER_HZ 100)
    m = re.search(r"^CPU ([0-9]+) ([0-9]+)$", text(name), re.M)
    if not m: fail(f"no CPU time from the guest in {name}")
    return int(m[1]) / 100, int(m[2]) / 100
def json_of(name):
    lines = [l for l in text(name).splitlines() if l.startswith("{")]
    if not lines: fail(f"vrdma-perf printed no JSON in {name}")
    return json.loads(lines[-1])
# Clock reads are system calls in this guest only (its clocksource, below, has no vDSO path under
# TCG); on hardware they never enter the kernel. Counted apart.
CLOCK = {"gettimeofday", "clock_gettime", "clock_gettime64", "time"}
clocksource = re.search(r"^clocksource (\S+)", open(f"{work}/load.out").read(), re.M)
def per_post(path):
    t1, t2 = syscalls(f"{path}_sys{n1}"), syscalls(f"{path}_sys{n2}")
    other = lambda t: t["total"] - sum(v for k, v in t.items() if k in CLOCK)
    (u1, s1), (u2, s2) = cpu(f"{path}_cpu{c1}"), cpu(f"{path}_cpu{c2}")
    return {"syscalls": {n1: t1["total"], n2: t2["total"]},
            "clock_reads": {n1: t1["total"] - other(t1), n2: t2["total"] - other(t2)},
            "syscalls_per_post_but_clock": (other(t2) - other(t1)) / (n2 - n1),
            "syscalls_per_post_all": (t2["total"] - t1["total"]) / (n2 - n1),
            "guest_cpu_s": {c1: [u1, s1], c2: [u2, s2]},
            "guest_cpu_us_per_post": ((u2 + s2) - (u1 + s1)) * 1e6 / (c2 - c1),
            "guest_kernel_cpu_us_per_post": (s2 - s1) * 1e6 / (c2 - c1)}
pv_bw, pv_lat, pv_ring_bw = json_of("pv_bw"), json_of("pv_lat"), json_of("pv_ring_bw")
gib = bw_n * 65536 / 2**30
r = {
  "guest": "QEMU 7.2 TCG, 1 vCPU, clocksource " + (clocksource[1] if clocksource else "?") +
           " (figures for correctness and proportion only)",
  "write_bw_64k": {"iters": bw_n, "depth": 64, "driver_gbit": drv_bw, "pv_gbit": pv_bw["gbit_per_s"],
                   "ratio_driver_over_pv": drv_bw / pv_bw["gbit_per_s"], "pv_doorbell_ring_gbit": pv_ring_bw["gbit_per_s"],
                   "vrdmad_cpu_s_per_gib": {"driver": drv_vcpu / gib, "pv": pv_vcpu / gib, "pv_doorbell_ring": pv_ring_vcpu / gib}},
  "write_lat_64b_one_way_us": {"iters": lat_n, "driver_typical": drv_lat, "driver_avg": drv_lat_avg,
                               "pv_p50": pv_lat["lat_us"]["p50"], "pv_avg": pv_lat["lat_us"]["avg"],
                               "added_by_driver_us": drv_lat - pv_lat["lat_us"]["p50"]},
  "post_4k": {"driver": per_post("drv"), "pv": per_post("pv"),
              "how": f"differences between {n1} and {n2} posts (system calls, strace -f -c) and between {c1} and {c2} "
                     "posts (the tool's guest CPU, without strace): set-up and tear-down cancel out"},
}
r["targets"] = {"syscalls_per_post_but_clock": "< 0.5 on both paths (checked: a call per post would be 1)", "ratio_driver_over_pv": ">= 0.9 (printed)"}
d, p = r["post_4k"]["driver"]["guest_cpu_us_per_post"], r["post_4k"]["pv"]["guest_cpu_us_per_post"]
r["cpu_per_post_ratio_driver_over_pv"] = d / p if p > 0 else None
json.dump(r, open(out + "/bench_kmod.json", "w"), indent=1)
b, l = r["write_bw_64k"], r["write_lat_64b_one_way_us"]
print(r["guest"])
print(f"RC WRITE 64 KiB x {bw_n}, depth 64: driver (ib_write_bw) {b['driver_gbit']:.2f} Gbit/s, pv (vrdma-perf) {b['pv_gbit']:.2f} Gbit/s -> driver/pv {b['ratio_driver_over_pv']:.2f}; pv with a doorbell ring {b['pv_doorbell_ring_gbit']:.2f} Gbit/s")
v = b["vrdmad_cpu_s_per_gib"]
print(f"vrdmad's host CPU per GiB written: driver {v['driver']:.3f} s, pv {v['pv']:.3f} s, pv with a doorbell ring {v['pv_doorbell_ring']:.3f} s")
print(f"RC WRITE 64 B ping-pong, one way: driver {l['driver_typical']:.1f} us typical ({l['driver_avg']:.1f} avg), pv {l['pv_p50']:.1f} us p50 ({l['pv_avg']:.1f} avg) -> added by the driver {l['added_by_driver_us']:+.1f} us")
for k in ("driver", "pv"):
    c = r["post_4k"][k]
    print(f"{k}, a 4 KiB WRITE post: {c['guest_kernel_cpu_us_per_post']:.1f} us of guest kernel CPU (all CPU, busy polling included: {c['guest_cpu_us_per_post']:.1f} us); "
          f"system calls {c['syscalls'][n1]} for {n1} posts, {c['syscalls'][n2]} for {n2} ({c['clock_reads'][n1]} and {c['clock_reads'][n2]} of them clock reads) "
          f"-> {c['syscalls_per_post_but_clock']:.3f} per post")
over = [k for k in ("driver", "pv") if r["post_4k"][k]["syscalls_per_post_but_clock"] >= 0.5]
if over: fail("a post costs a system call on " + " and ".join(over) + " (target < 0.5 per post): see the strace tables in the logs")
with open(out + "/bench_kmod.dat", "w") as f:
    f.write(f"bandwidth {b['ratio_driver_over_pv']}\nlatency {drv_lat / pv_lat['lat_us']['p50']}\n")
    if r["cpu_per_post_ratio_driver_over_pv"] is not None: f.write(f"cpu_per_post {r['cpu_per_post_ratio_driver_over_pv']}\n")
PY
bench_plot bench_kmod 'kernel driver + provider vs libpvverbs, same TCG guest' 'driver / pv' ratio 1 parity
echo "bench_kmod: $(echo "$(date +%s.%N) - $T0" | bc | cut -c1-5) s wall"
