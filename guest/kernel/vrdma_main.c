// SPDX-License-Identifier: GPL-2.0
/*
 * virtio_rdma.ko: the guest kernel driver of the virtio RDMA device (docs/virtio-rdma.md).
 *
 * It binds the native device (virtio ID 42) and the device riding QEMU's vhost-user-blk-pci as a
 * carrier (virtio ID 2, "Inside a VM"): a blk config window with capacity 0 and the "VRDM"
 * signature at offset 8; any other block device is declined. It finds the control, event and
 * doorbell queues and, when the device has one, the state queue, keeps event buffers posted
 * (vrdma_event.c) and a state area (vrdma_state.c: what a live migration carries the guest's
 * objects in), reads the whole config with
 * QUERY_CONFIG behind a carrier, asks the device's limits, port and GID 0, and registers an
 * ib_device "vrdma%d" (vrdma_ib.c) whose RoCEv2 GIDs follow the guest netdev that carries the
 * device's address (vrdma_netdev.c).
 */
#include <linux/module.h>
#include <linux/virtio.h>
#include <linux/virtio_config.h>
#include <linux/virtio_ids.h>

#include "vrdma.h"

#define VRDMA_NATIVE_ID VIRTIO_RDMA_DEVICE_ID

/* A block function is ours only when its config is our carrier window (virtio_rdma.h). */
static bool carrier_window(struct virtio_device *vdev, struct virtio_rdma_carrier_config *w)
{
	virtio_cread_bytes(vdev, 0, w, sizeof(*w));
	return le64_to_cpu(w->blk_capacity) == 0 && le32_to_cpu(w->signature) == VIRTIO_RDMA_SIGNATURE;
}

/* Checks the config the device gave (QUERY_CONFIG or the native config space). */
static int check_config(struct vrdma_dev *dev)
{
	const struct virtio_rdma_config *c = &dev->cfg;
	struct device *d = &dev->vdev->dev;
	u32 transport = le32_to_cpu(c->transport);

	if (le32_to_cpu(c->signature) != VIRTIO_RDMA_SIGNATURE) {
		dev_err(d, "config signature %#x is not \"VRDM\"\n", le32_to_cpu(c->signature));
		return -ENODEV;
	}
	if (le16_to_cpu(c->version) != VIRTIO_RDMA_VERSION) {
		dev_err(d, "the device speaks virtio RDMA version %u; this driver speaks %u\n", le16_to_cpu(c->version),
			VIRTIO_RDMA_VERSION);
		return -EOPNOTSUPP;
	}
	if (le16_to_cpu(c->num_queues) < VIRTIO_RDMA_REQUIRED_QUEUES) {
		dev_err(d, "the device has %u queues; it needs at least %u\n", le16_to_cpu(c->num_queues),
			VIRTIO_RDMA_REQUIRED_QUEUES);
		return -EPROTO;
	}
	if (transport != VRDMA_WIRE_TRANSPORT_ROCE && transport != VRDMA_WIRE_TRANSPORT_SOFT_ROCE_V2) {
		dev_err(d, "the device's transport is %u; this driver serves RoCE (1, 3) only\n", transport);
		return -EOPNOTSUPP;
	}
	if (c->active_mtu < IB_MTU_256 || c->active_mtu > IB_MTU_4096 || c->port_state < IB_PORT_DOWN ||
	    c->port_state > IB_PORT_ACTIVE_DEFER) {
		dev_err(d, "config: port state %u or active MTU %u is out of range\n", c->port_state, c->active_mtu);
		return -EPROTO;
	}
	return 0;
}

