# Sourced by the libvirt migration rigs (vm_libvirt_migrate_test.sh, scripts/demo.sh): the fabric
# between two_hosts.sh's libvirt hosts, a switch and a soft-engine peer.
#   guest_fabric   a switch (bridge br0 in namespace $SWNS), on each host the guest's RDMA address
#                  on "vg" (MAC $GMAC, address $GIP: the same on both hosts, silent on b until the
#                  guest runs there) and a bridge "hbr" with the guest's tap "vmtap0" and an uplink
#                  to the switch; the peer in namespace $PNS at $PEER; nftables on the switch drops
#                  ${LOSS_PERCENT:-1} % of RoCE packets (UDP 4791) both ways.
# Needs LV_A_PID, LV_B_PID (two_hosts.sh), LV_PREFIX, SWNS, PNS, GIP, GMAC, PEER; returns non-zero
# with a sentence on stderr when a step fails.
guest_fabric() {
  local h pid_var pid p=${LV_PREFIX:?}
  ip netns pids "$PNS" 2>/dev/null | xargs -r kill 2>/dev/null
  ip netns del "$PNS" 2>/dev/null; ip netns del "$SWNS" 2>/dev/null
  ip netns add "$SWNS" && ip netns add "$PNS" || { echo "cannot create the namespaces $SWNS and $PNS" >&2; return 1; }
  ip -n "$SWNS" link add br0 type bridge && ip -n "$SWNS" link set br0 up || return 1
  for h in a b; do
    pid_var=LV_${h^^}_PID; pid=${!pid_var}
    ip link add "${p}g$h" netns "$pid" type veth peer name "sg$h" netns "$SWNS" &&
      ip link add "${p}u$h" netns "$pid" type veth peer name "su$h" netns "$SWNS" &&
      ip -n "$SWNS" link set "sg$h" master br0 up && ip -n "$SWNS" link set "su$h" master br0 up &&
      nsenter -t "$pid" -n sh -c "ip link set ${p}g$h name vg && ip link set vg address $GMAC && ip addr add $GIP/24 dev vg &&
        ip link set vg up && ip link add hbr type bridge && ip link set ${p}u$h master hbr up &&
        ip tuntap add vmtap0 mode tap && ip link set vmtap0 master hbr up && ip link set hbr up" ||
      { echo "cannot build host $h's network" >&2; return 1; }
  done
  nsenter -t "$LV_B_PID" -n ip link set vg arp off
  # ARP for the guest's address only on vg (Linux answers on any interface by default).
  for pid in $LV_A_PID $LV_B_PID; do nsenter -t "$pid" -n sysctl -qw net.ipv4.conf.all.arp_ignore=1; done
  ip link add gP netns "$PNS" type veth peer name sgP netns "$SWNS" && ip -n "$SWNS" link set sgP master br0 up &&
    ip -n "$PNS" link set lo up && ip -n "$PNS" addr add "$PEER/24" dev gP && ip -n "$PNS" link set gP up ||
    { echo "cannot build the peer's network" >&2; return 1; }
  ip netns exec "$SWNS" nft add table bridge loss &&
    ip netns exec "$SWNS" nft add chain bridge loss lossy '{ type filter hook forward priority 0; }' &&
    ip netns exec "$SWNS" nft add rule bridge loss lossy udp dport 4791 numgen random mod 100 '<' "${LOSS_PERCENT:-1}" counter drop ||
    { echo "cannot set up nftables on the switch (nft bridge family)" >&2; return 1; }
}

# The RoCE packets the switch dropped so far.
fabric_dropped() {
  ip netns exec "$SWNS" nft list chain bridge loss lossy | sed -n 's/.*counter packets \([0-9]*\).*/\1/p'
}

# fabric_cleanup: ends every process in the peer's namespace and deletes it and the switch's
# (the rigs' exit traps; a rig that never built its fabric costs nothing).
fabric_cleanup() {
  ip netns pids "$PNS" 2>/dev/null | xargs -r kill 2>/dev/null
  ip netns del "$PNS" 2>/dev/null
  ip netns del "$SWNS" 2>/dev/null
}
