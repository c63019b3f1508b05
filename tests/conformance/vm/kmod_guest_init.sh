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
# virtio_rdma and ib_uverbs, adds vrdma.tcp=ADDR/LEN to eth0 (the tools' TCP exchange), answers
# the RDMA peer vrdma.rdma_peer=IP at vrdma.rdma_mac=MAC (a static neighbour: the device routes by
# IP), waits for vrdma0's port, then runs each case as the unprivileged user vrdma: perftest's
# unmodified TOOL -d vrdma0 on the RoCEv2 GID of the device's address, -F -s SIZE -n ITERS, case i
# against vrdma.peer=IP on TCP port vrdma.port+i (default 18600), and prints
# "VRDMA-CASE <i> <tool> rc=<status> <its result line>"; "VRDMA-GUEST-DONE" at the end.
CASES=$(arg vrdma.cases)
if [ -n "$CASES" ]; then
  modprobe virtio_rdma || echo "guest: modprobe virtio_rdma failed"
  modprobe ib_uverbs
  ip addr add "$(arg vrdma.tcp)" dev eth0
  arp -i eth0 -s "$(arg vrdma.rdma_peer)" "$(arg vrdma.rdma_mac)"
  for _ in $(seq 300); do grep -q ACTIVE /sys/class/infiniband/vrdma0/ports/1/state 2>/dev/null && break; sleep 0.1; done
  echo "VRDMA-PORT $(cat /sys/class/infiniband/vrdma0/ports/1/state 2>&1)"
  want=$(echo "$IP" | awk -F. '{printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1, $2, $3, $4}')
  G=1
  for i in $(seq 0 15); do [ "$(cat /sys/class/infiniband/vrdma0/ports/1/gids/$i 2>/dev/null)" = "$want" ] && G=$i && break; done
  echo "root:x:0:0::/:/bin/sh" > /etc/passwd; echo "vrdma:x:1000:1000::/tmp:/bin/sh" >> /etc/passwd
  PEER=$(arg vrdma.peer); PORT=$(arg vrdma.port); PORT=${PORT:-18600}
  i=0
  for c in $(echo "$CASES" | tr ',' ' '); do
    i=$((i + 1))
    IFS=/ read -r tool size iters <<EOF
$c
EOF
    su -s /bin/sh vrdma -c "id; timeout 120 $tool -d vrdma0 -x $G -F -s $size -n $iters -p $((PORT + i)) $PEER" > /tmp/case$i.out 2>&1
    rc=$?
    grep -q '^uid=1000(vrdma)' /tmp/case$i.out || rc=99
    echo "VRDMA-CASE $i $tool rc=$rc $(grep -E "^ *$size +$iters " /tmp/case$i.out | tr -s ' ')"
    [ $rc = 0 ] || tail -5 /tmp/case$i.out
  done
  echo "VRDMA-GUEST-DONE"
  poweroff -f
fi
serve_steps
