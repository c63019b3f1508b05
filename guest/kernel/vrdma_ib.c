// SPDX-License-Identifier: GPL-2.0
/*
 * The ib_device: queries answered from the device (QUERY_DEVICE, QUERY_PORT), one RoCEv2 port
 * whose GID table ib_core fills from the netdev carrying the device's address (vrdma_netdev.c),
 * per-process contexts and their mmaps (vrdma_ring.c), PDs made by the device (CREATE_PD,
 * DESTROY_PD), and the user objects that move data: MRs (vrdma_mr.c), CQs (vrdma_cq.c), RC and
 * UD QPs and user AHs (vrdma_qp.c), SRQs (vrdma_srq.c).
 *
 * Not yet: kernel CQs, QPs, SRQs and AHs, DMA MRs (later slices); those verbs of ib_core's
 * mandatory list (drivers/infiniband/core/device.c, ib_device_check_mandatory) say "not
 * supported" (-EOPNOTSUPP).
 */
#include <linux/module.h>
#include <rdma/ib_cache.h>
#include <rdma/ib_mad.h>

#include "vrdma.h"

/* A device limit as ib_device_attr's int fields hold it (the device may say anything). */
static int lim(__le32 v)
{
	return (int)min_t(u32, le32_to_cpu(v), INT_MAX);
}

static int vrdma_query_device(struct ib_device *ib, struct ib_device_attr *attr, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ib);
	struct virtio_rdma_device_attr_resp a;
	int max_sge;
	int ret;

	if (udata && (udata->inlen || udata->outlen))
		return -EINVAL;
	ret = vrdma_cmd(dev, VIRTIO_RDMA_CMD_QUERY_DEVICE, NULL, 0, &a, sizeof(a));
	if (ret)
		return ret;
	max_sge = lim(a.max_sge);
	memset(attr, 0, sizeof(*attr));
	attr->fw_ver = 0;
	attr->sys_image_guid = cpu_to_be64(le64_to_cpu(a.node_guid));
	attr->max_mr_size = le64_to_cpu(a.max_mr_size);
	attr->page_size_cap = GENMASK_ULL(30, 12);  /* REG_MR's page_shift 12..30 */
	attr->vendor_id = le32_to_cpu(a.vendor_id);
	attr->vendor_part_id = le32_to_cpu(a.vendor_part_id);
	attr->max_qp = lim(a.max_qp);
	attr->max_qp_wr = lim(a.max_qp_wr);
	attr->max_send_sge = max_sge;
	attr->max_recv_sge = max_sge;
	attr->max_sge_rd = max_sge;
	attr->max_cq = lim(a.max_cq);
	attr->max_cqe = lim(a.max_cqe);
	attr->max_mr = lim(a.max_mr);
	attr->max_pd = lim(a.max_pd);
	attr->max_qp_rd_atom = lim(a.max_qp_rd_atom);
	attr->max_qp_init_rd_atom = lim(a.max_qp_init_rd_atom);
	attr->max_res_rd_atom = (int)min_t(u64, (u64)attr->max_qp_rd_atom * attr->max_qp, INT_MAX);
	attr->atomic_cap = a.atomic_cap <= IB_ATOMIC_GLOB ? a.atomic_cap : IB_ATOMIC_NONE;
	attr->max_ah = lim(a.max_ah);
	attr->max_srq = lim(a.max_srq);
	attr->max_srq_wr = lim(a.max_srq_wr);
	attr->max_srq_sge = max_sge;
	attr->max_pkeys = 1;
	attr->local_ca_ack_delay = 15;
	if (le64_to_cpu(dev->cfg.features) & VIRTIO_RDMA_FEATURE_FAST_REG) {
		/* ib_alloc_mr, IB_WR_REG_MR / LOCAL_INV, SEND with Invalidate (nvme-rdma asks for this). */
		attr->device_cap_flags |= IB_DEVICE_MEM_MGT_EXTENSIONS;
		attr->max_fast_reg_page_list_len = le32_to_cpu(dev->cfg.max_fast_reg_pages);
	}
	return 0;
}