/* QUERY_DEVICE, QUERY_PORT, QUERY_GID 0: asked once here, every answer checked. */
static int query_device_once(struct vrdma_dev *dev)
{
	struct device *d = &dev->vdev->dev;
	struct virtio_rdma_query_gid_req gq = { .index = cpu_to_le32(0) };
	struct virtio_rdma_device_attr_resp *a = &dev->dattr;
	struct virtio_rdma_port_attr_resp *p = &dev->pattr;
	int ret;

	ret = vrdma_cmd(dev, VIRTIO_RDMA_CMD_QUERY_DEVICE, NULL, 0, a, sizeof(*a));
	if (ret)
		return ret;
	a->fw_ver[sizeof(a->fw_ver) - 1] = '\0';
	if (a->phys_port_cnt != 1 || a->atomic_cap > IB_ATOMIC_GLOB) {
		dev_err(d, "QUERY_DEVICE: %u ports, atomic capability %u (this driver serves one port; 0..2)\n",
			a->phys_port_cnt, a->atomic_cap);
		return -EPROTO;
	}
	ret = vrdma_cmd(dev, VIRTIO_RDMA_CMD_QUERY_PORT, NULL, 0, p, sizeof(*p));
	if (ret)
		return ret;
	if (p->state < IB_PORT_DOWN || p->state > IB_PORT_ACTIVE_DEFER || p->active_mtu < IB_MTU_256 ||
	    p->active_mtu > IB_MTU_4096 || p->max_mtu < p->active_mtu || p->max_mtu > IB_MTU_4096 ||
	    le32_to_cpu(p->gid_tbl_len) == 0) {
		dev_err(d, "QUERY_PORT: state %u, MTU %u of %u, %u GIDs: out of range\n", p->state, p->active_mtu,
			p->max_mtu, le32_to_cpu(p->gid_tbl_len));
		return -EPROTO;
	}
	if (p->link_layer != VRDMA_WIRE_LINK_LAYER_ETHERNET) {
		dev_err(d, "QUERY_PORT: link layer %u; this driver serves Ethernet (RoCE) only\n", p->link_layer);
		return -EOPNOTSUPP;
	}
	ret = vrdma_cmd(dev, VIRTIO_RDMA_CMD_QUERY_GID, &gq, sizeof(gq), &dev->gid0, sizeof(dev->gid0));
	if (ret)
		return ret;
	if (le32_to_cpu(dev->gid0.type) != VRDMA_WIRE_GID_ROCE_V2) {
		dev_err(d, "QUERY_GID 0: GID type %u; this driver serves RoCEv2 (2) only\n", le32_to_cpu(dev->gid0.type));
		return -EOPNOTSUPP;
	}
	if (memcmp(dev->gid0.gid, dev->cfg.gid, sizeof(dev->cfg.gid)))
		dev_warn(d, "QUERY_GID 0 %pI6 differs from the config's GID %pI6; the answer is used\n", dev->gid0.gid,
			 dev->cfg.gid);
	return 0;
}

static int vrdma_probe(struct virtio_device *vdev)
{
	struct virtio_rdma_carrier_config win;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 11, 0)
	struct virtqueue_info vqs_info[] = {
		{ "control", vrdma_ctrl_done }, { "events", vrdma_event_done }, { "doorbells" }, { "state" },
	};
#define VRDMA_FIND_VQS(n) virtio_find_vqs(vdev, n, vqs, vqs_info, NULL)
#else
	vq_callback_t *callbacks[] = { vrdma_ctrl_done, vrdma_event_done, NULL, NULL };
	static const char *const names[] = { "control", "events", "doorbells", "state" };
