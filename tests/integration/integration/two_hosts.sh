#!/usr/bin/env bash
# two_hosts.sh CMD [ARGS...]: runs CMD with two real libvirt "hosts" on this machine, then tears
# them down (on every exit path: CMD's end, a failure here, SIGINT/SIGTERM).
#
# Each host is a libvirtd + virtlogd in its own mount, UTS and network namespace
# (unshare -m -u -n --propagation private) with private copies of /etc/libvirt, /run/libvirt,
# /var/lib/libvirt, /var/log/libvirt and /var/cache/libvirt, its own hostname and host_uuid,
# `cgroup_controllers = [ ]` and a migration port range; a veth pair joins the two network
# namespaces (../shared/RIG.md). Both hosts are namespaced so that the machine's own /etc/libvirt,
# /run/libvirt and network stay untouched (the machine is shared).
#
# CMD gets, in its environment:
#   LV_ROOT              the rig's folder (removed at the end)
#   LV_A_URI, LV_B_URI   URIs for virsh/vrdmactl run here: qemu+unix:///system?socket=...
#   LV_A_TCP, LV_B_TCP   URIs each host's libvirtd uses for the other (qemu+tcp://IP/system)
#   LV_A_IP, LV_B_IP     the hosts' addresses on the veth pair
#   LV_A_PID, LV_B_PID   a process in each host's namespaces (for nsenter -t PID -m -u -n)
#   LV_A_DIR, LV_B_DIR   each host's private tree ($LV_ROOT/a, $LV_ROOT/b)
# Options (environment):
#   LV_HOOK=PATH   installed as both hosts' /etc/libvirt/hooks/qemu, wrapped so that it sees
#                  LV_HOST=a|b, LV_HOST_IP and LV_HOST_DIR
#   LV_PREFIX      name prefix for veths and hostnames (default lv9)
#   LV_NET         first three octets of the veth subnet (default 10.99.9)
#   LV_START_TIMEOUT  seconds each libvirtd has to answer (default 180: the first start on a
#                  machine probes QEMU's capabilities)
#   LV_STOCK=1     hosts as Debian sets libvirt up: qemu.conf's user, group, dynamic_ownership,
#                  remember_owner and security driver stay at their defaults (QEMU runs as
#                  libvirt-qemu), the machine's /etc/libvirt/hooks/qemu.d/ (an installed package's
#                  hooks) is kept, and each host has a /run of its own ($LV_X_DIR/run, empty at
#                  boot, then `systemd-tmpfiles --create --prefix /run` as a boot runs it). CMD may
#                  reboot a host: `$LV_REBOOT a|b` (its domains must be gone) stops its daemons,
#                  empties its /run, runs tmpfiles, starts the daemons and waits for libvirtd.
# Exits with CMD's status; 77 (with a sentence) when libvirt, QEMU or root is missing.
set -uo pipefail

PREFIX=${LV_PREFIX:-lv9}
NET=${LV_NET:-10.99.9}

