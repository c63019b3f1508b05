// SPDX-License-Identifier: GPL-2.0
/*
 * The guest netdev that carries the device's RDMA address. The device speaks from one address,
 * its GID 0 (RoCEv2, IPv4-mapped: ::ffff:a.b.c.d); the guest owns that address on one of its
 * netdevs. That netdev becomes port 1's netdev (ib_device_set_netdev, as rxe does), and ib_core's
 * RoCE GID management (roce_gid_mgmt.c) then fills the GID table from its addresses and keeps it
 * current. The netdev is found at probe, or later when the address appears on it
 * (NETDEV_UP of the inetaddr chain); it is let go when it unregisters.
 */
#include <linux/inetdevice.h>
#include <linux/rtnetlink.h>
#include <net/addrconf.h>
#include <rdma/ib_verbs.h>

#include "vrdma.h"

/* GID 0's IPv4 address, or 0 when it is not IPv4-mapped. */
static __be32 gid_ipv4(const u8 gid[16])
{
	const struct in6_addr *a = (const struct in6_addr *)gid;
	__be32 ip;

	if (!ipv6_addr_v4mapped(a))
		return 0;
	memcpy(&ip, gid + 12, sizeof(ip));
	return ip;
}

/* The netdev holding `ip`, under RTNL. */
static struct net_device *netdev_with(__be32 ip)
{
	struct net_device *nd;

	ASSERT_RTNL();
	for_each_netdev(&init_net, nd) {
		const struct in_device *in = __in_dev_get_rtnl(nd);
		const struct in_ifaddr *ifa;

		if (!in)
			continue;
		in_dev_for_each_ifa_rtnl(ifa, in) {
			if (ifa->ifa_local == ip)
				return nd;
		}
	}
	return NULL;
}

/* Binds the netdev if it has the address; true when it did. Under RTNL. */
static bool bind_locked(struct vrdma_dev *dev)
{
	struct net_device *nd;
	int ret;

	ASSERT_RTNL();
	if (dev->ndev || !dev->rdma_ip)
		return false;
	nd = netdev_with(dev->rdma_ip);
	if (!nd)
		return false;
	ret = ib_device_set_netdev(dev->ib, nd, 1);
	if (ret) {
		dev_warn(&dev->vdev->dev, "cannot attach netdev %s to port 1 (%d)\n", netdev_name(nd), ret);
		return false;
	}
	dev->ndev = nd;
	dev_info(&dev->vdev->dev, "port 1 follows netdev %s (it has the device's address %pI4)\n", netdev_name(nd),
		 &dev->rdma_ip);
	return true;
}

/* Before ib_register_device: the GIDs come with the registration. */
void vrdma_netdev_bind_now(struct vrdma_dev *dev)
{
	dev->rdma_ip = gid_ipv4(dev->gid0.gid);
	if (!dev->rdma_ip) {
		dev_warn(&dev->vdev->dev, "GID 0 %pI6 is not an IPv4-mapped address: no netdev is attached\n",
			 dev->gid0.gid);
		return;
	}
	rtnl_lock();
	if (!bind_locked(dev))
		dev_info(&dev->vdev->dev, "no netdev has the device's address %pI4 yet; port 1 waits for it\n",
			 &dev->rdma_ip);
	rtnl_unlock();
}

/* After registration: bind, then let ib_core read the netdev's addresses (it takes RTNL itself). */
static void bind_work(struct work_struct *w)
{
	struct vrdma_dev *dev = container_of(w, struct vrdma_dev, bind_work);
	bool bound;

	rtnl_lock();
	bound = bind_locked(dev);
	rtnl_unlock();
	if (bound)
		rdma_roce_rescan_device(dev->ib);
}

static int inetaddr_event(struct notifier_block *nb, unsigned long event, void *ptr)
{
	struct vrdma_dev *dev = container_of(nb, struct vrdma_dev, inetaddr_nb);
	const struct in_ifaddr *ifa = ptr;

	if (event == NETDEV_UP && dev->rdma_ip && ifa->ifa_local == dev->rdma_ip && !READ_ONCE(dev->ndev))
		schedule_work(&dev->bind_work);
	return NOTIFY_DONE;
}

static int netdev_event(struct notifier_block *nb, unsigned long event, void *ptr)
{
	struct vrdma_dev *dev = container_of(nb, struct vrdma_dev, netdev_nb);
	struct net_device *nd = netdev_notifier_info_to_dev(ptr);

	/* ib_device_set_netdev's rule: let go of the netdev on its NETDEV_UNREGISTER. */
	if (event == NETDEV_UNREGISTER && nd == dev->ndev) {
		ib_device_set_netdev(dev->ib, NULL, 1);
		WRITE_ONCE(dev->ndev, NULL);
		dev_info(&dev->vdev->dev, "netdev %s is going away: port 1 has no netdev\n", netdev_name(nd));
	}
	return NOTIFY_DONE;
}

/*
 * Before vrdma_netdev_bind_now: from the moment the driver may hold a netdev, it hears that
 * netdev's NETDEV_UNREGISTER.
 */
int vrdma_netdev_watch_unregister(struct vrdma_dev *dev)
{
	INIT_WORK(&dev->bind_work, bind_work);
	dev->netdev_nb.notifier_call = netdev_event;
	dev->inetaddr_nb.notifier_call = inetaddr_event;
	return register_netdevice_notifier(&dev->netdev_nb);
}

/* After ib_register_device: the address appearing binds the netdev (bind_work rescans GIDs). */
int vrdma_netdev_watch_address(struct vrdma_dev *dev)
{
	int ret = register_inetaddr_notifier(&dev->inetaddr_nb);

	if (ret)
		return ret;
	dev->watching_address = true;
	/* The address may have come between bind_now and the notifier. */
	schedule_work(&dev->bind_work);
	return 0;
}

void vrdma_netdev_unwatch(struct vrdma_dev *dev)
{
	if (dev->watching_address)
		unregister_inetaddr_notifier(&dev->inetaddr_nb);
	dev->watching_address = false;
	cancel_work_sync(&dev->bind_work);
	unregister_netdevice_notifier(&dev->netdev_nb);
}
