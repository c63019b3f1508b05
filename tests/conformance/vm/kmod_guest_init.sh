#!/bin/sh
# /init of the kernel-driver guest (kmod_test.sh): loads virtio_pci and virtio_net only (no
# virtio_blk: virtio_rdma.ko is to find the carrier unclaimed), brings eth0 up with
# vrdma.ip=ADDR/24 (the device's RDMA address: the guest owns it), then runs the host's commands
# as guest_init.sh does: "STEP <n> <shell command>" lines on the console, answered by
# "=== BEGIN <n>", the output and "=== END <n> rc=<status>"; "QUIT" powers off.
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /tmp
for m in virtio_pci virtio_net; do
  modprobe "$m" 2>/dev/null || echo "guest: modprobe $m failed"
done
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^$1=//p" | tail -1; }
IP=$(arg vrdma.ip)
ip link set lo up
ip link set eth0 up
[ -n "$IP" ] && ip addr add "$IP/24" dev eth0
stty -echo 2>/dev/null
echo "VRDMA-GUEST-READY ip=$IP uptime=$(cut -d' ' -f1 /proc/uptime)"
while read -r word n cmd; do
  case "$word" in
    STEP)
      echo "=== BEGIN $n"
      sh -c "$cmd" 2>&1
      echo "=== END $n rc=$?"
      ;;
    QUIT) break ;;
  esac
done
poweroff -f
