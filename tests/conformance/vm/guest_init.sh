#!/bin/sh
# /init of the paravirtual-verbs guest: loads virtio_pci, virtio_blk (it binds the carrier
# function first, as in any guest), virtio_net and uio_pci_generic, reserves 2 MiB hugepages,
# brings eth0 up (vrdma.ip=, default 10.77.7.2: the out-of-band TCP exchange of vrdma-perf).
# Then, by default, it runs the host's commands: the host writes "STEP <n> <shell command>"
# lines to the serial console; the guest answers "=== BEGIN <n>", the command's output and
# "=== END <n> rc=<status>". "QUIT" powers off.
# With vrdma.cases= on the kernel command line it runs on its own instead (for guests whose
# console is only a log, e.g. under libvirt): pvverbs-bind, then one vrdma-perf client per
# case against vrdma.peer=IP, case i on TCP port vrdma.port+i (default 18600), printing
# "VRDMA-CASE <i> <test> rc=<status> <JSON>" per case and "VRDMA-GUEST-DONE" at the end.
# A case is test/size/iters/depth[/seconds] (seconds: run for that long instead of iters).
. /steps.sh
init_guest virtio_pci virtio_blk virtio_net uio_pci_generic
mkdir -p /dev/hugepages
mount -t hugetlbfs none /dev/hugepages || echo "guest: cannot mount hugetlbfs"
echo 64 > /proc/sys/vm/nr_hugepages
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^$1=//p" | tail -1; }
IP=$(arg vrdma.ip); IP=${IP:-10.77.7.2}
ip link set lo up
ip link set eth0 up
ip addr add "$IP/24" dev eth0
stty -echo 2>/dev/null
echo "VRDMA-GUEST-READY ip=$IP hugepages=$(cat /proc/sys/vm/nr_hugepages) uptime=$(cut -d' ' -f1 /proc/uptime)"

# vrdma.stream=N: pvverbs-bind, then vrdma-stream (N messages each way, checked) over pv:pci
# against vrdma.peer on port vrdma.port, its progress and result lines prefixed "VRDMA-STREAM".
STREAM=$(arg vrdma.stream)
if [ -n "$STREAM" ]; then
  PEER=$(arg vrdma.peer); PORT=$(arg vrdma.port); PORT=${PORT:-18700}
  echo "VRDMA-BIND $(timeout 30 pvverbs-bind 2>&1 | tr '\n' ' ')"
  timeout 900 vrdma-stream -d "pv:pci:auto?ram_mib=64" -c "$PEER" -p "$PORT" -n "$STREAM" --progress --limit 800 2>&1 |
    while read -r line; do echo "VRDMA-STREAM $line"; done
  echo "VRDMA-GUEST-DONE"
  poweroff -f
fi

# vrdma.blkload=MIB: a checked disk loop on /dev/vda (QEMU's own virtio-blk: the migration
# memory study's guest without vrdma, memcheck_study.sh): each round writes MIB MiB of fresh
# random data, drops the page cache, reads it back and compares checksums, printing
# "VRDMA-BLK iter <n> ok" (or BAD) until the VM is stopped.
BLK=$(arg vrdma.blkload)
if [ -n "$BLK" ]; then
  i=0
  while :; do
    i=$((i + 1))
    dd if=/dev/urandom of=/tmp/blk bs=1M count="$BLK" 2>/dev/null
    want=$(md5sum < /tmp/blk)
    dd if=/tmp/blk of=/dev/vda bs=1M conv=fsync 2>/dev/null
    echo 3 > /proc/sys/vm/drop_caches
    got=$(dd if=/dev/vda bs=1M count="$BLK" 2>/dev/null | md5sum)
    if [ "$want" = "$got" ]; then echo "VRDMA-BLK iter $i ok"; else echo "VRDMA-BLK iter $i BAD"; fi
  done
fi

# vrdma.wait=SECONDS (with vrdma.cases): the device is hot-plugged later (vrdmactl domain attach
# --live): "VRDMA-WAITING", then up to SECONDS for pvverbs-bind to find it; after the cases, up
# to SECONDS for it to be unplugged again ("VRDMA-DEVICE-GONE"), and 10 s more before powering off.
WAIT=$(arg vrdma.wait)
CASES=$(arg vrdma.cases)
if [ -n "$CASES" ]; then
  PEER=$(arg vrdma.peer); PORT=$(arg vrdma.port); PORT=${PORT:-18600}
  if [ -n "$WAIT" ]; then
    echo "VRDMA-WAITING"
    for _ in $(seq $((WAIT * 2))); do pvverbs-bind --list 2>/dev/null | grep -q " carrier \| native " && break; sleep 0.5; done
    echo "VRDMA-FOUND $(pvverbs-bind --list 2>&1 | tr '\n' ' ')"
  fi
  echo "VRDMA-BIND $(timeout 30 pvverbs-bind 2>&1 | tr '\n' ' ')"
  i=0
  for c in $(echo "$CASES" | tr ',' ' '); do
    i=$((i + 1))
    IFS=/ read -r t s n q secs <<CASE
$c
CASE
    if [ -n "$secs" ]; then run="-D $secs"; limit=$((secs + 120)); else run="-n $n"; limit=300; fi
    # shellcheck disable=SC2086
    out=$(timeout $limit vrdma-perf -d "pv:pci:auto?ram_mib=64" -c "$PEER" -p $((PORT + i)) -t "$t" -s "$s" -q "$q" $run \
          --verify --json 2>&1)
    rc=$?
    echo "VRDMA-CASE $i $t rc=$rc $(echo "$out" | tr '\n' ' ')"
  done
  if [ -n "$WAIT" ]; then
    for _ in $(seq $((WAIT * 2))); do pvverbs-bind --list 2>/dev/null | grep -q " carrier \| native " || break; sleep 0.5; done
    pvverbs-bind --list 2>/dev/null | grep -q " carrier \| native " || echo "VRDMA-DEVICE-GONE"
    sleep 10  # the host looks at the running domain once more
  fi
  echo "VRDMA-GUEST-DONE"
  poweroff -f
fi

serve_steps