/* The device's speed in Mbit/s as an IB speed and width (what sysfs "rate" shows). */
static void speed_of_mbps(u32 mbps, u16 *speed, u8 *width)
{
	static const struct { u32 mbps; u16 speed; u8 width; } t[] = {
		{ 2500, IB_SPEED_SDR, IB_WIDTH_1X },    { 5000, IB_SPEED_DDR, IB_WIDTH_1X },
		{ 10000, IB_SPEED_QDR, IB_WIDTH_1X },   { 14000, IB_SPEED_FDR, IB_WIDTH_1X },
		{ 25000, IB_SPEED_EDR, IB_WIDTH_1X },   { 40000, IB_SPEED_QDR, IB_WIDTH_4X },
		{ 50000, IB_SPEED_HDR, IB_WIDTH_1X },   { 100000, IB_SPEED_EDR, IB_WIDTH_4X },
		{ 200000, IB_SPEED_HDR, IB_WIDTH_4X },
	};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(t); i++) {
		if (mbps <= t[i].mbps) {
			*speed = t[i].speed;
			*width = t[i].width;
			return;
		}
	}
	*speed = IB_SPEED_NDR;
	*width = IB_WIDTH_4X;
}

static int vrdma_query_port(struct ib_device *ib, u32 port, struct ib_port_attr *attr)
{
	struct vrdma_dev *dev = to_vdev(ib);
	struct virtio_rdma_port_attr_resp p;
	u32 mbps;
	int ret;

	ret = vrdma_cmd(dev, VIRTIO_RDMA_CMD_QUERY_PORT, NULL, 0, &p, sizeof(p));
	if (ret)
		return ret;
	if (p.state < IB_PORT_DOWN || p.state > IB_PORT_ACTIVE_DEFER || p.active_mtu < IB_MTU_256 ||
	    p.active_mtu > IB_MTU_4096 || p.max_mtu < p.active_mtu || p.max_mtu > IB_MTU_4096) {
		dev_err_ratelimited(&dev->vdev->dev, "QUERY_PORT: state %u, MTU %u of %u: out of range\n", p.state,
				    p.active_mtu, p.max_mtu);
		return -EPROTO;
	}
	/* *attr comes zeroed (ib_query_port). */
	attr->state = p.state;
	attr->phys_state = p.state == IB_PORT_ACTIVE ? IB_PORT_PHYS_STATE_LINK_UP : IB_PORT_PHYS_STATE_DISABLED;
	attr->max_mtu = p.max_mtu;
	attr->active_mtu = p.active_mtu;
	attr->gid_tbl_len = VRDMA_GID_TABLE_LEN;
	attr->pkey_tbl_len = 1;
	attr->max_msg_sz = le32_to_cpu(p.max_msg_sz);
	attr->ip_gids = true;
	mbps = le32_to_cpu(p.active_speed_mbps);
	if (mbps)
		speed_of_mbps(mbps, &attr->active_speed, &attr->active_width);
	else if (ib_get_eth_speed(ib, port, &attr->active_speed, &attr->active_width))
		speed_of_mbps(2500, &attr->active_speed, &attr->active_width);
	return 0;
}

/*
 * RoCEv2. With a device that hands the guest QP1 (VIRTIO_RDMA_FEATURE_GSI) and a DMA MR for
 * kernel PDs, the port has MADs, the CM and AF_IB as rxe's has: ib_mad opens QP1 on it, ib_cm
 * and rdma_cm serve it. Without them ib_mad, ib_cm and rdma_cm leave the port alone instead of
 * failing on it.
 */
static int vrdma_port_immutable(struct ib_device *ib, u32 port, struct ib_port_immutable *im)
{
	struct vrdma_dev *dev = to_vdev(ib);
	u64 need = VIRTIO_RDMA_FEATURE_GSI | VIRTIO_RDMA_FEATURE_DMA_MR;
	struct ib_port_attr attr = {};
	int ret;

	ret = ib_query_port(ib, port, &attr);
	if (ret)
		return ret;
	im->pkey_tbl_len = attr.pkey_tbl_len;
	im->gid_tbl_len = attr.gid_tbl_len;
	if ((le64_to_cpu(dev->cfg.features) & need) == need) {
		im->core_cap_flags = RDMA_CORE_PORT_IBA_ROCE_UDP_ENCAP;
		im->max_mad_size = IB_MGMT_MAD_SIZE;
	} else {
		im->core_cap_flags = RDMA_CORE_CAP_PROT_ROCE_UDP_ENCAP;
		im->max_mad_size = 0;
	}
	return 0;
}

