#!/bin/sh
# /init of the conformance guest: checksummed writes and reads on /dev/vda from every CPU
# (so every virtqueue of the multi-queue device carries I/O), then power off. The kernel
# command line carries vrdma.mode=io (default) or vrdma.mode=migrate (keep going until the
# host writes a stop marker into the disk, verifying every read).
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
say() { echo "VRDMA-GUEST: $*"; }
for m in virtio_pci virtio_blk; do timeout 20 modprobe $m 2>/dev/null; done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
[ -b /dev/vda ] || { say "FAIL no /dev/vda"; poweroff -f; }
say "disk $(cat /sys/block/vda/size) sectors, $(ls /sys/block/vda/mq | wc -l) queues"
ncpu=$(grep -c ^processor /proc/cpuinfo)
ok=1
if grep -q vrdma.mode=migrate /proc/cmdline; then
  # Keep writing and reading back checksummed data from every CPU until the host writes
  # VRDMA-STOP into sector 120000 (the disk file is shared by both backends).
  i=0
  say "loop started"
  while [ $i -lt 2000 ]; do
    i=$((i+1))
    for c in $(seq 0 $((ncpu-1))); do
      (
        dd if=/dev/urandom of=/tmp/d$c bs=64k count=16 2>/dev/null
        timeout 60 taskset -c $c dd if=/tmp/d$c of=/dev/vda bs=64k seek=$((c*16 + (i%8)*64)) count=16 oflag=direct 2>/dev/null
        timeout 60 taskset -c $c dd if=/dev/vda of=/tmp/b$c bs=64k skip=$((c*16 + (i%8)*64)) count=16 iflag=direct 2>/dev/null
        [ "$(md5sum < /tmp/d$c)" = "$(md5sum < /tmp/b$c)" ] && echo ok > /tmp/r$c || echo bad > /tmp/r$c
      ) &
    done
    wait
    for c in $(seq 0 $((ncpu-1))); do
      [ "$(cat /tmp/r$c)" = ok ] || { ok=0; say "iter $i cpu $c: read back differs"; }
    done
    say "iter $i $([ $ok = 1 ] && echo ok || echo BAD)"
    [ $ok = 1 ] || break
    stop=$(timeout 30 dd if=/dev/vda bs=512 skip=120000 count=1 iflag=direct 2>/dev/null | head -c 10)
    [ "$stop" = "VRDMA-STOP" ] && break
  done
  [ $ok = 1 ] && say "RESULT OK after $i iterations" || say "RESULT FAIL"
  sync
  poweroff -f
fi
# Each CPU writes 4 MiB of random data at its own offset with direct I/O, then reads it back.
for c in $(seq 0 $((ncpu-1))); do
  (
    dd if=/dev/urandom of=/tmp/data$c bs=64k count=64 2>/dev/null
    timeout 60 taskset -c $c dd if=/tmp/data$c of=/dev/vda bs=64k seek=$((c*64)) count=64 oflag=direct conv=fsync 2>/dev/null
    timeout 60 taskset -c $c dd if=/dev/vda of=/tmp/back$c bs=64k skip=$((c*64)) count=64 iflag=direct 2>/dev/null
    a=$(md5sum < /tmp/data$c | cut -d' ' -f1); b=$(md5sum < /tmp/back$c | cut -d' ' -f1)
    [ "$a" = "$b" ] && echo ok > /tmp/res$c || echo "bad $a $b" > /tmp/res$c
    md5sum < /tmp/data$c | cut -d' ' -f1 > /tmp/sum$c
  ) &
done
wait
for c in $(seq 0 $((ncpu-1))); do
  r=$(cat /tmp/res$c 2>/dev/null)
  [ "$r" = "ok" ] || { ok=0; say "cpu $c: $r"; }
  say "cpu $c md5 $(cat /tmp/sum$c)"
done
# Small and odd-sized requests too (512 B .. 12 KiB, buffered then dropped from cache).
dd if=/dev/urandom of=/tmp/small bs=512 count=24 2>/dev/null
timeout 30 dd if=/tmp/small of=/dev/vda bs=512 seek=100000 count=24 oflag=direct 2>/dev/null
timeout 30 dd if=/dev/vda of=/tmp/small2 bs=512 skip=100000 count=24 iflag=direct 2>/dev/null
[ "$(md5sum < /tmp/small)" = "$(md5sum < /tmp/small2)" ] || { ok=0; say "small I/O mismatch"; }
[ $ok = 1 ] && say "RESULT OK" || say "RESULT FAIL"
sync
poweroff -f
