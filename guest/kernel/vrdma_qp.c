// SPDX-License-Identifier: GPL-2.0
/*
 * Queue pairs of processes, RC and UD (docs/virtio-rdma.md "Rings in guest memory", "Doorbell
 * queue (2)"). One kernel allocation holds the send ring, the receive ring, the device's status
 * block and the process's doorbell record (virtio_rdma_abi.h); the process maps it, writes WQEs
 * in the contract's layout and its producer indexes in the doorbell record, and asks the kernel
 * to ring with the uverbs POST_SEND / POST_RECV commands carrying no work request. The kernel
 * parses no WQE: it checks the producer index and sends the DB_SQ / DB_RQ record. A QP on an SRQ
 * has no receive ring (vrdma_srq.c). The kernel's own QPs (no udata: RC, UD and the GSI QP
 * ib_mad makes) share the layout without a doorbell record; their work requests are written
 * and rung in vrdma_kverbs.c.
 *
 * The device speaks from one address, its GID 0; ib_core's GID table is the guest netdev's
 * (vrdma_netdev.c). A QP's address vector must name the table entry equal to the device's GID 0
 * (RoCEv2), which goes to the device as its index 0; any other entry is refused.
 */
#include <linux/slab.h>
#include <rdma/ib_cache.h>

#include "vrdma.h"

/* The attribute-mask bits the contract carries (ibv_qp_attr_mask up to IB_QP_DEST_QPN). */
#define VRDMA_QP_MASK (IB_QP_DEST_QPN * 2 - 1)

static struct virtio_rdma_qp_status *qp_status(struct vrdma_qp *qp)
{
	return qp->ring->cpu + qp->status_off;
}

static struct virtio_rdma_abi_qp_db *qp_db(struct vrdma_qp *qp)
{
	return qp->ring->cpu + qp->db_off;
}

/* A depth the device takes: a power of two >= want (at least 1), at most max; 0 if none. */
static u32 ring_depth(u32 want, u32 max)
{
	u32 d = virtio_rdma_pow2_at_least(max_t(u32, want, 1));

	return d && d <= max ? d : 0;
}

