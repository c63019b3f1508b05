// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * libvrdma's extended send API (ibv_qp_ex's wr_*, rdma-core's ibv_wr_post(3)) for QPs created by
 * ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS. wr_start takes the send queue's lock; each
 * builder (wr_send, wr_rdma_write, ...) starts the next WQE in the ring at the free-running
 * producer index with qp_ex's wr_id and wr_flags, the setters (wr_set_sge*, wr_set_inline_data*,
 * wr_set_ud_addr) fill it in, and nothing is visible to the device until wr_complete stores the
 * producer into the doorbell record and rings ONE doorbell for all of them. wr_abort discards them
 * (the producer goes back: the device never read those slots). The first error (ENOMEM: the ring
 * is full; EINVAL: more SGEs than max_send_sge, inline data beyond max_inline, a UD WQE without an
 * address, a setter before any builder) is latched, the WRs after it are ignored, and wr_complete
 * returns it having posted none of the batch, as when the doorbell cannot be rung.
 */
#include <errno.h>
#include <endian.h>

#include "vrdma.h"

/* The send ops each QP type has on the device (contract opcodes 0..6, docs/virtio-rdma.md). */
#define VRDMA_RC_SEND_OPS                                                                             \
	(IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |       \
	 IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | \
	 IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)
#define VRDMA_UD_SEND_OPS (IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM)

int vrdma_check_send_ops(const struct ibv_qp_init_attr_ex *attr)
{
	uint64_t have = attr->qp_type == IBV_QPT_UD ? VRDMA_UD_SEND_OPS : VRDMA_RC_SEND_OPS;

	if (!(attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS))
		return 0;
	return attr->send_ops_flags & ~have ? EOPNOTSUPP : 0;
}

static void latch(struct vrdma_qp *qp, int err)
{
	if (!qp->wr_err)
		qp->wr_err = err;
}

/* The WQE before the next one (or wr_complete) is whole: a UD WQE has its address. */
static void finish_wqe(struct vrdma_qp *qp)
{
	if (qp->wr_cur && !qp->wr_err && qp->vqp.qp.qp_type == IBV_QPT_UD && !qp->wr_cur->ah)
		latch(qp, EINVAL);
}

/* A builder: the next WQE with qp_ex's wr_id and wr_flags, or NULL once an error is latched. */
static struct virtio_rdma_send_wqe *begin_wqe(struct ibv_qp_ex *qpx, enum ibv_wr_opcode opcode)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	struct virtio_rdma_send_wqe *h;

	finish_wqe(qp);
	qp->wr_cur = NULL;
	if (qp->wr_err)
		return NULL;
	h = vrdma_sq_next(qp);
	if (!h) {
		latch(qp, ENOMEM);
		return NULL;
	}
	qp->sq_prod++;  /* the doorbell record keeps the old value until wr_complete */
	h->wr_id = htole64(qpx->wr_id);
	h->opcode = (uint8_t)opcode;
	h->flags = vrdma_send_flags(qp, qpx->wr_flags);
	qp->wr_cur = h;
	return h;
}

/* The WQE a setter fills, or NULL (an error is latched). */
static struct virtio_rdma_send_wqe *cur_wqe(struct vrdma_qp *qp)
{
	if (!qp->wr_cur && !qp->wr_err)
		latch(qp, EINVAL);
	return qp->wr_err ? NULL : qp->wr_cur;
}

static void rdma_fields(struct virtio_rdma_send_wqe *h, uint32_t rkey, uint64_t remote_addr)
{
	h->rkey = htole32(rkey);
	h->remote_addr = htole64(remote_addr);
}

/* ---- Builders ------------------------------------------------------------------------------- */

static void wr_send(struct ibv_qp_ex *qpx)
{
	begin_wqe(qpx, IBV_WR_SEND);
}

static void wr_send_imm(struct ibv_qp_ex *qpx, __be32 imm_data)
{
	struct virtio_rdma_send_wqe *h = begin_wqe(qpx, IBV_WR_SEND_WITH_IMM);

	if (h)
		h->imm_data = htole32(imm_data);  /* as post_send: the WR's value, unchanged */
}

static void wr_rdma_write(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t remote_addr)
{
	struct virtio_rdma_send_wqe *h = begin_wqe(qpx, IBV_WR_RDMA_WRITE);

	if (h)
		rdma_fields(h, rkey, remote_addr);
}

static void wr_rdma_write_imm(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t remote_addr, __be32 imm_data)
{
	struct virtio_rdma_send_wqe *h = begin_wqe(qpx, IBV_WR_RDMA_WRITE_WITH_IMM);

	if (h) {
		rdma_fields(h, rkey, remote_addr);
		h->imm_data = htole32(imm_data);
	}
}

static void wr_rdma_read(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t remote_addr)
{
	struct virtio_rdma_send_wqe *h = begin_wqe(qpx, IBV_WR_RDMA_READ);

	if (h)
		rdma_fields(h, rkey, remote_addr);
}

static void wr_atomic_cmp_swp(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t remote_addr, uint64_t compare,
			      uint64_t swap)
{
	struct virtio_rdma_send_wqe *h = begin_wqe(qpx, IBV_WR_ATOMIC_CMP_AND_SWP);

	if (h) {
		rdma_fields(h, rkey, remote_addr);
		h->compare_add = htole64(compare);
		h->swap = htole64(swap);
	}
}

