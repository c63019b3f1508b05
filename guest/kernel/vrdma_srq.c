// SPDX-License-Identifier: GPL-2.0
/*
 * Shared receive queues of processes (docs/virtio-rdma.md "Rings in guest memory"): one kernel
 * allocation holds the ring (receive WQEs), the device's status block (rq_consumed) and the
 * process's doorbell record (virtio_rdma_abi_qp_db.rq_producer); the process maps it, writes
 * receive WQEs and rings with the uverbs POST_SRQ_RECV command carrying no work request, which
 * sends a DB_SRQ record. No limit event (the contract has none), no modify; kernel SRQs are not
 * offered.
 */
#include <linux/slab.h>

#include "vrdma.h"

static struct vrdma_srq *to_vsrq(struct ib_srq *srq)
{
	return container_of(srq, struct vrdma_srq, ibsrq);
}

int vrdma_create_srq(struct ib_srq *ibsrq, struct ib_srq_init_attr *init, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibsrq->device);
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	struct vrdma_pd *pd = to_vpd(ibsrq->pd);
	struct vrdma_ucontext *uc = rdma_udata_to_drv_context(udata, struct vrdma_ucontext, ibuc);
	struct virtio_rdma_abi_create_srq_resp uresp = {};
	struct virtio_rdma_create_srq_req req = {};
	struct virtio_rdma_create_srq_resp resp;
	u32 max_wr = min(le32_to_cpu(dev->dattr.max_srq_wr), le32_to_cpu(dev->dattr.max_qp_wr));
	u32 max_sge = le32_to_cpu(dev->dattr.max_sge);
	u64 ring_bytes;
	u32 db_ring;
	int ret;

	if (!udata)
		return -EOPNOTSUPP;  /* kernel SRQs: a later slice */
	if (!(le64_to_cpu(dev->cfg.features) & VIRTIO_RDMA_FEATURE_SRQ) || init->srq_type != IB_SRQT_BASIC ||
	    init->attr.srq_limit)
		return -EOPNOTSUPP;
	if (udata->outlen < sizeof(uresp) || !ib_is_udata_cleared(udata, 0, udata->inlen))
		return -EINVAL;
	if (init->attr.max_wr > max_wr || init->attr.max_sge > max_sge)
		return -EINVAL;
	srq->depth = virtio_rdma_pow2_at_least(max_t(u32, init->attr.max_wr, 1));
	if (!srq->depth || srq->depth > max_wr)
		return -EINVAL;
	srq->max_sge = max_t(u32, init->attr.max_sge, 1);  /* the device takes 1..max_sge */
	srq->stride = virtio_rdma_recv_stride(srq->max_sge);
	ring_bytes = (u64)srq->depth * srq->stride;
	srq->status_off = PAGE_ALIGN(ring_bytes);
	srq->db_off = srq->status_off + sizeof(struct virtio_rdma_qp_status);
	if ((u64)srq->status_off + PAGE_SIZE > (u64)PAGE_SIZE << (VRDMA_ALLOC_ORDERS - 1))
		return -EINVAL;
	mutex_init(&srq->db_mutex);
	if (!vrdma_live(dev, pd->epoch))
		return -EIO;

	srq->ring = vrdma_ring_alloc(&uc->ibuc, srq->status_off + PAGE_SIZE);
	if (IS_ERR(srq->ring)) {
		ret = PTR_ERR(srq->ring);
		srq->ring = NULL;
		return ret;
	}
	req.pd = cpu_to_le32(pd->handle);
	req.depth = cpu_to_le32(srq->depth);
	req.max_sge = cpu_to_le32(srq->max_sge);
	req.ring_gpa = cpu_to_le64(srq->ring->gpa);
	req.status_gpa = cpu_to_le64(srq->ring->gpa + srq->status_off);
	srq->epoch = atomic_read(&dev->epoch);
	ret = vrdma_uctx_db_ring(dev, uc, srq->epoch, &db_ring);
	if (ret)
		goto err_ring;
	req.db_ring = cpu_to_le32(db_ring);
	ret = vrdma_cmd_create(dev, VIRTIO_RDMA_CMD_CREATE_SRQ, &req, sizeof(req), &resp, sizeof(resp), &srq->handle);
	if (ret)
		goto err_ring;
	if (le32_to_cpu(resp.stride) != srq->stride) {
		dev_err_ratelimited(&dev->vdev->dev, "CREATE_SRQ answered stride %u (want %u)\n", le32_to_cpu(resp.stride),
				    srq->stride);
		ret = -EPROTO;
		goto err_ring;
	}
	init->attr.max_wr = srq->depth;
	init->attr.max_sge = srq->max_sge;
	uresp.mmap_offset = rdma_user_mmap_get_offset(&srq->ring->rdma);
	uresp.mmap_size = srq->ring->size;
	uresp.ring_offset = 0;
	uresp.status_offset = srq->status_off;
	uresp.db_offset = srq->db_off;
	uresp.depth = srq->depth;
	uresp.stride = srq->stride;
	uresp.max_sge = srq->max_sge;
	uresp.srq_handle = srq->handle;
	ret = ib_copy_to_udata(udata, &uresp, sizeof(uresp));
	if (ret)
		goto err_ring;
	if (vrdma_live(dev, srq->epoch))
		atomic_inc(&dev->objs);
	return 0;

err_ring:
	vrdma_undo_create(dev, NULL, NULL, VIRTIO_RDMA_CMD_DESTROY_SRQ, srq->handle, srq->epoch, &srq->ring);
	return ret;
}

int vrdma_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibsrq->device);
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	struct virtio_rdma_handle_req r = { .handle = cpu_to_le32(srq->handle) };
	int ret;

	if (vrdma_live(dev, srq->epoch)) {
		ret = vrdma_cmd(dev, VIRTIO_RDMA_CMD_DESTROY_SRQ, &r, sizeof(r), NULL, 0);
		/* ib_core destroys the SRQ's QPs first, so EBUSY would be our bug. */
		WARN_ON_ONCE(ret == -EBUSY);
		atomic_dec(&dev->objs);
	}
	vrdma_ring_release(srq->ring, vrdma_cmd_lost(dev));
	srq->ring = NULL;
	return 0;
}

int vrdma_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr)
{
	struct vrdma_srq *srq = to_vsrq(ibsrq);

	attr->max_wr = srq->depth;
	attr->max_sge = srq->max_sge;
	attr->srq_limit = 0;
	return 0;
}

/* From uverbs POST_SRQ_RECV: the work requests are in the mapped ring, never in `wr`. */
int vrdma_post_srq_recv(struct ib_srq *ibsrq, const struct ib_recv_wr *wr, const struct ib_recv_wr **bad)
{
	struct vrdma_dev *dev = to_vdev(ibsrq->device);
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	struct virtio_rdma_abi_qp_db *db = srq->ring->cpu + srq->db_off;
	struct virtio_rdma_qp_status *st = srq->ring->cpu + srq->status_off;
	int ret;

	if (wr) {
		*bad = wr;
		return -EINVAL;
	}
	if (!vrdma_live(dev, srq->epoch))
		return -EIO;
	mutex_lock(&srq->db_mutex);
	ret = vrdma_ring_producer(dev, srq->handle, VIRTIO_RDMA_DB_SRQ, READ_ONCE(db->rq_producer),
				  le32_to_cpu(READ_ONCE(st->rq_consumed)), srq->depth, &srq->rung);
	mutex_unlock(&srq->db_mutex);
	return ret;
}