int vrdma_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *attr, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct vrdma_ucontext *uc = rdma_udata_to_drv_context(udata, struct vrdma_ucontext, ibuc);
	struct virtio_rdma_abi_create_qp_resp uresp = {};
	struct virtio_rdma_create_qp_req req = {};
	struct virtio_rdma_create_qp_resp resp;
	u32 max_wr = le32_to_cpu(dev->dattr.max_qp_wr), max_sge = le32_to_cpu(dev->dattr.max_sge);
	u32 max_inline = le32_to_cpu(dev->dattr.max_inline_data);
	u64 features = le64_to_cpu(dev->cfg.features);
	/*
	 * A kernel datagram QP's sends carry their address vector in the WQE (kernel AHs have no
	 * device object): the ring's stride holds 32 bytes more, asked as two more SGEs.
	 */
	u32 av_sges = !udata && attr->qp_type != IB_QPT_RC ? VIRTIO_RDMA_INLINE_AV_SIZE / VIRTIO_RDMA_SGE_SIZE : 0;
	u32 dev_send_sge, dev_inline, db_ring;
	u64 sq_bytes, rq_bytes, status_off;
	int ret;

	if (attr->qp_type != IB_QPT_RC && attr->qp_type != IB_QPT_UD && attr->qp_type != IB_QPT_GSI)
		return -EOPNOTSUPP;
	if (attr->qp_type == IB_QPT_UD && !(features & VIRTIO_RDMA_FEATURE_UD))
		return -EOPNOTSUPP;
	/* QP1 is the kernel's (ib_mad), on a device whose backend hands it the CM's MADs. */
	if (attr->qp_type == IB_QPT_GSI && (udata || !(features & VIRTIO_RDMA_FEATURE_GSI)))
		return -EOPNOTSUPP;
	if (attr->create_flags || attr->rwq_ind_tbl || attr->xrcd)
		return -EOPNOTSUPP;
	if (udata && (udata->outlen < sizeof(uresp) || !ib_is_udata_cleared(udata, 0, udata->inlen)))
		return -EINVAL;
	if (attr->cap.max_send_wr > max_wr || attr->cap.max_recv_wr > max_wr ||
	    max_t(u32, attr->cap.max_send_sge, 1) + av_sges > max_sge || attr->cap.max_recv_sge > max_sge ||
	    attr->cap.max_inline_data + (av_sges ? VIRTIO_RDMA_INLINE_AV_SIZE : 0) > max_inline)
		return -EINVAL;
	qp->sq_depth = ring_depth(attr->cap.max_send_wr, max_wr);
	/* On an SRQ the QP has no receive ring (the device answers a receive stride of 0). */
	qp->rq_depth = attr->srq ? 0 : ring_depth(attr->cap.max_recv_wr, max_wr);
	if (!qp->sq_depth || (!attr->srq && !qp->rq_depth))
		return -EINVAL;
	/* The device counts at least one SGE (its strides use max(1, sge)). */
	qp->max_send_sge = max_t(u32, attr->cap.max_send_sge, 1);
	qp->max_recv_sge = attr->srq ? 0 : max_t(u32, attr->cap.max_recv_sge, 1);
	qp->max_inline = attr->cap.max_inline_data;
	dev_send_sge = qp->max_send_sge + av_sges;
	dev_inline = qp->max_inline + (av_sges ? VIRTIO_RDMA_INLINE_AV_SIZE : 0);
	qp->sq_stride = virtio_rdma_send_stride(dev_send_sge, dev_inline);
	qp->rq_stride = attr->srq ? 0 : virtio_rdma_recv_stride(qp->max_recv_sge);
	if (!qp->sq_stride || (!attr->srq && !qp->rq_stride))
		return -EINVAL;
	sq_bytes = (u64)qp->sq_depth * qp->sq_stride;
	rq_bytes = (u64)qp->rq_depth * qp->rq_stride;
	status_off = PAGE_ALIGN(sq_bytes + rq_bytes);
	if (status_off + PAGE_SIZE > (u64)PAGE_SIZE << (VRDMA_ALLOC_ORDERS - 1))
		return -EINVAL;  /* larger than one physically contiguous allocation */
	qp->sq_off = 0;
	qp->rq_off = sq_bytes;  /* strides are powers of two >= 32: 64-byte aligned */
	qp->status_off = status_off;
	qp->db_off = status_off + sizeof(struct virtio_rdma_qp_status);
	mutex_init(&qp->db_mutex);
	spin_lock_init(&qp->sq_lock);
	spin_lock_init(&qp->rq_lock);
	qp->kernel = !udata;

	qp->ring = vrdma_ring_alloc(udata ? &uc->ibuc : NULL, status_off + PAGE_SIZE);
	if (IS_ERR(qp->ring)) {
		ret = PTR_ERR(qp->ring);
		qp->ring = NULL;
		return ret;
	}
	req.pd = cpu_to_le32(to_vpd(ibqp->pd)->handle);
	req.send_cq = cpu_to_le32(to_vcq(attr->send_cq)->handle);
	req.recv_cq = cpu_to_le32(to_vcq(attr->recv_cq)->handle);
	if (attr->srq) {
		struct vrdma_srq *srq = container_of(attr->srq, struct vrdma_srq, ibsrq);

		if (!vrdma_live(dev, srq->epoch)) {
			ret = -EIO;
			goto err_ring;
		}
		req.srq = cpu_to_le32(srq->handle);
	}
	req.qp_type = attr->qp_type == IB_QPT_RC    ? VIRTIO_RDMA_QPT_RC
		      : attr->qp_type == IB_QPT_GSI ? VIRTIO_RDMA_QPT_GSI
						    : VIRTIO_RDMA_QPT_UD;
	qp->sq_sig_all = attr->sq_sig_type == IB_SIGNAL_ALL_WR;
	req.sq_sig_all = qp->sq_sig_all;
	req.sq_depth = cpu_to_le32(qp->sq_depth);
	req.rq_depth = cpu_to_le32(qp->rq_depth);
	req.max_send_sge = cpu_to_le32(dev_send_sge);
	req.max_recv_sge = cpu_to_le32(qp->max_recv_sge);
	req.max_inline = cpu_to_le32(dev_inline);
	req.sq_gpa = cpu_to_le64(qp->ring->gpa + qp->sq_off);
	req.rq_gpa = cpu_to_le64(attr->srq ? 0 : qp->ring->gpa + qp->rq_off);
	req.status_gpa = cpu_to_le64(qp->ring->gpa + qp->status_off);
	qp->epoch = atomic_read(&dev->epoch);
	if (!vrdma_live(dev, to_vpd(ibqp->pd)->epoch) || !vrdma_live(dev, to_vcq(attr->send_cq)->epoch) ||
	    !vrdma_live(dev, to_vcq(attr->recv_cq)->epoch)) {
		ret = -EIO;  /* the PD or a CQ was lost with the device's objects */
		goto err_ring;
	}
	ret = vrdma_uctx_db_ring(dev, udata ? uc : NULL, qp->epoch, &db_ring);
	if (ret)
		goto err_ring;
	req.db_ring = cpu_to_le16((u16)db_ring);
	ret = vrdma_cmd_create(dev, VIRTIO_RDMA_CMD_CREATE_QP, &req, sizeof(req), &resp, sizeof(resp), &qp->handle);
	if (ret)
		goto err_ring;
	if (le32_to_cpu(resp.sq_stride) != qp->sq_stride || le32_to_cpu(resp.rq_stride) != qp->rq_stride ||
	    le32_to_cpu(resp.qp_num) > 0xffffff) {
		dev_err_ratelimited(&dev->vdev->dev, "CREATE_QP answered QPN %u, strides %u/%u (want 24 bits, %u/%u)\n",
				    le32_to_cpu(resp.qp_num), le32_to_cpu(resp.sq_stride), le32_to_cpu(resp.rq_stride),
				    qp->sq_stride, qp->rq_stride);
		ret = -EPROTO;
		goto err_ring;
	}
	ret = vrdma_file(dev, &dev->qps, VIRTIO_RDMA_CMD_CREATE_QP, qp->handle, qp, qp->epoch);
	if (ret)
		goto err_ring;
	ibqp->qp_num = le32_to_cpu(resp.qp_num);
	attr->cap.max_send_wr = qp->sq_depth;
	attr->cap.max_recv_wr = qp->rq_depth;
	attr->cap.max_send_sge = qp->max_send_sge;
	attr->cap.max_recv_sge = qp->max_recv_sge;
	attr->cap.max_inline_data = qp->max_inline;
	if (!udata) {
		/* The QP number a kernel CQ's completions name (QP1 is one per device). */
		ret = xa_insert_irq(&dev->kqps, ibqp->qp_num, qp, GFP_KERNEL);
		if (ret) {
			dev_err_ratelimited(&dev->vdev->dev, "CREATE_QP answered QPN %u, which another kernel QP has\n",
					    ibqp->qp_num);
			ret = -EPROTO;
			goto err_ring;
		}
		goto done;
	}

	uresp.mmap_offset = rdma_user_mmap_get_offset(&qp->ring->rdma);
	uresp.mmap_size = qp->ring->size;
	uresp.sq_offset = qp->sq_off;
	uresp.rq_offset = qp->rq_off;
	uresp.status_offset = qp->status_off;
	uresp.db_offset = qp->db_off;
	uresp.sq_depth = qp->sq_depth;
	uresp.rq_depth = qp->rq_depth;
	uresp.sq_stride = qp->sq_stride;
	uresp.rq_stride = qp->rq_stride;
	uresp.max_send_sge = qp->max_send_sge;
	uresp.max_recv_sge = qp->max_recv_sge;
	uresp.max_inline = qp->max_inline;
	uresp.qp_handle = qp->handle;
	uresp.qp_num = ibqp->qp_num;
	ret = ib_copy_to_udata(udata, &uresp, sizeof(uresp));
	if (ret)
		goto err_ring;