static void wr_atomic_fetch_add(struct ibv_qp_ex *qpx, uint32_t rkey, uint64_t remote_addr, uint64_t add)
{
	struct virtio_rdma_send_wqe *h = begin_wqe(qpx, IBV_WR_ATOMIC_FETCH_AND_ADD);

	if (h) {
		rdma_fields(h, rkey, remote_addr);
		h->compare_add = htole64(add);
	}
}

/* ---- Setters -------------------------------------------------------------------------------- */

static void wr_set_ud_addr(struct ibv_qp_ex *qpx, struct ibv_ah *ah, uint32_t remote_qpn, uint32_t remote_qkey)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	struct virtio_rdma_send_wqe *h = cur_wqe(qp);

	if (!h)
		return;
	if (qp->vqp.qp.qp_type != IBV_QPT_UD || !ah) {
		latch(qp, EINVAL);
		return;
	}
	h->ah = htole32(to_vah(ah)->handle);
	h->remote_qpn = htole32(remote_qpn);
	h->remote_qkey = htole32(remote_qkey);
}

static void wr_set_sge(struct ibv_qp_ex *qpx, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	struct virtio_rdma_send_wqe *h = cur_wqe(qp);
	struct ibv_sge sge = { .addr = addr, .length = length, .lkey = lkey };
	int err;

	if (h && (err = vrdma_wqe_sges(qp, h, &sge, 1)))
		latch(qp, err);
}

static void wr_set_sge_list(struct ibv_qp_ex *qpx, size_t num_sge, const struct ibv_sge *sg_list)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	struct virtio_rdma_send_wqe *h = cur_wqe(qp);
	int err;

	if (h && (err = vrdma_wqe_sges(qp, h, sg_list, num_sge)))
		latch(qp, err);
}

static void wr_set_inline_data(struct ibv_qp_ex *qpx, void *addr, size_t length)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	struct virtio_rdma_send_wqe *h = cur_wqe(qp);
	int err;

	if (h && (err = vrdma_wqe_inline(qp, h, addr, length)))
		latch(qp, err);
}

static void wr_set_inline_data_list(struct ibv_qp_ex *qpx, size_t num_buf, const struct ibv_data_buf *buf_list)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	struct virtio_rdma_send_wqe *h = cur_wqe(qp);
	int err = 0;

	if (!h)
		return;
	h->flags |= VIRTIO_RDMA_SEND_INLINE;  /* also with no buffer */
	for (size_t i = 0; i < num_buf && !err; i++)
		err = vrdma_wqe_inline(qp, h, buf_list[i].addr, buf_list[i].length);
	if (err)
		latch(qp, err);
}

/* ---- The batch ------------------------------------------------------------------------------ */

static void wr_start(struct ibv_qp_ex *qpx)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);

	pthread_mutex_lock(&qp->sq_lock);
	qp->wr_start_prod = qp->sq_prod;
	qp->wr_cur = NULL;
	qp->wr_err = 0;
}

static int wr_complete(struct ibv_qp_ex *qpx)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);
	int ret;

	finish_wqe(qp);
	qp->wr_cur = NULL;
	if (qp->wr_err) {
		qp->sq_prod = qp->wr_start_prod;
		ret = qp->wr_err;
	} else {
		ret = vrdma_sq_ring(qp, qp->wr_start_prod);
	}
	pthread_mutex_unlock(&qp->sq_lock);
	return ret;
}

static void wr_abort(struct ibv_qp_ex *qpx)
{
	struct vrdma_qp *qp = qpx_to_vqp(qpx);

	qp->sq_prod = qp->wr_start_prod;
	qp->wr_cur = NULL;
	pthread_mutex_unlock(&qp->sq_lock);
}

/* Only the builders asked for are set (rdma-core leaves the others NULL, as other providers do). */
void vrdma_set_send_ops(struct vrdma_qp *qp, uint64_t flags)
{
	struct ibv_qp_ex *qpx = vrdma_qpx(qp);

	if (flags & IBV_QP_EX_WITH_SEND)
		qpx->wr_send = wr_send;
	if (flags & IBV_QP_EX_WITH_SEND_WITH_IMM)
		qpx->wr_send_imm = wr_send_imm;
	if (flags & IBV_QP_EX_WITH_RDMA_WRITE)
		qpx->wr_rdma_write = wr_rdma_write;
	if (flags & IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM)
		qpx->wr_rdma_write_imm = wr_rdma_write_imm;
	if (flags & IBV_QP_EX_WITH_RDMA_READ)
		qpx->wr_rdma_read = wr_rdma_read;
	if (flags & IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP)
		qpx->wr_atomic_cmp_swp = wr_atomic_cmp_swp;
	if (flags & IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)
		qpx->wr_atomic_fetch_add = wr_atomic_fetch_add;
	qpx->wr_set_ud_addr = wr_set_ud_addr;
	qpx->wr_set_sge = wr_set_sge;
	qpx->wr_set_sge_list = wr_set_sge_list;
	qpx->wr_set_inline_data = wr_set_inline_data;
	qpx->wr_set_inline_data_list = wr_set_inline_data_list;
	qpx->wr_start = wr_start;
	qpx->wr_complete = wr_complete;
	qpx->wr_abort = wr_abort;
}
