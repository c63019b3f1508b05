// SPDX-License-Identifier: GPL-2.0
/*
 * Completion queues (docs/virtio-rdma.md "Rings in guest memory"): the ring (a 64-byte control
 * block, then depth 32-byte CQEs) is kernel memory the device writes. A process's CQ is mapped
 * and polled by the process; the kernel's own CQs (no udata: ib_mad's, a ULP's) are polled here
 * (vrdma_kverbs.c). Arming (req_notify_cq) is a CQ_ARM doorbell; the device's cq_completion /
 * cq_error events reach the CQ's handlers (vrdma_cq_event).
 */
#include <linux/slab.h>

#include "vrdma.h"

int vrdma_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr, VRDMA_CREATE_CQ_CTX)
{
	struct ib_udata *udata = VRDMA_CREATE_CQ_UDATA;
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct vrdma_ucontext *uc = rdma_udata_to_drv_context(udata, struct vrdma_ucontext, ibuc);
	struct virtio_rdma_abi_create_cq_resp uresp = {};
	struct virtio_rdma_create_cq_req req = {};
	struct virtio_rdma_handle_resp resp;
	u32 max_cqe = le32_to_cpu(dev->dattr.max_cqe);
	u32 db_ring;
	int ret;

	/* One completion vector (ib_device.num_comp_vectors): a ULP asking for another gets it. */
	if (attr->flags || (udata && attr->comp_vector != 0))
		return -EOPNOTSUPP;
	if (udata && (udata->outlen < sizeof(uresp) || !ib_is_udata_cleared(udata, 0, udata->inlen)))
		return -EINVAL;
	cq->kernel = !udata;
	spin_lock_init(&cq->lock);
	if (attr->cqe < 1 || attr->cqe > max_cqe)
		return -EINVAL;
	cq->depth = virtio_rdma_pow2_at_least(attr->cqe);
	if (cq->depth > max_cqe)
		return -EINVAL;
	cq->ring = vrdma_ring_alloc(udata ? &uc->ibuc : NULL,
				    VIRTIO_RDMA_CQE_OFFSET + (size_t)cq->depth * VIRTIO_RDMA_CQE_SIZE);
	if (IS_ERR(cq->ring)) {
		ret = PTR_ERR(cq->ring);
		cq->ring = NULL;
		return ret;
	}
	req.depth = cpu_to_le32(cq->depth);
	req.ring_gpa = cpu_to_le64(cq->ring->gpa);
	cq->epoch = atomic_read(&dev->epoch);
	ret = vrdma_uctx_db_ring(dev, udata ? uc : NULL, cq->epoch, &db_ring);
	if (ret)
		goto err_ring;
	req.db_ring = cpu_to_le32(db_ring);
	ret = vrdma_cmd_create(dev, VIRTIO_RDMA_CMD_CREATE_CQ, &req, sizeof(req), &resp, sizeof(resp), &cq->handle);
	if (ret)
		goto err_ring;
	ret = vrdma_file(dev, &dev->cqs, VIRTIO_RDMA_CMD_CREATE_CQ, cq->handle, cq, cq->epoch);
	if (ret)
		goto err_ring;
	ibcq->cqe = cq->depth;
	if (!udata)
		goto done;
	uresp.mmap_offset = rdma_user_mmap_get_offset(&cq->ring->rdma);
	uresp.mmap_size = cq->ring->size;
	uresp.depth = cq->depth;
	uresp.cq_handle = cq->handle;
	ret = ib_copy_to_udata(udata, &uresp, sizeof(uresp));
	if (ret)
		goto err_ring;
done:
	if (vrdma_live(dev, cq->epoch))
		atomic_inc(&dev->objs);
	return 0;

err_ring:
	vrdma_undo_create(dev, &dev->cqs, cq, VIRTIO_RDMA_CMD_DESTROY_CQ, cq->handle, cq->epoch, &cq->ring);
	return ret;
}

int vrdma_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct virtio_rdma_handle_req r = { .handle = cpu_to_le32(cq->handle) };
	int ret;

	/* No event reaches the CQ from here on (the event work looks CQs up under xa_lock). */
	xa_cmpxchg(&dev->cqs, cq->handle, cq, NULL, GFP_KERNEL);
	if (vrdma_live(dev, cq->epoch)) {
		ret = vrdma_cmd(dev, VIRTIO_RDMA_CMD_DESTROY_CQ, &r, sizeof(r), NULL, 0);
		/* ib_core destroys the CQ's QPs first, so EBUSY would be our bug. */
		WARN_ON_ONCE(ret == -EBUSY);
		atomic_dec(&dev->objs);
	}
	vrdma_ring_release(cq->ring, vrdma_cmd_lost(dev));
	cq->ring = NULL;
	return 0;
}

/* A process polls its CQ in its own mapping (uverbs POLL_CQ is refused); the kernel its own. */
int vrdma_poll_cq(struct ib_cq *ibcq, int n, struct ib_wc *wc)
{
	struct vrdma_cq *cq = to_vcq(ibcq);

	if (!cq->kernel)
		return -EOPNOTSUPP;
	return vrdma_kernel_poll_cq(to_vdev(ibcq->device), cq, n, wc);
}

int vrdma_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags)
{
	struct vrdma_dev *dev = to_vdev(ibcq->device);
	struct vrdma_cq *cq = to_vcq(ibcq);
	u32 solicited = (flags & IB_CQ_SOLICITED_MASK) == IB_CQ_SOLICITED ? 1 : 0;

	int ret;

	if (!vrdma_live(dev, cq->epoch))
		return -EIO;
	/*
	 * The device raises the event at once when the ring holds unconsumed CQEs as the arm
	 * arrives, so no completion is missed; a kernel CQ also answers IB_CQ_REPORT_MISSED_EVENTS
	 * (ib_core then polls again at once). The kernel may arm in atomic context.
	 */
	ret = vrdma_doorbell(dev, cq->handle, VIRTIO_RDMA_DB_CQ_ARM, solicited, cq->kernel ? GFP_ATOMIC : GFP_KERNEL);
	if (!ret && cq->kernel && (flags & IB_CQ_REPORT_MISSED_EVENTS) && vrdma_kernel_cq_has_cqe(cq))
		return 1;
	return ret;
}

/* The device's cq_completion (error false) or cq_error event for CQ `handle`. */
void vrdma_cq_event(struct vrdma_dev *dev, u32 handle, bool error)
{
	struct vrdma_cq *cq;

	xa_lock(&dev->cqs);
	cq = xa_load(&dev->cqs, handle);
	if (!cq) {
		xa_unlock(&dev->cqs);
		dev_warn_ratelimited(&dev->vdev->dev, "event %s names CQ %u, which the driver does not hold\n",
				     error ? "cq_error" : "cq_completion", handle);
		return;
	}
	if (!error) {
		if (cq->ibcq.comp_handler)
			cq->ibcq.comp_handler(&cq->ibcq, cq->ibcq.cq_context);
	} else if (cq->ibcq.event_handler) {
		struct ib_event e = { .device = cq->ibcq.device, .event = IB_EVENT_CQ_ERR, .element.cq = &cq->ibcq };

		cq->ibcq.event_handler(&e, cq->ibcq.cq_context);
	}
	xa_unlock(&dev->cqs);
}