done:
	if (vrdma_live(dev, qp->epoch))
		atomic_inc(&dev->objs);
	return 0;

err_ring:
	vrdma_undo_create(dev, &dev->qps, qp, VIRTIO_RDMA_CMD_DESTROY_QP, qp->handle, qp->epoch, &qp->ring);
	return ret;
}

int vrdma_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct virtio_rdma_handle_req r = { .handle = cpu_to_le32(qp->handle) };

	xa_cmpxchg(&dev->qps, qp->handle, qp, NULL, GFP_KERNEL);
	if (qp->kernel)
		xa_cmpxchg_irq(&dev->kqps, ibqp->qp_num, qp, NULL, GFP_KERNEL);
	if (vrdma_live(dev, qp->epoch)) {
		vrdma_cmd(dev, VIRTIO_RDMA_CMD_DESTROY_QP, &r, sizeof(r), NULL, 0);
		atomic_dec(&dev->objs);
	}
	vrdma_ring_release(qp->ring, vrdma_cmd_lost(dev));
	qp->ring = NULL;
	return 0;
}

/*
 * An address vector (a QP's or an AH's) on the wire: RoCEv2 with a GRH whose source is the
 * device's own address (see the top); `qpn` names the QP in the refusal's sentence (0: an AH).
 */
