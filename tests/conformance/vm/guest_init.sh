#!/bin/sh
# /init of the paravirtual-verbs guest: loads virtio_pci, virtio_blk (it binds the carrier
# function first, as in any guest), virtio_net and uio_pci_generic, reserves 2 MiB hugepages,
# brings eth0 up as 10.77.7.2 (the out-of-band TCP exchange of vrdma-perf), then runs the
# host's commands. The host writes "STEP <n> <shell command>" lines to the serial console; the
# guest answers "=== BEGIN <n>", the command's output and "=== END <n> rc=<status>". "QUIT" powers off.
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /tmp /dev/hugepages
for m in virtio_pci virtio_blk virtio_net uio_pci_generic; do
  modprobe "$m" 2>/dev/null || echo "guest: modprobe $m failed"
done
mount -t hugetlbfs none /dev/hugepages || echo "guest: cannot mount hugetlbfs"
echo 64 > /proc/sys/vm/nr_hugepages
ip link set lo up
ip link set eth0 up
ip addr add 10.77.7.2/24 dev eth0
stty -echo 2>/dev/null
echo "VRDMA-GUEST-READY hugepages=$(cat /proc/sys/vm/nr_hugepages) uptime=$(cut -d' ' -f1 /proc/uptime)"
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
