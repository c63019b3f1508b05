// SPDX-License-Identifier: GPL-2.0
/*
 * The kernel's own verbs (docs/virtio-rdma.md "The guest kernel driver"): what ib_mad's QP1,
 * ib_cm and kernel ULPs use. Their CQs and QPs have the same rings as a process's (created in
 * vrdma_cq.c / vrdma_qp.c without udata), but the driver writes the WQEs and reads the CQEs
 * itself, in the contract's layout, from any context: producers and the consumer index move
 * under a spinlock, doorbell records are allocated GFP_ATOMIC, nothing sleeps. Addresses in
 * SGEs are DMA addresses under the PD's local_dma_lkey (REG_DMA_MR) or an MR's iova.
 *
 * Kernel AHs can be made where nothing may sleep (ib_cm answers from the MAD completion), so
 * they make no device object: the AH keeps the address vector, and every UD or GSI send
 * carries it in the WQE (VIRTIO_RDMA_SEND_INLINE_AV).
 */
#include <linux/delay.h>
#include <linux/log2.h>
#include <linux/slab.h>
#include <rdma/ib_cache.h>

#include "vrdma.h"

/* ---- Completions ------------------------------------------------------------------------------ */

static struct virtio_rdma_cqe *cqe_at(struct vrdma_cq *cq, u32 index)
{
	return cq->ring->cpu + VIRTIO_RDMA_CQE_OFFSET + (size_t)(index & (cq->depth - 1)) * VIRTIO_RDMA_CQE_SIZE;
}

/* The CQE at the consumer index is the device's newest pass (its owner byte has that pass's phase). */
static bool cqe_ready(struct vrdma_cq *cq)
{
	return READ_ONCE(cqe_at(cq, cq->cons)->owner) == virtio_rdma_cqe_phase(cq->cons, cq->depth);
}

bool vrdma_kernel_cq_has_cqe(struct vrdma_cq *cq)
{
	unsigned long flags;
	bool ready;

	spin_lock_irqsave(&cq->lock, flags);
	ready = cqe_ready(cq);
	spin_unlock_irqrestore(&cq->lock, flags);
	return ready;
}

/*
 * One CQE into an ib_wc. The contract's status and opcode values are ibv_wc_status and
 * ibv_wc_opcode, which the kernel's enums share for every value the device writes. false: the
 * CQE names no kernel QP the driver holds (destroyed meanwhile); it is consumed and skipped.
 */
static bool wc_from_cqe(struct vrdma_dev *dev, const struct virtio_rdma_cqe *c, struct ib_wc *wc)
{
	u32 qpn = le32_to_cpu(c->qp_num);
	struct vrdma_qp *qp;

	memset(wc, 0, sizeof(*wc));
	xa_lock(&dev->kqps);
	qp = xa_load(&dev->kqps, qpn);
	xa_unlock(&dev->kqps);
	if (!qp) {
		dev_warn_ratelimited(&dev->vdev->dev, "a completion names QP %u, which no kernel QP has; dropped\n", qpn);
		return false;
	}
	wc->wr_id = le64_to_cpu(c->wr_id);
	wc->status = c->status;
	/* The contract's REG_MR completion is 10; this kernel's IB_WC_REG_MR may be another number. */
	wc->opcode = c->opcode == VIRTIO_RDMA_WC_REG_MR ? IB_WC_REG_MR : c->opcode;
	wc->vendor_err = le32_to_cpu(c->vendor_err);
	wc->byte_len = le32_to_cpu(c->byte_len);
	wc->qp = &qp->ibqp;
	wc->src_qp = le32_to_cpu(c->src_qp) & 0xffffff;
	if (c->wc_flags & VIRTIO_RDMA_WC_WITH_IMM) {
		wc->wc_flags |= IB_WC_WITH_IMM;
		wc->ex.imm_data = cpu_to_be32(le32_to_cpu(c->imm_data));
	}
	if (c->wc_flags & VIRTIO_RDMA_WC_WITH_INV) {
		/* The peer's SEND with Invalidate ended this key (a fast region of ours). */
		wc->wc_flags |= IB_WC_WITH_INVALIDATE;
		wc->ex.invalidate_rkey = le32_to_cpu(c->imm_data);
	}
	if (c->wc_flags & VIRTIO_RDMA_WC_GRH) {
		/* RoCEv2 from the device's own address family (its GID 0). */
		wc->wc_flags |= IB_WC_GRH | IB_WC_WITH_NETWORK_HDR_TYPE;
		wc->network_hdr_type = ipv6_addr_v4mapped((struct in6_addr *)dev->gid0.gid) ? RDMA_NETWORK_IPV4
											: RDMA_NETWORK_IPV6;
	}
	wc->pkey_index = 0;
	wc->port_num = 1;
	return true;
}

