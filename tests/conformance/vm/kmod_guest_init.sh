#!/bin/sh
# /init of the kernel-driver guest (kmod_test.sh): loads virtio_pci and virtio_net only (no
# virtio_blk: virtio_rdma.ko is to find the carrier unclaimed), brings eth0 up with
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
serve_steps
