#!/bin/sh
# /init of the kernel-driver guest (kmod_test.sh, bench_kmod.sh, vm_libvirt_kmod_test.sh): loads
# virtio_pci and virtio_net only (no virtio_blk: virtio_rdma.ko is to find the carrier
# unclaimed), brings eth0 up with
# vrdma.ip=ADDR/24 (the device's RDMA address: the guest owns it), then runs the host's commands
# as guest_init.sh does: "STEP <n> <shell command>" lines on the console, answered by
# "=== BEGIN <n>", the output and "=== END <n> rc=<status>"; "QUIT" powers off.
. /steps.sh
init_guest virtio_pci virtio_net
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^$1=//p" | tail -1; }
IP=$(arg vrdma.ip)
ip link set lo up
ip link set eth0 up
[ -n "$IP" ] && ip addr add "$IP/24" dev eth0
stty -echo 2>/dev/null
echo "VRDMA-GUEST-READY ip=$IP uptime=$(cut -d' ' -f1 /proc/uptime)"

# vrdma.cases=TOOL/SIZE/ITERS,... (a guest whose console is only a log, under libvirt): loads
# virtio_rdma, ib_uverbs and rdma_ucm, adds vrdma.tcp=ADDR/LEN to eth0 (the tools' TCP exchange;
# vrdma.tcp_via=GW routes vrdma.peer through GW),
# answers the RDMA peers vrdma.rdma_peer=IP[+IP...] at vrdma.rdma_mac=MAC (static neighbours:
# the device routes by IP), waits for vrdma0's port, then runs each case, within vrdma.timeout
# seconds (default 120):
#   perftest's TOOL  unmodified, as the unprivileged user vrdma: TOOL -d vrdma0 on the RoCEv2 GID
#                    of the device's address, -F -s SIZE -n ITERS, case i against vrdma.peer=IP
#                    on TCP port vrdma.port+i (default 18600)
#   TOOL+R           perftest's TOOL -R: connected through RDMA-CM to RDMA_PEER (the first of
#                    vrdma.rdma_peer), its port vrdma.port+i
#   TOOL+D           perftest's TOOL -D ITERS: for ITERS seconds (its result line names the
#                    messages it moved)
#   ibv_*_pingpong   as vrdma: -d vrdma0 -g GID -s SIZE -n ITERS -c (every byte checked), TCP
#                    exchange as perftest's
#   rping            as vrdma: rping -c -a RDMA_PEER -C ITERS -S SIZE -V -p vrdma.port+i, RDMA-CM
#   ucmatose         as vrdma: ucmatose -s RDMA_PEER -C ITERS -S SIZE -p vrdma.port+i, RDMA-CM
#   ucx_TEST         as vrdma: UCX's ucx_perftest -t TEST -s SIZE -n ITERS against vrdma.peer on
#                    TCP port vrdma.port+i, over rc_verbs on vrdma0 (wired up through ud_verbs),
#                    locked memory unlimited (UCX's pools)
#   nvme             as root: NVMe over Fabrics to the guest's own target (or to the nvmet-rdma
#                    subsystem vrdma-nvme at vrdma.nvme_target=IP), SIZE MiB a round for ITERS
#                    seconds of rounds (run_nvme; the last round's MD5 as "VRDMA-NVME-LAST")
# and prints "VRDMA-CASE <i> <tool> rc=<status> <result> t=<seconds>s" (perftest: its result
# line; pingpong: "BYTES bytes in"; rping: "SIZE ITERS verified"; ucmatose: "SIZE ITERS complete";
# nvme: "SIZE ROUNDS verified"), "VRDMA-GUEST-DONE" at the
# end. vrdma.parallel=1 runs the cases at once (printing "VRDMA-CASES-STARTED <n>" when they all
# are) instead of one after another. vrdma.role=server makes every case a server, at once:
# perftest and pingpong without a peer (the peer's client connects to TCP port vrdma.port+i),
# rping -s, ucmatose and TOOL+R listening through RDMA-CM on the device's address, port
# vrdma.port+i. vrdma.mtu=BYTES adds perftest's and RC pingpong's -m.
CASES=$(arg vrdma.cases)
if [ -n "$CASES" ]; then
  modprobe virtio_rdma || echo "guest: modprobe virtio_rdma failed"
  modprobe ib_uverbs
  modprobe rdma_ucm 2>/dev/null
  ip addr add "$(arg vrdma.tcp)" dev eth0
  [ -z "$(arg vrdma.tcp_via)" ] || ip route add "$(arg vrdma.peer)" via "$(arg vrdma.tcp_via)"
  for p in $(arg vrdma.rdma_peer | tr '+' ' '); do arp -i eth0 -s "$p" "$(arg vrdma.rdma_mac)"; done
  for _ in $(seq 300); do grep -q ACTIVE /sys/class/infiniband/vrdma0/ports/1/state 2>/dev/null && break; sleep 0.1; done
  echo "VRDMA-PORT $(cat /sys/class/infiniband/vrdma0/ports/1/state 2>&1)"
  dmesg | grep -E "virtio_rdma.*(state queue|state area)" | sed 's/^/VRDMA-DMESG /'
  want=$(echo "$IP" | awk -F. '{printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1, $2, $3, $4}')
  G=1
  for i in $(seq 0 15); do [ "$(cat /sys/class/infiniband/vrdma0/ports/1/gids/$i 2>/dev/null)" = "$want" ] && G=$i && break; done
  echo "root:x:0:0::/:/bin/sh" > /etc/passwd; echo "vrdma:x:1000:1000::/tmp:/bin/sh" >> /etc/passwd
  PEER=$(arg vrdma.peer); PORT=$(arg vrdma.port); PORT=${PORT:-18600}; TMO=$(arg vrdma.timeout); TMO=${TMO:-120}
  ROLE=$(arg vrdma.role) MTU=$(arg vrdma.mtu) PAR=$(arg vrdma.parallel)
  # UCX: its shared-memory pools want /dev/shm, its 8 MiB registration pools locked memory.
  # UCX 1.18 (Debian 13): a weak fence (its strong one wants a flush rkey, mlx5's), and stdin a
  # terminal (/dev/ptmx; with stdin not a tty ucx_perftest takes itself for an MPI job).
  UCX_ENV="UCX_NET_DEVICES=vrdma0:1 UCX_TLS=rc_verbs,ud_verbs,self UCX_FENCE_MODE=weak UCX_WARN_UNUSED_ENV_VARS=n UCX_RC_VERBS_RX_QUEUE_LEN=256 UCX_RC_VERBS_TX_QUEUE_LEN=256 UCX_UD_VERBS_RX_QUEUE_LEN=256 UCX_UD_VERBS_TX_QUEUE_LEN=128"
  case $CASES in *ucx_*) mkdir -p /dev/shm /dev/pts; mount -t tmpfs none /dev/shm 2>/dev/null; mount -t devpts devpts /dev/pts 2>/dev/null; chmod 1777 /dev/shm; ulimit -l unlimited ;; esac
  [ "$ROLE" = server ] && PAR=1
  # nvme/MIB/SECONDS: NVMe over Fabrics on the kernel's verbs: the guest's nvmet-rdma target (a
  # file namespace) on the device's address, Debian's nvme connect -t rdma to it, then rounds of
  # MIB MiB of random data written with O_DIRECT and read back until SECONDS have passed; a
  # round whose data differs fails; then nvme disconnect.
  run_nvme() {  # MIB SECONDS
    T=$(arg vrdma.nvme_target)
    if [ -z "$T" ]; then T=$IP; nvmet-target "$IP" $(($1 * 2)) || return 1; fi
    modprobe nvme-rdma && timeout 90 nvme connect -t rdma -a "$T" -s 4420 -n vrdma-nvme \
      --hostnqn=nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000a11c --hostid=00000000-0000-0000-0000-00000000a11c || return 1
    for _ in $(seq 100); do [ -b /dev/nvme0n1 ] && break; sleep 0.1; done
    end=$(($(date +%s) + $2)) rounds=0
    while [ "$(date +%s)" -lt $end ]; do
      dd if=/dev/urandom of=/tmp/pat bs=64k count=$(($1 * 16)) 2>/dev/null &&
        timeout 120 dd if=/tmp/pat of=/dev/nvme0n1 bs=64k oflag=direct 2>/dev/null &&
        timeout 120 dd if=/dev/nvme0n1 of=/tmp/back bs=64k count=$(($1 * 16)) iflag=direct 2>/dev/null || return 2
      cmp -s /tmp/pat /tmp/back || { echo "round $rounds: the data read back differs"; return 3; }
      rounds=$((rounds + 1))
    done
    timeout 60 nvme disconnect -n vrdma-nvme || return 4
    echo "NVME-ROUNDS $rounds"
    echo "VRDMA-NVME-LAST $(md5sum < /tmp/pat | cut -c1-32)" > /dev/console
  }
  run_case() {  # I TOOL SIZE ITERS
    t0=$(date +%s)
    if [ "$2" = nvme ]; then
      run_nvme "$3" "$4" > /tmp/case$1.out 2>&1
      rc=$?
      echo $rc >> /tmp/rcs
      echo "VRDMA-CASE $1 nvme rc=$rc $3 $(sed -n 's/^NVME-ROUNDS //p' /tmp/case$1.out) verified t=$(($(date +%s) - t0))s"
      [ $rc = 0 ] || tail -15 /tmp/case$1.out
      return
    fi
    # A client's peer: the TCP exchange's (vrdma.peer), or RDMA-CM's (the first RDMA peer).
    P=$((PORT + $1)) RP=$(arg vrdma.rdma_peer | cut -d+ -f1) to=$PEER
    case $2 in
      rping)
        cmd="rping -s -a $IP -C $4 -S $3 -V -p $P"
        [ "$ROLE" = server ] || cmd="rping -c -a $RP -I $IP -C $4 -S $3 -V -p $P" to="" ;;
      ucmatose) cmd="ucmatose -b $IP -C $4 -S $3 -p $P" to=${RP:+-s $RP} ;;
      ucx_*) cmd="env $UCX_ENV ucx_perftest -t ${2#ucx_} -s $3 -n $4 -p $P < /dev/ptmx" ;;
      ibv_ud_pingpong) cmd="$2 -d vrdma0 -g $G -s $3 -n $4 -p $P -c" ;;  # UD: the port's MTU
      ibv_*_pingpong) cmd="$2 -d vrdma0 -g $G -s $3 -n $4 -p $P -c${MTU:+ -m $MTU}" ;;
      *+R) cmd="${2%+R} -R -d vrdma0 -x $G -F -s $3 -n $4 -p $P" to=$RP ;;
      *+D) cmd="${2%+D} -d vrdma0 -x $G -F -s $3 -D $4 -p $P${MTU:+ -m $MTU}" ;;
      *) cmd="$2 -d vrdma0 -x $G -F -s $3 -n $4 -p $P${MTU:+ -m $MTU}" ;;
    esac
    [ "$ROLE" = server ] || cmd="$cmd $to"
    su -s /bin/sh vrdma -c "id; timeout $TMO $cmd" > /tmp/case$1.out 2>&1
    rc=$?
    grep -q '^uid=1000(vrdma)' /tmp/case$1.out || rc=99
    case $2 in
      rping) res=$([ $rc = 0 ] && echo "$3 $4 verified") ;;
      ucmatose) res=$(grep -q '^test complete' /tmp/case$1.out && echo "$3 $4 complete") ;;
      ucx_*) res=$(grep -E "^Final: +$4 " /tmp/case$1.out | tr -s ' ') ;;
      ibv_*_pingpong) res=$(grep -E "^[0-9]+ bytes in " /tmp/case$1.out | cut -d' ' -f1-3) ;;
      *+D) res=$(grep -E "^ *$3 +[0-9]+ " /tmp/case$1.out | tr -s ' ') ;;
      *) res=$(grep -E "^ *$3 +$4 " /tmp/case$1.out | tr -s ' ') ;;
    esac
    echo "VRDMA-CASE $1 $2 rc=$rc $res t=$(($(date +%s) - t0))s"
    echo $rc >> /tmp/rcs
    [ $rc = 0 ] || tail -15 /tmp/case$1.out
  }
  i=0
  for c in $(echo "$CASES" | tr ',' ' '); do
    i=$((i + 1))
    IFS=/ read -r tool size iters <<EOF