int vrdma_kernel_poll_cq(struct vrdma_dev *dev, struct vrdma_cq *cq, int n, struct ib_wc *wc)
{
	struct virtio_rdma_cq_control *ctl = cq->ring->cpu;
	unsigned long flags;
	int got = 0;
	bool moved = false;

	spin_lock_irqsave(&cq->lock, flags);
	while (got < n && cqe_ready(cq)) {
		/* The owner byte is written last (release): the body is read after it. */
		dma_rmb();
		if (wc_from_cqe(dev, cqe_at(cq, cq->cons), &wc[got]))
			got++;
		cq->cons++;
		moved = true;
	}
	/* The slots go back to the device: it writes no CQE over one not consumed. */
	if (moved)
		smp_store_release(&ctl->consumer, cpu_to_le32(cq->cons));
	spin_unlock_irqrestore(&cq->lock, flags);
	return got;
}

/* ---- Work requests ------------------------------------------------------------------------------ */

static struct virtio_rdma_qp_status *kqp_status(struct vrdma_qp *qp)
{
	return qp->ring->cpu + qp->status_off;
}

static void *sq_slot(struct vrdma_qp *qp, u32 index)
{
	return qp->ring->cpu + qp->sq_off + (size_t)(index & (qp->sq_depth - 1)) * qp->sq_stride;
}

static void *rq_slot(struct vrdma_qp *qp, u32 index)
{
	return qp->ring->cpu + qp->rq_off + (size_t)(index & (qp->rq_depth - 1)) * qp->rq_stride;
}

static void sges_to_wire(struct virtio_rdma_sge *out, const struct ib_sge *sg, int n)
{
	int i;

	for (i = 0; i < n; i++) {
		out[i].addr = cpu_to_le64(sg[i].addr);
		out[i].length = cpu_to_le32(sg[i].length);
		out[i].lkey = cpu_to_le32(sg[i].lkey);
	}
}

/*
 * Rings the WQEs a post wrote, [start, *prod), with one doorbell record; when it cannot be rung
 * none of them is posted: *prod goes back to start (the next doorbell would carry them). The
 * doorbell queue holds 256 records the device has not taken yet; a kernel user may post faster
 * than that one request at a time (ib_mad posts its 512 receives so), and cannot be told to come
 * back: a full queue is waited on, briefly (the device takes records as it is kicked), without
 * sleeping.
 */
#define VRDMA_DB_WAIT_US 20000
static int ring_batch(struct vrdma_dev *dev, struct vrdma_qp *qp, u16 kind, u32 *prod, u32 start)
{
	int waited, ret;

	if (*prod == start)
		return 0;
	/* The WQEs before the doorbell that names them. */
	dma_wmb();
	for (waited = 0;; waited += 5) {
		ret = vrdma_doorbell(dev, qp->handle, kind, *prod, GFP_ATOMIC);
		if (ret != -EAGAIN || waited >= VRDMA_DB_WAIT_US)
			break;
		udelay(5);
	}
	if (ret == -EAGAIN)
		dev_warn_ratelimited(&dev->vdev->dev, "QP %u: the doorbell queue stayed full for %d ms\n", qp->ibqp.qp_num,
				     VRDMA_DB_WAIT_US / 1000);
	if (ret)
		*prod = start;
	return ret;
}

static u8 send_flags_to_wire(int send_flags)
{
	return (send_flags & IB_SEND_FENCE ? VIRTIO_RDMA_SEND_FENCE : 0) |
	       (send_flags & IB_SEND_SIGNALED ? VIRTIO_RDMA_SEND_SIGNALED : 0) |
	       (send_flags & IB_SEND_SOLICITED ? VIRTIO_RDMA_SEND_SOLICITED : 0);
}

/*
 * IB_WR_REG_MR ("Fast registration"): the region's pages, as map_mr_sg left them, in its own
 * page list (the device reads it at the doorbell); the key the ULP set with
 * ib_update_fast_reg_key. The device checks the rest.
 */
static int write_reg_mr_wqe(const struct ib_send_wr *wr, void *slot)
{
	const struct ib_reg_wr *r = reg_wr(wr);
	struct vrdma_mr *mr = container_of(r->mr, struct vrdma_mr, ibmr);
	struct virtio_rdma_reg_mr_wqe *w = slot;

	if (!mr->pages || !mr->npages || !is_power_of_2(r->mr->page_size))
		return -EINVAL;
	if (wr->send_flags & ~(IB_SEND_FENCE | IB_SEND_SIGNALED))
		return -EINVAL;
	memset(w, 0, sizeof(*w));
	w->wr_id = cpu_to_le64(wr->wr_id);
	w->opcode = VIRTIO_RDMA_WR_REG_MR;
	w->flags = send_flags_to_wire(wr->send_flags);
	w->key = cpu_to_le32(r->key);
	w->iova = cpu_to_le64(r->mr->iova);
	w->mr = cpu_to_le32(mr->handle);
	/* Optional bits (relaxed ordering) are the kernel's; the device knows the first four. */
	w->access = cpu_to_le32(r->access & (IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE | IB_ACCESS_REMOTE_READ |
					     IB_ACCESS_REMOTE_ATOMIC));
	w->length = cpu_to_le64(r->mr->length);
	w->pages_gpa = cpu_to_le64(virt_to_phys(mr->pages));
	w->npages = cpu_to_le32(mr->npages);
	w->page_shift = cpu_to_le32(ilog2(r->mr->page_size));
	return 0;
}