int vrdma_av_to_wire(struct vrdma_dev *dev, u32 qpn, const struct rdma_ah_attr *ah, struct virtio_rdma_ah *w)
{
	const struct ib_global_route *grh = rdma_ah_read_grh(ah);

	if (ah->type != RDMA_AH_ATTR_TYPE_ROCE || !(rdma_ah_get_ah_flags(ah) & IB_AH_GRH))
		return -EINVAL;
	if (!grh->sgid_attr || grh->sgid_attr->gid_type != IB_GID_TYPE_ROCE_UDP_ENCAP ||
	    memcmp(grh->sgid_attr->gid.raw, dev->gid0.gid, sizeof(dev->gid0.gid))) {
		dev_warn_ratelimited(&dev->vdev->dev,
				     "%s %u: GID index %u is not the device's address %pI6c (RoCEv2); the device speaks from that address only\n",
				     qpn ? "QP" : "AH of PD", qpn, grh->sgid_index, dev->gid0.gid);
		return -EINVAL;
	}
	memcpy(w->dgid, grh->dgid.raw, sizeof(w->dgid));
	w->flow_label = cpu_to_le32(grh->flow_label);
	w->sgid_index = 0;  /* the device's GID 0 */
	w->hop_limit = grh->hop_limit;
	w->traffic_class = grh->traffic_class;
	w->sl = rdma_ah_get_sl(ah);
	w->port_num = 1;
	return 0;
}