$c
EOF
    if [ "$PAR" = 1 ]; then run_case $i "$tool" "$size" "$iters" & else run_case $i "$tool" "$size" "$iters"; fi
  done
  # Servers: STARTED once every perftest server listens on its TCP port and rping's RDMA-CM
  # listener is up (rdma res: its cm_id in state LISTEN), within 60 s.
  if [ "$ROLE" = server ]; then
    for _ in $(seq 600); do
      up=1 j=0
      for c in $(echo "$CASES" | tr ',' ' '); do
        j=$((j + 1))
        case $c in
          rping/* | ucmatose/* | *+R/*) rdma res show cm_id 2>/dev/null | grep LISTEN | grep -q -E ":$((PORT + j))( |\$)" || up=0 ;;
          *) netstat -ltn 2>/dev/null | grep -q ":$((PORT + j)) " || up=0 ;;
        esac
      done
      [ $up = 1 ] && break
      sleep 0.1
    done
  fi
  [ "$PAR" = 1 ] && sleep 1 && echo "VRDMA-CASES-STARTED $i"
  wait
  # A case failed: the kernel's last words on RDMA, for whoever reads the console.
  grep -q -v '^0$' /tmp/rcs 2>/dev/null && dmesg | grep -i -E "rdma|infiniband|ib_cm|nvme" | tail -8
  echo "VRDMA-GUEST-DONE"
  poweroff -f
fi
serve_steps