static enum rdma_link_layer vrdma_link_layer(struct ib_device *ib, u32 port)
{
	return IB_LINK_LAYER_ETHERNET;
}

static int vrdma_query_pkey(struct ib_device *ib, u32 port, u16 index, u16 *pkey)
{
	if (index != 0)
		return -EINVAL;
	*pkey = IB_DEFAULT_PKEY_FULL;
	return 0;
}

static void vrdma_fw_str(struct ib_device *ib, char *str)
{
	/* fw_ver came terminated and is printed escaped: it is the device's text. */
	snprintf(str, IB_FW_VERSION_NAME_MAX, "%*pE", (int)strnlen(to_vdev(ib)->dattr.fw_ver, 31),
		 to_vdev(ib)->dattr.fw_ver);
}

/*
 * A process's context: a kernel object only (the contract has no per-process device object).
 * Its answer (virtio_rdma_abi.h) gives the provider the limits it sizes rings against; a caller
 * that asks for no answer (outlen 0) gets none.
 */
static int vrdma_alloc_ucontext(struct ib_ucontext *uc, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(uc->device);
	struct vrdma_ucontext *vuc = container_of(uc, struct vrdma_ucontext, ibuc);
	struct virtio_rdma_abi_ucontext_resp r = {
		.abi_version = VIRTIO_RDMA_ABI_VERSION,
		.max_qp_wr = le32_to_cpu(dev->dattr.max_qp_wr),
		.max_cqe = le32_to_cpu(dev->dattr.max_cqe),
		.max_sge = le32_to_cpu(dev->dattr.max_sge),
		.max_inline = le32_to_cpu(dev->dattr.max_inline_data),
	};
	int ret;

	if (ipv6_addr_v4mapped((struct in6_addr *)dev->gid0.gid))
		r.flags |= VIRTIO_RDMA_ABI_UCTX_IPV4;
	mutex_init(&vuc->dbr_lock);
	vuc->dbr_epoch = -1;
	/* A provider that knows no doorbell ring asks for the first answer only, and gets no ring. */
	if (udata->outlen >= sizeof(r))
		vrdma_uctx_db_ring_init(dev, vuc, &r);
	if (!udata->outlen)
		return 0;
	ret = ib_copy_to_udata(udata, &r, min(udata->outlen, sizeof(r)));
	if (ret)
		vrdma_uctx_db_ring_free(dev, vuc);
	return ret;
}

static void vrdma_dealloc_ucontext(struct ib_ucontext *uc)
{
	vrdma_uctx_db_ring_free(to_vdev(uc->device), container_of(uc, struct vrdma_ucontext, ibuc));
}

/*
 * The device goes away (driver unbound, carrier hot-unplugged) while processes hold it open.
 * Offering this makes ib_uverbs disassociate them instead of waiting for them to exit
 * (uverbs_main.c, ib_uverbs_remove_one): it destroys their objects through the ops above while
 * the device still answers, zaps every mapping made by rdma_user_mmap_io (all of ours: the
 * rings, vrdma_ring.c) and raises IB_EVENT_DEVICE_FATAL; later calls get EIO. Nothing else of a
 * context reaches the process's memory, so there is nothing left to do here.
 */
static void vrdma_disassociate_ucontext(struct ib_ucontext *uc)
{
}

static int vrdma_alloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_pd *pd = to_vpd(ibpd);
	struct virtio_rdma_handle_resp r;
	int ret;

	/*
	 * Read before the command: a PD answered around a device-fatal event counts as lost (its
	 * DESTROY_PD is never sent: at worst the device keeps it until reset), never the reverse
	 * (a lost PD's handle named after the device started its handles over).
	 */
	pd->epoch = atomic_read(&dev->epoch);
	ret = vrdma_cmd_create(dev, VIRTIO_RDMA_CMD_CREATE_PD, NULL, 0, &r, sizeof(r), &pd->handle);
	if (ret)
		return ret;
	if (pd->epoch == atomic_read(&dev->epoch))
		atomic_inc(&dev->pds);
	return 0;
}