int vrdma_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct virtio_rdma_modify_qp_req req = {};
	struct virtio_rdma_qp_attr *w = &req.attr;
	u8 sgid_index = qp->sgid_index;
	int ret;

	if (udata && !ib_is_udata_cleared(udata, 0, udata->inlen))
		return -EINVAL;
	if (mask & ~VRDMA_QP_MASK)
		return -EOPNOTSUPP;
	if (((mask & IB_QP_STATE) && attr->qp_state > IB_QPS_ERR) ||
	    ((mask & IB_QP_CUR_STATE) && attr->cur_qp_state > IB_QPS_ERR) ||
	    ((mask & IB_QP_PATH_MTU) && (attr->path_mtu < IB_MTU_256 || attr->path_mtu > IB_MTU_4096)) ||
	    ((mask & IB_QP_ACCESS_FLAGS) && (attr->qp_access_flags & ~0xf)) ||
	    ((mask & IB_QP_PORT) && attr->port_num != 1) || ((mask & IB_QP_PKEY_INDEX) && attr->pkey_index != 0))
		return -EINVAL;
	if (!vrdma_live(dev, qp->epoch))
		return -EIO;
	req.qp = cpu_to_le32(qp->handle);
	req.mask = cpu_to_le32(mask);
	/* The device checks every enumerated field, masked or not: unmasked ones get valid values. */
	w->qp_state = (mask & IB_QP_STATE) ? attr->qp_state : 0;
	w->cur_qp_state = (mask & IB_QP_CUR_STATE) ? attr->cur_qp_state : 0;
	w->path_mtu = (mask & IB_QP_PATH_MTU) ? attr->path_mtu : IB_MTU_1024;
	w->qp_access_flags = cpu_to_le32((mask & IB_QP_ACCESS_FLAGS) ? attr->qp_access_flags : 0);
	w->qkey = cpu_to_le32(attr->qkey);
	w->rq_psn = cpu_to_le32(attr->rq_psn);
	w->sq_psn = cpu_to_le32(attr->sq_psn);
	w->dest_qp_num = cpu_to_le32(attr->dest_qp_num);
	w->max_send_wr = cpu_to_le32(attr->cap.max_send_wr);
	w->max_recv_wr = cpu_to_le32(attr->cap.max_recv_wr);
	w->max_send_sge = cpu_to_le32(attr->cap.max_send_sge);
	w->max_recv_sge = cpu_to_le32(attr->cap.max_recv_sge);
	w->max_inline_data = cpu_to_le32(attr->cap.max_inline_data);
	w->pkey_index = 0;
	w->sq_draining = attr->sq_draining;
	w->max_rd_atomic = attr->max_rd_atomic;
	w->max_dest_rd_atomic = attr->max_dest_rd_atomic;
	w->min_rnr_timer = attr->min_rnr_timer;
	w->port_num = 1;
	w->timeout = attr->timeout;
	w->retry_cnt = attr->retry_cnt;
	w->rnr_retry = attr->rnr_retry;
	if (mask & IB_QP_AV) {
		ret = vrdma_av_to_wire(dev, qp->ibqp.qp_num, &attr->ah_attr, &w->ah);
		if (ret)
			return ret;
		qp->sgid_index = attr->ah_attr.grh.sgid_index;
	}
	ret = vrdma_cmd(dev, VIRTIO_RDMA_CMD_MODIFY_QP, &req, sizeof(req), NULL, 0);
	if (ret && (mask & IB_QP_AV))
		qp->sgid_index = sgid_index;
	return ret;
}

int vrdma_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask, struct ib_qp_init_attr *init)
{
	struct vrdma_dev *dev = to_vdev(ibqp->device);
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct virtio_rdma_handle_req r = { .handle = cpu_to_le32(qp->handle) };
	struct virtio_rdma_qp_attr w;
	union ib_gid dgid;
	int ret;

	if (!vrdma_live(dev, qp->epoch))
		return -EIO;
	ret = vrdma_cmd(dev, VIRTIO_RDMA_CMD_QUERY_QP, &r, sizeof(r), &w, sizeof(w));
	if (ret)
		return ret;
	if (w.qp_state > IB_QPS_ERR || w.cur_qp_state > IB_QPS_ERR || w.path_mtu < IB_MTU_256 ||
	    w.path_mtu > IB_MTU_4096) {
		dev_err_ratelimited(&dev->vdev->dev, "QUERY_QP answered state %u, MTU %u: out of range\n", w.qp_state,
				    w.path_mtu);
		return -EPROTO;
	}
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = w.qp_state;
	attr->cur_qp_state = w.qp_state;
	attr->path_mtu = w.path_mtu;
	attr->path_mig_state = IB_MIG_MIGRATED;
	attr->qp_access_flags = le32_to_cpu(w.qp_access_flags) & 0xf;
	attr->qkey = le32_to_cpu(w.qkey);
	attr->rq_psn = le32_to_cpu(w.rq_psn) & 0xffffff;
	attr->sq_psn = le32_to_cpu(w.sq_psn) & 0xffffff;
	attr->dest_qp_num = le32_to_cpu(w.dest_qp_num) & 0xffffff;
	attr->sq_draining = w.sq_draining;
	attr->max_rd_atomic = w.max_rd_atomic;
	attr->max_dest_rd_atomic = w.max_dest_rd_atomic;
	attr->min_rnr_timer = w.min_rnr_timer;
	attr->port_num = 1;
	attr->timeout = w.timeout;
	attr->retry_cnt = w.retry_cnt;
	attr->rnr_retry = w.rnr_retry;
	/* The caps are the rings the driver made (the device's copy says the same). */
	attr->cap.max_send_wr = qp->sq_depth;
	attr->cap.max_recv_wr = qp->rq_depth;
	attr->cap.max_send_sge = qp->max_send_sge;
	attr->cap.max_recv_sge = qp->max_recv_sge;
	attr->cap.max_inline_data = qp->max_inline;
	if (ibqp->qp_type == IB_QPT_RC) {
		memcpy(dgid.raw, w.ah.dgid, sizeof(dgid.raw));
		attr->ah_attr.type = RDMA_AH_ATTR_TYPE_ROCE;
		rdma_ah_set_grh(&attr->ah_attr, &dgid, le32_to_cpu(w.ah.flow_label) & 0xfffff, qp->sgid_index,
				w.ah.hop_limit, w.ah.traffic_class);
		rdma_ah_set_sl(&attr->ah_attr, w.ah.sl);
		rdma_ah_set_port_num(&attr->ah_attr, 1);
	}
	memset(init, 0, sizeof(*init));
	init->qp_type = ibqp->qp_type;
	init->send_cq = ibqp->send_cq;
	init->recv_cq = ibqp->recv_cq;
	init->cap = attr->cap;
	init->sq_sig_type = qp->sq_sig_all ? IB_SIGNAL_ALL_WR : IB_SIGNAL_REQ_WR;
	return 0;
}