#define VRDMA_FIND_VQS(n) virtio_find_vqs(vdev, n, vqs, callbacks, names, NULL)
#endif
	struct virtqueue *vqs[VIRTIO_RDMA_NUM_QUEUES];
	struct vrdma_dev *dev;
	bool carrier = vdev->id.device == VIRTIO_ID_BLOCK;
	int ret;

	if (carrier && !carrier_window(vdev, &win)) {
		/*
		 * Not ours: hand it back as we found it. virtio_dev_probe has already set
		 * FEATURES_OK with our (empty) feature list; a reset lets virtio_blk negotiate its own.
		 */
		virtio_reset_device(vdev);
		return -ENODEV;
	}
	if (!virtio_has_feature(vdev, VIRTIO_F_VERSION_1)) {
		dev_err(&vdev->dev, "the device does not offer VIRTIO_F_VERSION_1 (the contract is little-endian virtio 1.x)\n");
		return -ENODEV;
	}
	/* Rings and page lists are named by guest-physical address: no IOMMU between us and the device. */
	if (virtio_has_feature(vdev, VIRTIO_F_ACCESS_PLATFORM)) {
		dev_err(&vdev->dev, "the device asks for VIRTIO_F_ACCESS_PLATFORM; the contract names guest-physical addresses\n");
		return -ENODEV;
	}
	if (carrier && le32_to_cpu(win.config_size) < sizeof(struct virtio_rdma_config)) {
		dev_err(&vdev->dev, "the carrier window announces a %u-byte config; a virtio RDMA config has %zu bytes\n",
			le32_to_cpu(win.config_size), sizeof(struct virtio_rdma_config));
		return -EPROTO;
	}

	dev = kzalloc(sizeof(*dev), GFP_KERNEL);
	if (!dev)
		return -ENOMEM;
	dev->ib = vrdma_ib_alloc(dev);
	if (!dev->ib) {
		kfree(dev);
		return -ENOMEM;
	}
	dev->vdev = vdev;
	dev->carrier = carrier;
	vdev->priv = dev;
	xa_init(&dev->cqs);
	xa_init(&dev->qps);
	xa_init(&dev->kqps);
	mutex_init(&dev->state_lock);
	vrdma_doorbells_init(dev);
	ret = vrdma_cmd_init(dev);
	if (ret)
		goto err_dev;

	/*
	 * Queues 0..3; the state queue (3) is optional (docs/virtio-rdma.md "Identity and queues"):
	 * a device without it runs, and its guest's objects cannot move with it. virtio-pci says a
	 * queue is not there with -EINVAL (beyond the device's queue count) or -ENOENT (its size
	 * reads 0); any other failure (memory, interrupts) is the setup's own and fails the probe.
	 */
	ret = VRDMA_FIND_VQS(VIRTIO_RDMA_NUM_QUEUES);
	if (ret == -EINVAL || ret == -ENOENT) {
		int why = ret;

		ret = VRDMA_FIND_VQS(VIRTIO_RDMA_REQUIRED_QUEUES);
		if (!ret)
			dev_warn(&vdev->dev, "the device offers no state queue (%d): a live migration of this guest will lose its RDMA objects\n",
				 why);
		vqs[VIRTIO_RDMA_STATE_QUEUE] = NULL;
	}
#undef VRDMA_FIND_VQS
	if (ret) {
		dev_err(&vdev->dev, "cannot set up the control, event and doorbell queues (%d)\n", ret);
		goto err_cmd;
	}
	dev->ctrl_vq = vqs[VIRTIO_RDMA_CONTROL_QUEUE];
	dev->event_vq = vqs[VIRTIO_RDMA_EVENT_QUEUE];
	dev->db_vq = vqs[VIRTIO_RDMA_DOORBELL_QUEUE];
	dev->state_vq = vqs[VIRTIO_RDMA_STATE_QUEUE];
	virtio_device_ready(vdev);
	ret = vrdma_events_start(dev);
	if (ret)
		goto err_reset;
	ret = vrdma_state_start(dev);
	if (ret)
		goto err_reset;

	if (carrier) {
		ret = vrdma_cmd(dev, VIRTIO_RDMA_CMD_QUERY_CONFIG, NULL, 0, &dev->cfg, sizeof(dev->cfg));
		if (ret) {
			dev_err(&vdev->dev, "QUERY_CONFIG failed (%d)\n", ret);
			goto err_reset;
		}
		if (dev->cfg.features != win.features)
			dev_warn(&vdev->dev, "the carrier window's features %#llx differ from the config's %#llx\n",
				 le64_to_cpu(win.features), le64_to_cpu(dev->cfg.features));
	} else {
		virtio_cread_bytes(vdev, 0, &dev->cfg, sizeof(dev->cfg));
	}
	ret = check_config(dev);
	if (ret)
		goto err_reset;
	ret = query_device_once(dev);
	if (ret) {
		dev_err(&vdev->dev, "the device's attributes could not be had (%d)\n", ret);
		goto err_reset;
	}
	vrdma_find_notify(dev);
	dev_info(&vdev->dev,
		 "virtio RDMA device%s: version %u, features %#llx, GID 0 %pI6, MAC %pM, port state %u, MTU %u, max_qp %u max_cq %u max_mr %u max_pd %u max_qp_wr %u max_cqe %u max_sge %u, fw \"%*pE\"\n",
		 carrier ? " behind the vhost-user-blk carrier" : "", le16_to_cpu(dev->cfg.version),
		 le64_to_cpu(dev->cfg.features), dev->gid0.gid, dev->cfg.mac,
		 dev->pattr.state, ib_mtu_enum_to_int(dev->pattr.active_mtu),
		 le32_to_cpu(dev->dattr.max_qp), le32_to_cpu(dev->dattr.max_cq), le32_to_cpu(dev->dattr.max_mr),
		 le32_to_cpu(dev->dattr.max_pd), le32_to_cpu(dev->dattr.max_qp_wr), le32_to_cpu(dev->dattr.max_cqe),
		 le32_to_cpu(dev->dattr.max_sge), (int)strnlen(dev->dattr.fw_ver, sizeof(dev->dattr.fw_ver)),
		 dev->dattr.fw_ver);

	ret = vrdma_ib_register(dev);
	if (ret)
		goto err_reset;
	return 0;

