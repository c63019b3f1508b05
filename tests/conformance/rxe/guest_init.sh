#!/bin/sh
# /init of the reference-peer guest: loads rxe (and siw when present), brings eth0 up as
# 10.77.0.2 with MTU 9000 (path MTU 4096 needs it), creates rxe0 on it, then runs the host's
# commands. The host writes "STEP <n> <shell command>" lines to the serial console; the guest
# answers "=== BEGIN <n>", the command's output and "=== END <n> rc=<status>". "QUIT" powers off.
. /steps.sh
init_guest crc32_generic crc32c_generic virtio_pci virtio_net ib_uverbs rdma_ucm rdma_rxe
ip link set lo up
ip link set eth0 mtu 9000
ip link set eth0 up
ip addr add 10.77.0.2/24 dev eth0
rdma link add rxe0 type rxe netdev eth0 || echo "guest: cannot create rxe0"
if [ -f /lib/modules/$(uname -r)/extra/siw.ko ]; then
  modprobe siw && rdma link add siw0 type siw netdev eth0 || echo "guest: cannot create siw0"
fi
stty -echo 2>/dev/null
echo "VRDMA-GUEST-READY $(rdma link show | tr '\n' ';')"
serve_steps