/*
 * Rings the device for a user QP: reads the producer index the process wrote in its doorbell
 * record and sends it if it moved. The index is the process's word: it must not be more than the
 * ring's depth ahead of what the device consumed, nor behind what was rung last.
 */
static int ring_user(struct vrdma_dev *dev, struct vrdma_qp *qp, bool send)
{
	u32 prod, consumed;
	int ret;

	if (!vrdma_live(dev, qp->epoch))
		return -EIO;
	if (!send && !qp->rq_depth)
		return -EINVAL;  /* a QP on an SRQ: its receives go to the SRQ */
	mutex_lock(&qp->db_mutex);
	if (send) {
		prod = READ_ONCE(qp_db(qp)->sq_producer);
		consumed = le32_to_cpu(READ_ONCE(qp_status(qp)->sq_consumed));
		ret = vrdma_ring_producer(dev, qp->handle, VIRTIO_RDMA_DB_SQ, prod, consumed, qp->sq_depth, &qp->sq_rung);
	} else {
		prod = READ_ONCE(qp_db(qp)->rq_producer);
		consumed = le32_to_cpu(READ_ONCE(qp_status(qp)->rq_consumed));
		ret = vrdma_ring_producer(dev, qp->handle, VIRTIO_RDMA_DB_RQ, prod, consumed, qp->rq_depth, &qp->rq_rung);
	}
	mutex_unlock(&qp->db_mutex);
	return ret;
}

/* From uverbs POST_SEND: a user QP's work requests are in its mapped ring, never in `wr`. */
int vrdma_post_send(struct ib_qp *ibqp, const struct ib_send_wr *wr, const struct ib_send_wr **bad)
{
	if (to_vqp(ibqp)->kernel)
		return vrdma_kernel_post_send(to_vdev(ibqp->device), to_vqp(ibqp), wr, bad);
	if (wr) {
		*bad = wr;
		return -EINVAL;
	}
	return ring_user(to_vdev(ibqp->device), to_vqp(ibqp), true);
}

int vrdma_post_recv(struct ib_qp *ibqp, const struct ib_recv_wr *wr, const struct ib_recv_wr **bad)
{
	if (to_vqp(ibqp)->kernel)
		return vrdma_kernel_post_recv(to_vdev(ibqp->device), to_vqp(ibqp), wr, bad);
	if (wr) {
		*bad = wr;
		return -EINVAL;
	}
	return ring_user(to_vdev(ibqp->device), to_vqp(ibqp), false);
}