static int vrdma_dealloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_pd *pd = container_of(ibpd, struct vrdma_pd, ibpd);
	struct virtio_rdma_handle_req r = { .handle = cpu_to_le32(pd->handle) };
	int ret;

	/* Lost in a device-fatal event: the handle is not ours any more. */
	if (pd->epoch != atomic_read(&dev->epoch))
		return 0;
	ret = vrdma_cmd(dev, VIRTIO_RDMA_CMD_DESTROY_PD, &r, sizeof(r), NULL, 0);
	/*
	 * The PD is gone from the kernel whatever the device says (a dead device, or ENOENT from a
	 * device that broke its word). ib_core tracks users, so EBUSY would be our bug.
	 */
	WARN_ON_ONCE(ret == -EBUSY);
	atomic_dec(&dev->pds);
	return 0;
}

/* No DMA MR: the device registers no physical-address range (a kernel ULP would need one). */
static const struct ib_device_ops vrdma_ops = {
	.owner = THIS_MODULE,
	.driver_id = RDMA_DRIVER_UNKNOWN,
	.uverbs_abi_ver = VRDMA_UVERBS_ABI_VERSION,

	.query_device = vrdma_query_device,
	.query_port = vrdma_query_port,
	.get_port_immutable = vrdma_port_immutable,
	.get_link_layer = vrdma_link_layer,
	.query_pkey = vrdma_query_pkey,
	.get_dev_fw_str = vrdma_fw_str,
	.alloc_ucontext = vrdma_alloc_ucontext,
	.dealloc_ucontext = vrdma_dealloc_ucontext,
	.disassociate_ucontext = vrdma_disassociate_ucontext,
	.alloc_pd = vrdma_alloc_pd,
	.dealloc_pd = vrdma_dealloc_pd,
	.mmap = vrdma_mmap,
	.mmap_free = vrdma_mmap_free,

	.create_cq = vrdma_create_cq,
	.destroy_cq = vrdma_destroy_cq,
	.poll_cq = vrdma_poll_cq,
	.req_notify_cq = vrdma_req_notify_cq,
	.create_qp = vrdma_create_qp,
	.modify_qp = vrdma_modify_qp,
	.query_qp = vrdma_query_qp,
	.create_srq = vrdma_create_srq,
	.destroy_srq = vrdma_destroy_srq,
	.query_srq = vrdma_query_srq,
	.post_srq_recv = vrdma_post_srq_recv,
	.create_ah = vrdma_create_ah,
	.create_user_ah = vrdma_create_user_ah,
	.destroy_ah = vrdma_destroy_ah,
	.destroy_qp = vrdma_destroy_qp,
	.post_send = vrdma_post_send,
	.post_recv = vrdma_post_recv,
	.get_dma_mr = vrdma_get_dma_mr,
	.alloc_mr = vrdma_alloc_mr,
	.map_mr_sg = vrdma_map_mr_sg,
	.reg_user_mr = vrdma_reg_user_mr,
	.dereg_mr = vrdma_dereg_mr,

	INIT_RDMA_OBJ_SIZE(ib_ucontext, vrdma_ucontext, ibuc),
	INIT_RDMA_OBJ_SIZE(ib_pd, vrdma_pd, ibpd),
	INIT_RDMA_OBJ_SIZE(ib_cq, vrdma_cq, ibcq),
	INIT_RDMA_OBJ_SIZE(ib_qp, vrdma_qp, ibqp),
	INIT_RDMA_OBJ_SIZE(ib_ah, vrdma_ah, ibah),
	INIT_RDMA_OBJ_SIZE(ib_srq, vrdma_srq, ibsrq),
};

struct ib_device *vrdma_ib_alloc(struct vrdma_dev *dev)
{
	struct vrdma_ibdev *v = ib_alloc_device(vrdma_ibdev, ib);

	if (!v)
		return NULL;
	v->dev = dev;
	return &v->ib;
}

