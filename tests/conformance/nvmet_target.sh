#!/bin/sh
# nvmet-target ADDR MIB: an NVMe over Fabrics target in a test guest (every guest_root has it as
# /bin/nvmet-target): Linux's nvmet-rdma with subsystem vrdma-nvme (any host may connect), one
# namespace backed by /tmp/ns.img (MIB MiB of zeros; tmpfs has no O_DIRECT, so the namespace
# does buffered I/O), listening on ADDR port 4420 over RDMA. Prints TARGET-UP; exits non-zero,
# naming the step, if a step fails.
set -e
[ "$#" = 2 ] || { echo "usage: nvmet-target ADDR MIB" >&2; exit 2; }
S=/sys/kernel/config/nvmet/subsystems/vrdma-nvme P=/sys/kernel/config/nvmet/ports/1
trap 'echo "nvmet-target: a step failed (above)" >&2' EXIT
modprobe nvmet-rdma
mount -t configfs none /sys/kernel/config 2>/dev/null || true
dd if=/dev/zero of=/tmp/ns.img bs=1M count="$2" 2>/dev/null
mkdir $S
echo 1 > $S/attr_allow_any_host
mkdir $S/namespaces/1
echo /tmp/ns.img > $S/namespaces/1/device_path
echo 1 > $S/namespaces/1/buffered_io
echo 1 > $S/namespaces/1/enable
mkdir $P
echo rdma > $P/addr_trtype
echo ipv4 > $P/addr_adrfam
echo "$1" > $P/addr_traddr
echo 4420 > $P/addr_trsvcid
ln -s $S $P/subsystems/vrdma-nvme
trap - EXIT
echo TARGET-UP