skip() { echo "two_hosts: SKIP: $*" >&2; exit 77; }
[ "$#" -ge 1 ] || { echo "usage: two_hosts.sh CMD [ARGS...]" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || skip "the rig needs root (namespaces, bind mounts, veth)"
for t in libvirtd virtlogd virsh qemu-system-x86_64 unshare nsenter ip; do
  command -v "$t" >/dev/null 2>&1 ||
    skip "$t is not installed (scripts/setup.sh installs libvirt-daemon-system, libvirt-clients and qemu-system-x86)"
done

ROOT=$(mktemp -d /tmp/${PREFIX}rig.XXXXXX)
# libvirt's probe of QEMU (~15-30 s each) is kept between runs, one per kind of host (a stock
# host probes as libvirt-qemu with /dev/kvm open to it, the others as root).
CAPS_CACHE=${VRDMA_RIG_CACHE:-/var/cache/vrdma-rig}/libvirt-caps${LV_STOCK:+-stock}
# The holders create /run/libvirt as a mount point when the machine has none; removed at the end.
RUN_LIBVIRT_MADE=0
[ -d /run/libvirt ] || RUN_LIBVIRT_MADE=1
HOLDERS=()
NS_IDS=()

log() { echo "two_hosts: $*" >&2; }

# Every process whose mount namespace is one of ours (libvirtd, virtlogd, QEMU, backends that
# hooks started), by pid.
ns_pids() {
  local p ns
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    ns=$(readlink "/proc/$p/ns/mnt" 2>/dev/null) || continue
    for want in "${NS_IDS[@]}"; do
      [ "$ns" = "$want" ] && echo "$p"
    done
  done
}

teardown() {
  local rc=$?
  trap - EXIT INT TERM
  local h uri d
  for h in a b; do
    uri="qemu+unix:///system?socket=$ROOT/$h/run/libvirt/libvirt-sock"
    [ -S "$ROOT/$h/run/libvirt/libvirt-sock" ] || continue
    for d in $(timeout 10 virsh -q -c "$uri" list --name 2>/dev/null); do
      timeout 20 virsh -q -c "$uri" destroy "$d" >/dev/null 2>&1
    done
  done
  if ((${#NS_IDS[@]})); then
    local holders=" ${HOLDERS[*]} " pids p i
    # Daemons and their children first (SIGTERM, then SIGKILL after 10 s), the holders last.
    for sig in TERM KILL; do
      pids=$(ns_pids)
      for p in $pids; do [[ $holders == *" $p "* ]] || kill -s $sig "$p" 2>/dev/null; done
      for i in $(seq 100); do
        pids=$(ns_pids)
        local left=0
        for p in $pids; do [[ $holders == *" $p "* ]] || left=1; done
        [ $left = 0 ] && break
        sleep 0.1
      done
    done
    for p in "${HOLDERS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    if [ -n "$(ns_pids)" ]; then log "processes left in the rig's namespaces: $(ns_pids)"; rc=1; fi
  fi
  if [ -d "$ROOT/a/var/cache/libvirt/qemu/capabilities" ] && [ ! -d "$CAPS_CACHE/qemu" ]; then
    mkdir -p "$CAPS_CACHE" && cp -a "$ROOT/a/var/cache/libvirt/qemu" "$CAPS_CACHE/" 2>/dev/null
  fi
  ip link del "${PREFIX}a" 2>/dev/null
  [ $RUN_LIBVIRT_MADE = 1 ] && rmdir /run/libvirt 2>/dev/null
  if grep -q "$ROOT" /proc/self/mountinfo; then log "mounts left under $ROOT"; rc=1; fi
  [ -n "${LV_KEEP:-}" ] && log "kept $ROOT (LV_KEEP)" || rm -rf "$ROOT"
  exit $rc
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# host NAME IP: private tree and configuration.
prepare_host() {
  local h=$1 ip=$2 R=$ROOT/$1
  mkdir -p "$R"/{etc,run/libvirt,var/lib,var/log/libvirt,var/cache}
  cp -a /etc/libvirt "$R/etc/libvirt"
  cp -a /var/lib/libvirt "$R/var/lib/libvirt"
  if [ -d /var/cache/libvirt ]; then cp -a /var/cache/libvirt "$R/var/cache/libvirt"; else mkdir -p "$R/var/cache/libvirt"; fi
  # libvirtd probes QEMU's capabilities at start (~15 s under TCG-only hosts); the probe from an
  # earlier run is reused (libvirt itself checks that QEMU and libvirtd have not changed).
  [ -d "$CAPS_CACHE/qemu" ] && cp -a "$CAPS_CACHE/qemu" "$R/var/cache/libvirt/"
  rm -f "$R"/etc/libvirt/qemu/*.xml "$R"/etc/libvirt/qemu/networks/autostart/*
  # The test's own hook (LV_HOOK) only; an installed package's hooks/qemu.d/ stays in stock hosts.
  if [ -n "${LV_STOCK:-}" ]; then rm -f "$R"/etc/libvirt/hooks/qemu; else rm -rf "$R"/etc/libvirt/hooks/*; fi
  rm -rf "$R"/etc/libvirt/qemu/autostart
  cat >> "$R/etc/libvirt/libvirtd.conf" <<EOF

# --- two_hosts.sh host $h ---
listen_tls = 0
listen_tcp = 1
listen_addr = "$ip"
auth_tcp = "none"
host_uuid = "$(cat /proc/sys/kernel/random/uuid)"
log_outputs = "3:file:/var/log/libvirt/libvirtd.log"
EOF
  # No systemd here to hand out cgroups, and QEMU's own mount namespace would hide the rig's
  # private folders from it: both off in every host. The rest is the stock configuration's, or
  # (without LV_STOCK) QEMU as root with no relabelling.
  cat >> "$R/etc/libvirt/qemu.conf" <<EOF

# --- two_hosts.sh host $h ---
cgroup_controllers = [ ]
namespaces = [ ]
migration_address = "$ip"
migration_port_min = 49300
migration_port_max = 49339
EOF
  [ -n "${LV_STOCK:-}" ] || cat >> "$R/etc/libvirt/qemu.conf" <<EOF
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
EOF
  if [ -n "${LV_HOOK:-}" ]; then
    mkdir -p "$R/etc/libvirt/hooks"
    printf '#!/bin/sh\nLV_HOST=%s LV_HOST_IP=%s LV_HOST_DIR=%s exec %q "$@"\n' "$h" "$ip" "$R" "$LV_HOOK" \
      > "$R/etc/libvirt/hooks/qemu"
    chmod 755 "$R/etc/libvirt/hooks/qemu"
  fi
  # Runs inside the new namespaces: bind the private tree, name the host, start the daemons
  # as children so that their end is seen.
  cat > "$R/holder.sh" <<'EOF'
#!/usr/bin/env bash
R=$1; NAME=$2; STOCK=$3
DIRS="etc/libvirt run/libvirt var/lib/libvirt var/log/libvirt var/cache/libvirt"
# A stock host has a /run of its own (what libvirt, the package's tmpfiles.d and the backends
# keep there), empty at each boot as a tmpfs is.
[ -n "$STOCK" ] && DIRS="etc/libvirt run var/lib/libvirt var/log/libvirt var/cache/libvirt"
for d in $DIRS; do
  mkdir -p "/$d"
  mount --bind "$R/$d" "/$d" || { echo "holder: cannot bind $R/$d on /$d" >&2; exit 1; }
done
hostname "$NAME"
ip link set lo up
# Debian's udev makes /dev/kvm root:kvm 0660 (libvirt-qemu is in group kvm); this machine has no
# udev and leaves it root's alone, so a stock libvirt finds KVM present at each probe of QEMU but
# not usable by QEMU's user, calls its probe outdated and probes again at every look (~4-30 s
# each, inside every migration). A stock host gets the node as Debian has it.
if [ -n "$STOCK" ] && [ -c /dev/kvm ] && getent group kvm > /dev/null; then
  mknod "$R/kvm" c $((0x$(stat -c %t /dev/kvm))) $((0x$(stat -c %T /dev/kvm))) && chown root:kvm "$R/kvm" &&
    chmod 0660 "$R/kvm" && mount --bind "$R/kvm" /dev/kvm || { echo "holder: cannot give /dev/kvm Debian's owner and mode" >&2; exit 1; }
fi
# libvirtd binds its TCP listener to the host's veth address: wait for the go (the veth is up)
for ((i = 0; i < 600; i++)); do [ -e "$R/go" ] && break; sleep 0.1; done
[ -e "$R/go" ] || { echo "holder: no go within 60 s" >&2; exit 1; }
while :; do
  if [ -n "$STOCK" ]; then
    mkdir -p /run/libvirt
    systemd-tmpfiles --create --prefix /run > "$R/tmpfiles.out" 2>&1
  fi
  virtlogd -p "$R/virtlogd.pidfile" > "$R/virtlogd.out" 2>&1 &
  echo $! > "$R/virtlogd.pid"
  libvirtd --listen -p "$R/libvirtd.pidfile" > "$R/libvirtd.out" 2>&1 &
  echo $! > "$R/libvirtd.pid"
  wait
  # LV_REBOOT stopped the daemons: a new boot with an empty /run.
  [ -e "$R/reboot" ] || break
  find /run -mindepth 1 -delete
  rm -f "$R/reboot"
done
EOF
  chmod +x "$R/holder.sh"
}

start_host() {
  local h=$1
  unshare -m -u -n --propagation private "$ROOT/$h/holder.sh" "$ROOT/$h" "$PREFIX-$h" "${LV_STOCK:-}" &
  HOLDERS+=("$!")
  local i
  for i in $(seq 50); do
    local ns
    ns=$(readlink "/proc/$!/ns/mnt" 2>/dev/null)
    [ -n "$ns" ] && [ "$ns" != "$(readlink /proc/self/ns/mnt)" ] && { NS_IDS+=("$ns"); return 0; }
    sleep 0.05
  done
  log "host $h did not get its own mount namespace"
  exit 1
}

# wait_libvirtd NAME: until the host's libvirtd answers. Its first start on a machine probes
# QEMU's capabilities (~15 s here, far longer on a loaded CI machine), so the bound is generous;
# a libvirtd that exits ends the wait at once, with its output.
wait_libvirtd() {
  local h=$1 uri="qemu+unix:///system?socket=$ROOT/$1/run/libvirt/libvirt-sock"
  local start=$SECONDS limit=${LV_START_TIMEOUT:-180} pid next=30
  while :; do
    timeout 10 virsh -q -c "$uri" version >/dev/null 2>&1 && return 0
    pid=$(cat "$ROOT/$h/libvirtd.pid" 2>/dev/null)
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      log "host $h's libvirtd exited before answering; its output and log:"
      cat "$ROOT/$h/libvirtd.out" >&2; tail -5 "$ROOT/$h/var/log/libvirt/libvirtd.log" >&2; exit 1
    fi
    if ((SECONDS - start >= limit)); then
      log "host $h's libvirtd did not answer within $limit s (LV_START_TIMEOUT); its output:"
      cat "$ROOT/$h/libvirtd.out" >&2; exit 1
    fi
    ((SECONDS - start >= next)) && { log "host $h's libvirtd is still starting ($((SECONDS - start)) s; probing QEMU)"; next=$((next + 30)); }
    sleep 0.2
  done
}

prepare_host a "$NET.1"
prepare_host b "$NET.2"
start_host a
start_host b
PA=${HOLDERS[0]} PB=${HOLDERS[1]}

# The veth first: each libvirtd binds its TCP listener to its host's address on it.
ip link add "${PREFIX}a" netns "$PA" type veth peer name "${PREFIX}b" netns "$PB" ||
  { log "cannot create the veth pair ${PREFIX}a/${PREFIX}b"; exit 1; }
nsenter -t "$PA" -n sh -c "ip addr add $NET.1/24 dev ${PREFIX}a && ip link set ${PREFIX}a up" || exit 1
nsenter -t "$PB" -n sh -c "ip addr add $NET.2/24 dev ${PREFIX}b && ip link set ${PREFIX}b up" || exit 1

# Host a's daemons first: when no earlier run left a capabilities probe, b reuses a's instead
# of probing at the same time on the same cores. A stock host probes the guests' emulator only
# when a domain first needs it (at a migration's prepare on b, adding its half minute to the
# move): a asks for it now, and b gets a's.
touch "$ROOT/a/go"
wait_libvirtd a
if [ -n "${LV_STOCK:-}" ]; then
  timeout 120 virsh -q -c "qemu+unix:///system?socket=$ROOT/a/run/libvirt/libvirt-sock" domcapabilities \
    --emulatorbin /usr/bin/qemu-system-x86_64 --arch x86_64 --virttype qemu > /dev/null ||
    log "host a could not probe /usr/bin/qemu-system-x86_64 ahead"
  rm -rf "$ROOT/b/var/cache/libvirt/qemu"
fi
if [ ! -d "$ROOT/b/var/cache/libvirt/qemu/capabilities" ] && [ -d "$ROOT/a/var/cache/libvirt/qemu/capabilities" ]; then
  cp -a "$ROOT/a/var/cache/libvirt/qemu" "$ROOT/b/var/cache/libvirt/"
fi
touch "$ROOT/b/go"
wait_libvirtd b

# LV_REBOOT HOST: the host's daemons stop, its holder empties its /run and starts them again.
cat > "$ROOT/reboot.sh" <<EOF
#!/usr/bin/env bash
R=$ROOT/\$1
[ -n "${LV_STOCK:-}" ] || { echo "two_hosts: LV_REBOOT needs LV_STOCK=1 hosts" >&2; exit 2; }
old=\$(cat "\$R/libvirtd.pid")
touch "\$R/reboot"
kill "\$old" "\$(cat "\$R/virtlogd.pid")" 2>/dev/null
for _ in \$(seq 600); do
  [ ! -e "\$R/reboot" ] && [ "\$(cat "\$R/libvirtd.pid" 2>/dev/null)" != "\$old" ] &&
    timeout 10 virsh -q -c "qemu+unix:///system?socket=\$R/run/libvirt/libvirt-sock" version >/dev/null 2>&1 && exit 0
  sleep 0.2
done
echo "two_hosts: host \$1's libvirtd did not come back within 120 s of the reboot" >&2
exit 1
EOF
chmod +x "$ROOT/reboot.sh"
export LV_REBOOT=$ROOT/reboot.sh
export LV_ROOT=$ROOT LV_A_DIR=$ROOT/a LV_B_DIR=$ROOT/b LV_A_PID=$PA LV_B_PID=$PB
export LV_A_IP=$NET.1 LV_B_IP=$NET.2
export LV_A_URI="qemu+unix:///system?socket=$ROOT/a/run/libvirt/libvirt-sock"
export LV_B_URI="qemu+unix:///system?socket=$ROOT/b/run/libvirt/libvirt-sock"
export LV_A_TCP="qemu+tcp://$NET.1/system" LV_B_TCP="qemu+tcp://$NET.2/system"

log "hosts up: a=$PREFIX-a ($NET.1), b=$PREFIX-b ($NET.2), rig $ROOT"

"$@"
