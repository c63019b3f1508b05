#!/bin/sh
# /init of the nested kernel-driver guest that migrates (kmod_verbs_migrate_test.sh): a local
# pair of Debian's ibv_rc_pingpong on vrdma0 (server and client in this guest, uid 1000), which
# the rxe guest moves to another vrdmad on rxe0 while they run.
. /steps.sh
init_guest virtio_pci virtio_net
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^$1=//p" | tail -1; }
IP=$(arg vrdma.ip) N=$(arg vrdma.iters)
ip link set lo up
ip link set eth0 up
ip addr add "$IP/24" dev eth0
modprobe virtio_rdma || echo "guest: modprobe virtio_rdma failed"
modprobe ib_uverbs
for _ in $(seq 300); do grep -q ACTIVE /sys/class/infiniband/vrdma0/ports/1/state 2>/dev/null && break; sleep 0.1; done
want=$(echo "$IP" | awk -F. '{printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1, $2, $3, $4}')
G=1
for i in $(seq 0 15); do [ "$(cat /sys/class/infiniband/vrdma0/ports/1/gids/$i 2>/dev/null)" = "$want" ] && G=$i && break; done
echo "root:x:0:0::/:/bin/sh" > /etc/passwd; echo "vrdma:x:1000:1000::/tmp:/bin/sh" >> /etc/passwd
echo "VRDMA-PORT $(cat /sys/class/infiniband/vrdma0/ports/1/state 2>&1) GID $G"
(su -s /bin/sh vrdma -c "timeout 600 ibv_rc_pingpong -d vrdma0 -g $G -s 4096 -n $N -p 18700 -c"; echo "server-rc=$?") > /tmp/s.out 2>&1 &
sleep 3
echo "VRDMA-PAIR-STARTED"
su -s /bin/sh vrdma -c "timeout 600 ibv_rc_pingpong -d vrdma0 -g $G -s 4096 -n $N -p 18700 -c 127.0.0.1"  > /tmp/c.out 2>&1
echo "client-rc=$?" >> /tmp/c.out
wait
sed 's/^/VRDMA-SERVER /' /tmp/s.out
sed 's/^/VRDMA-CLIENT /' /tmp/c.out
dmesg | grep -i -E "virtio_rdma|vrdma" | tail -12 | sed 's/^/VRDMA-DMESG /'
echo "VRDMA-GUEST-DONE"
poweroff -f