/* The device's qp_fatal event: the QP went to the error state (info: the first error status). */
void vrdma_qp_event(struct vrdma_dev *dev, u32 handle, u32 info)
{
	struct vrdma_qp *qp;

	xa_lock(&dev->qps);
	qp = xa_load(&dev->qps, handle);
	if (!qp) {
		xa_unlock(&dev->qps);
		dev_warn_ratelimited(&dev->vdev->dev, "event qp_fatal names QP %u, which the driver does not hold\n",
				     handle);
		return;
	}
	dev_info_ratelimited(&dev->vdev->dev, "event: QP %u (handle %u) fatal, status %u\n", qp->ibqp.qp_num, handle,
			     info);
	if (qp->ibqp.event_handler) {
		struct ib_event e = { .device = qp->ibqp.device, .event = IB_EVENT_QP_FATAL, .element.qp = &qp->ibqp };

		qp->ibqp.event_handler(&e, qp->ibqp.qp_context);
	}
	xa_unlock(&dev->qps);
}

/*
 * Address handles of processes, for UD sends: CREATE_AH with the device's GID 0 as the source;
 * the answer's handle goes to the process (virtio_rdma_abi_create_ah_resp), which writes it into
 * its UD send WQEs. Kernel AHs (no udata, possibly atomic context) are not offered: the command
 * sleeps.
 */
int vrdma_create_user_ah(struct ib_ah *ibah, struct rdma_ah_init_attr *attr, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibah->device);
	struct vrdma_ah *ah = container_of(ibah, struct vrdma_ah, ibah);
	struct vrdma_pd *pd = to_vpd(ibah->pd);
	struct virtio_rdma_abi_create_ah_resp uresp = {};
	struct virtio_rdma_create_ah_req req = {};
	struct virtio_rdma_handle_resp resp;
	int ret;

	if (!udata || !(attr->flags & RDMA_CREATE_AH_SLEEPABLE))
		return -EOPNOTSUPP;
	if (udata->outlen < sizeof(uresp) || !ib_is_udata_cleared(udata, 0, udata->inlen))
		return -EINVAL;
	ret = vrdma_av_to_wire(dev, 0, attr->ah_attr, &req.ah);
	if (ret)
		return ret;
	if (!vrdma_live(dev, pd->epoch))
		return -EIO;
	req.pd = cpu_to_le32(pd->handle);
	ah->epoch = atomic_read(&dev->epoch);
	ret = vrdma_cmd_create(dev, VIRTIO_RDMA_CMD_CREATE_AH, &req, sizeof(req), &resp, sizeof(resp), &ah->handle);
	if (ret)
		return ret;
	uresp.ah_handle = ah->handle;
	ret = ib_copy_to_udata(udata, &uresp, sizeof(uresp));
	if (ret) {
		struct virtio_rdma_handle_req d = { .handle = cpu_to_le32(ah->handle) };

		if (vrdma_live(dev, ah->epoch))
			vrdma_cmd(dev, VIRTIO_RDMA_CMD_DESTROY_AH, &d, sizeof(d), NULL, 0);
		return ret;
	}
	if (vrdma_live(dev, ah->epoch))
		atomic_inc(&dev->objs);
	return 0;
}

int vrdma_destroy_ah(struct ib_ah *ibah, u32 flags)
{
	struct vrdma_dev *dev = to_vdev(ibah->device);
	struct vrdma_ah *ah = container_of(ibah, struct vrdma_ah, ibah);
	struct virtio_rdma_handle_req r = { .handle = cpu_to_le32(ah->handle) };

	if (ah->kernel)
		return 0;  /* no device object */
	/* User AHs are destroyed by ib_uverbs, sleepable. */
	if (WARN_ON_ONCE(!(flags & RDMA_DESTROY_AH_SLEEPABLE)))
		return 0;
	if (vrdma_live(dev, ah->epoch)) {
		vrdma_cmd(dev, VIRTIO_RDMA_CMD_DESTROY_AH, &r, sizeof(r), NULL, 0);
		atomic_dec(&dev->objs);
	}
	return 0;
}