err_reset:
	virtio_reset_device(vdev);
	vrdma_state_free(dev);
	vrdma_doorbells_reclaim(dev, true);
	vrdma_events_stop(dev);
	vdev->config->del_vqs(vdev);
	vrdma_events_free(dev);
err_cmd:
	vrdma_cmd_free(dev);
err_dev:
	vdev->priv = NULL;
	ib_dealloc_device(dev->ib);
	kfree(dev);
	return ret;
}

static void vrdma_remove(struct virtio_device *vdev)
{
	struct vrdma_dev *dev = vdev->priv;

	vrdma_events_stop(dev);
	/* ib_core destroys what users still hold (PDs: DESTROY_PD) while the device still runs. */
	vrdma_ib_unregister(dev);
	virtio_reset_device(vdev);
	vrdma_state_free(dev);
	vrdma_doorbells_reclaim(dev, true);
	vrdma_events_stop(dev);
	vdev->config->del_vqs(vdev);
	vrdma_events_free(dev);
	dev_info(&vdev->dev, "unbound: %llu control commands, %llu refused by the device, %llu events, %llu doorbells\n",
		 dev->cmds_sent, dev->cmds_refused, dev->events_seen, dev->doorbells);
	vrdma_cmd_free(dev);
	vdev->priv = NULL;
	ib_dealloc_device(dev->ib);
	kfree(dev);
}

static const struct virtio_device_id id_table[] = {
	{ VRDMA_NATIVE_ID, VIRTIO_DEV_ANY_ID },
	{ VIRTIO_ID_BLOCK, VIRTIO_DEV_ANY_ID },  /* the carrier; probe declines real disks */
	{ 0 },
};

static struct virtio_driver vrdma_driver = {
	.driver.name = KBUILD_MODNAME,
	.driver.owner = THIS_MODULE,
	.id_table = id_table,
	/* No device feature bits (no feature_table): VERSION_1 and the ring features are the transport's. */
	.probe = vrdma_probe,
	.remove = vrdma_remove,
};

module_virtio_driver(vrdma_driver);
/*
 * No MODULE_DEVICE_TABLE: the alias would load this module for every virtio disk. The carrier
 * is claimed by loading virtio_rdma before virtio_blk (modprobe softdep) or by moving the
 * function over in sysfs (docs/virtio-rdma.md "The guest kernel driver").
 */
MODULE_DESCRIPTION("virtio RDMA device driver (vrdma)");
MODULE_LICENSE("GPL");