/* NAME: "vrdma%d", or the name of the registration this one replaces. */
static int register_as(struct vrdma_dev *dev, const char *name)
{
	struct ib_device *ib = dev->ib;
	int ret;

	ib->node_type = RDMA_NODE_IB_CA;
	ib->phys_port_cnt = 1;
	ib->num_comp_vectors = 1;
	ib->node_guid = cpu_to_be64(le64_to_cpu(dev->dattr.node_guid));
	ib->dev.parent = &dev->vdev->dev;
	strscpy(ib->node_desc, "vrdma virtio RDMA device", sizeof(ib->node_desc));
	/*
	 * Write commands ib_core leaves off by default (device.c, _ib_alloc_device): the doorbells of
	 * user QPs and SRQs (POST_SEND / POST_RECV / POST_SRQ_RECV with no work request, vrdma_qp.c,
	 * vrdma_srq.c) and arming a CQ.
	 */
	ib->uverbs_cmd_mask |= BIT_ULL(IB_USER_VERBS_CMD_POST_SEND) | BIT_ULL(IB_USER_VERBS_CMD_POST_RECV) |
			       BIT_ULL(IB_USER_VERBS_CMD_POST_SRQ_RECV) | BIT_ULL(IB_USER_VERBS_CMD_REQ_NOTIFY_CQ);
	ib_set_device_ops(ib, &vrdma_ops);

	ret = vrdma_netdev_watch_unregister(dev);
	if (ret)
		return ret;
	/* The netdev with the device's address now, if the guest has it already; later otherwise. */
	vrdma_netdev_bind_now(dev);
	ret = ib_register_device(ib, name, dev->vdev->dev.parent);
	if (ret) {
		dev_err(&dev->vdev->dev, "ib_register_device failed (%d)\n", ret);
		vrdma_netdev_unwatch(dev);
		return ret;
	}
	dev->registered = true;
	ret = vrdma_netdev_watch_address(dev);
	if (ret) {
		vrdma_ib_unregister(dev);
		return ret;
	}
	dev_info(&dev->vdev->dev, "registered %s (RoCEv2, netdev %s)\n", dev_name(&ib->dev),
		 dev->ndev ? netdev_name(dev->ndev) : "none yet");
	return 0;
}

int vrdma_ib_register(struct vrdma_dev *dev)
{
	return register_as(dev, "vrdma%d");
}

void vrdma_ib_unregister(struct vrdma_dev *dev)
{
	if (!dev->registered)
		return;
	vrdma_netdev_unwatch(dev);
	ib_unregister_device(dev->ib);
	dev->registered = false;
}

/*
 * After a device-fatal event that lost objects (from the event work, so no other event and no
 * unbind runs meanwhile: vrdma_remove stops the events first). ib_core's users of the old
 * registration hold objects the device no longer has, and ib_mad would never make its QP1 again:
 * RDMA-CM and in-kernel users would stay dead. The old ib_device is unregistered (ib_core destroys
 * what its users hold: in the kernel only, the epoch; processes' uverbs files are disassociated,
 * their calls fail with EIO; RDMA-CM's users get RDMA_CM_EVENT_DEVICE_REMOVAL) and a new one is
 * registered under the same name, on which ib_mad, ib_cm and applications that open the device
 * again start over, as after mlx5's recovery from a fatal error.
 */
void vrdma_ib_reregister(struct vrdma_dev *dev)
{
	struct device *d = &dev->vdev->dev;
	struct ib_device *old = dev->ib, *fresh;
	char name[IB_DEVICE_NAME_MAX];
	int ret;

	if (!dev->registered)
		return;
	fresh = vrdma_ib_alloc(dev);
	if (!fresh) {
		dev_err(d, "no memory for a new registration: %s stays without its lost objects; unbind and bind the driver to start it over\n",
			dev_name(&old->dev));
		return;
	}
	strscpy(name, dev_name(&old->dev), sizeof(name));
	vrdma_ib_unregister(dev);
	dev->ib = fresh;
	ib_dealloc_device(old);
	WRITE_ONCE(dev->ndev, NULL);  /* the netdev was the old registration's port's */
	ret = register_as(dev, name);
	if (ret == -ENFILE || ret == -EEXIST)
		ret = vrdma_ib_register(dev);
	if (ret) {
		dev_err(d, "%s could not be registered again (%d): no RDMA device until the driver is bound again\n", name, ret);
		return;
	}
	dev_info(d, "%s registered again after the device lost the guest's objects: open it again\n", dev_name(&dev->ib->dev));
}