/* One send work request into its ring slot; -EINVAL for what the device does not carry. */
static int write_send_wqe(struct vrdma_dev *dev, struct vrdma_qp *qp, const struct ib_send_wr *wr, void *slot)
{
	struct virtio_rdma_send_wqe *w = slot;
	void *body = slot + sizeof(*w);
	bool datagram = qp->ibqp.qp_type != IB_QPT_RC;
	bool fast_reg = le64_to_cpu(dev->cfg.features) & VIRTIO_RDMA_FEATURE_FAST_REG;
	u32 total = 0;
	u8 flags = 0;
	int i;

	switch (wr->opcode) {
	case IB_WR_SEND:
	case IB_WR_SEND_WITH_IMM:
		break;
	case IB_WR_REG_MR:
		if (datagram || !fast_reg)
			return -EINVAL;
		return write_reg_mr_wqe(wr, slot);
	case IB_WR_LOCAL_INV:
	case IB_WR_SEND_WITH_INV:
		if (datagram || !fast_reg)
			return -EINVAL;
		break;
	case IB_WR_RDMA_WRITE:
	case IB_WR_RDMA_WRITE_WITH_IMM:
	case IB_WR_RDMA_READ:
	case IB_WR_ATOMIC_CMP_AND_SWP:
	case IB_WR_ATOMIC_FETCH_AND_ADD:
		if (datagram)
			return -EINVAL;
		break;
	default:
		dev_dbg(&dev->vdev->dev, "QP %u: work request opcode %d is not carried\n", qp->ibqp.qp_num, wr->opcode);
		return -EINVAL;
	}
	if (wr->send_flags & ~(IB_SEND_FENCE | IB_SEND_SIGNALED | IB_SEND_SOLICITED | IB_SEND_INLINE))
		return -EINVAL;
	memset(w, 0, sizeof(*w));
	w->wr_id = cpu_to_le64(wr->wr_id);
	/* ib_wr_opcode's values up to SEND_WITH_INV are ibv_wr_opcode's, the contract's. */
	w->opcode = wr->opcode == IB_WR_LOCAL_INV ? VIRTIO_RDMA_WR_LOCAL_INV
		    : wr->opcode == IB_WR_SEND_WITH_INV ? VIRTIO_RDMA_WR_SEND_WITH_INV : wr->opcode;
	flags = send_flags_to_wire(wr->send_flags);
	if (wr->opcode == IB_WR_SEND_WITH_IMM || wr->opcode == IB_WR_RDMA_WRITE_WITH_IMM)
		w->imm_data = cpu_to_le32(be32_to_cpu(wr->ex.imm_data));
	else if (wr->opcode == IB_WR_LOCAL_INV || wr->opcode == IB_WR_SEND_WITH_INV)
		w->imm_data = cpu_to_le32(wr->ex.invalidate_rkey);
	if (wr->opcode == IB_WR_RDMA_WRITE || wr->opcode == IB_WR_RDMA_WRITE_WITH_IMM || wr->opcode == IB_WR_RDMA_READ) {
		w->remote_addr = cpu_to_le64(rdma_wr(wr)->remote_addr);
		w->rkey = cpu_to_le32(rdma_wr(wr)->rkey);
	} else if (wr->opcode == IB_WR_ATOMIC_CMP_AND_SWP || wr->opcode == IB_WR_ATOMIC_FETCH_AND_ADD) {
		w->remote_addr = cpu_to_le64(atomic_wr(wr)->remote_addr);
		w->rkey = cpu_to_le32(atomic_wr(wr)->rkey);
		w->compare_add = cpu_to_le64(atomic_wr(wr)->compare_add);
		w->swap = cpu_to_le64(atomic_wr(wr)->swap);
	}
	if (datagram) {
		struct vrdma_ah *ah = container_of(ud_wr(wr)->ah, struct vrdma_ah, ibah);

		if (ah->kernel) {
			flags |= VIRTIO_RDMA_SEND_INLINE_AV;
			memset(body, 0, VIRTIO_RDMA_INLINE_AV_SIZE);
			memcpy(body, &ah->av, sizeof(ah->av));
			body += VIRTIO_RDMA_INLINE_AV_SIZE;
		} else {
			w->ah = cpu_to_le32(ah->handle);
		}
		w->remote_qpn = cpu_to_le32(ud_wr(wr)->remote_qpn);
		w->remote_qkey = cpu_to_le32(ud_wr(wr)->remote_qkey);
	}
	if (wr->send_flags & IB_SEND_INLINE) {
		/* Inline data: the SGEs' addresses are kernel virtual addresses (as rxe reads them). */
		for (i = 0; i < wr->num_sge; i++)
			total += wr->sg_list[i].length;
		if (total > qp->max_inline)
			return -EINVAL;
		for (i = 0; i < wr->num_sge; i++) {
			memcpy(body, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
			body += wr->sg_list[i].length;
		}
		flags |= VIRTIO_RDMA_SEND_INLINE;
		w->inline_len = cpu_to_le32(total);
	} else {
		if (wr->num_sge < 0 || wr->num_sge > qp->max_send_sge)
			return -EINVAL;
		sges_to_wire(body, wr->sg_list, wr->num_sge);
		w->num_sge = wr->num_sge;
	}
	w->flags = flags;
	return 0;
}

int vrdma_kernel_post_send(struct vrdma_dev *dev, struct vrdma_qp *qp, const struct ib_send_wr *wr,
			   const struct ib_send_wr **bad)
{
	const struct ib_send_wr *first = wr;
	unsigned long flags;
	u32 start;
	int ret = 0, rung;

	spin_lock_irqsave(&qp->sq_lock, flags);
	start = qp->sq_prod;
	if (!vrdma_live(dev, qp->epoch)) {
		ret = -EIO;
		goto out;
	}
	for (; wr; wr = wr->next) {
		u32 consumed = le32_to_cpu(READ_ONCE(kqp_status(qp)->sq_consumed));

		if (qp->sq_prod - consumed >= qp->sq_depth) {
			ret = -ENOMEM;  /* the ring is full: as ib_post_send answers */
			break;
		}
		ret = write_send_wqe(dev, qp, wr, sq_slot(qp, qp->sq_prod));
		if (ret)
			break;
		qp->sq_prod++;
	}
	rung = ring_batch(dev, qp, VIRTIO_RDMA_DB_SQ, &qp->sq_prod, start);
	if (rung) {
		wr = first;
		ret = rung;
	}
out:
	if (ret)
		*bad = wr;
	spin_unlock_irqrestore(&qp->sq_lock, flags);
	return ret;
}

int vrdma_kernel_post_recv(struct vrdma_dev *dev, struct vrdma_qp *qp, const struct ib_recv_wr *wr,
			   const struct ib_recv_wr **bad)
{
	const struct ib_recv_wr *first = wr;
	unsigned long flags;
	u32 start;
	int ret = 0, rung;

	if (!qp->rq_depth) {
		*bad = wr;
		return -EINVAL;  /* a QP on an SRQ: its receives go to the SRQ */
	}
	spin_lock_irqsave(&qp->rq_lock, flags);
	start = qp->rq_prod;
	if (!vrdma_live(dev, qp->epoch)) {
		ret = -EIO;
		goto out;
	}
	for (; wr; wr = wr->next) {
		u32 consumed = le32_to_cpu(READ_ONCE(kqp_status(qp)->rq_consumed));
		struct virtio_rdma_recv_wqe *w = rq_slot(qp, qp->rq_prod);

		if (qp->rq_prod - consumed >= qp->rq_depth) {
			ret = -ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || wr->num_sge > qp->max_recv_sge) {
			ret = -EINVAL;
			break;
		}
		w->wr_id = cpu_to_le64(wr->wr_id);
		w->num_sge = cpu_to_le32(wr->num_sge);
		w->reserved = 0;
		sges_to_wire((struct virtio_rdma_sge *)(w + 1), wr->sg_list, wr->num_sge);
		qp->rq_prod++;
	}
	rung = ring_batch(dev, qp, VIRTIO_RDMA_DB_RQ, &qp->rq_prod, start);
	if (rung) {
		wr = first;
		ret = rung;
	}
out:
	if (ret)
		*bad = wr;
	spin_unlock_irqrestore(&qp->rq_lock, flags);
	return ret;
}

/* ---- Address handles ----------------------------------------------------------------------------- */

/* A kernel AH (no udata, maybe in atomic context): the address vector only, checked as a QP's. */
int vrdma_create_ah(struct ib_ah *ibah, struct rdma_ah_init_attr *attr, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibah->device);
	struct vrdma_ah *ah = container_of(ibah, struct vrdma_ah, ibah);

	if (udata)
		return vrdma_create_user_ah(ibah, attr, udata);
	ah->kernel = true;
	ah->epoch = atomic_read(&dev->epoch);
	return vrdma_av_to_wire(dev, 0, attr->ah_attr, &ah->av);
}
