// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * libvrdma's data path over the contract's rings ("Rings in guest memory", include/vrdma/
 * virtio_rdma.h) mapped from the kernel: WQEs are written at the free-running producer index, a
 * WR is refused while the ring is full by the device's sq_consumed / rq_consumed (ENOMEM), the
 * producer is stored into the doorbell record (release) and the doorbell is a record on the
 * context's doorbell ring plus a write to the device's notify address, both mapped into the
 * process (no system call), or, when the kernel gave no ring, the uverbs POST_SEND / POST_RECV /
 * POST_SRQ_RECV command carrying no work request, which the driver turns into the device's
 * doorbell. Arming a CQ is a CQ_ARM doorbell the same way (its CQEs are read in cq.c). The send
 * WQE parts here are shared with the extended send API (wr.c).
 */
#include <errno.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>
#include <endian.h>

#include "vrdma.h"

/* ---- CQ arming (polling: cq.c) -------------------------------------------------------------- */

static int doorbell_again(int err, unsigned int *tries);

int vrdma_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct vrdma_context *ctx = to_vctx(ibcq->context);
	unsigned int tries = 0;
	int err;

	do
		err = vrdma_ring_doorbell(ctx, to_vcq(ibcq)->handle, VIRTIO_RDMA_DB_CQ_ARM, solicited_only ? 1 : 0);
	while (doorbell_again(err, &tries));
	return err == ENOSYS ? ibv_cmd_req_notify_cq(ibcq, solicited_only) : err;
}

/*
 * The doorbell queue is the device's, shared by every ring of the guest: the driver answers
 * EAGAIN while it is full. The WQEs are already in the ring then, so the post waits for room
 * (the device drains the queue) for up to about a second rather than fail at once.
 */
static int doorbell_again(int err, unsigned int *tries)
{
	if (err != EAGAIN || ++*tries > 20000)
		return 0;
	if (*tries < 100)
		sched_yield();
	else
		usleep(50);
	return 1;
}

/* ---- The doorbell ring ---------------------------------------------------------------------- */

int vrdma_ring_doorbell(struct vrdma_context *ctx, uint32_t handle, uint16_t kind, uint32_t value)
{
	struct virtio_rdma_db_ring_hdr *h = (void *)ctx->dbr;
	struct virtio_rdma_doorbell *rec;
	uint32_t depth = ctx->lim.db_ring_depth, consumed, flags;
	int full;

	if (!ctx->dbr)
		return ENOSYS;
	pthread_spin_lock(&ctx->dbr_lock);
	consumed = le32toh(__atomic_load_n(&h->consumed, __ATOMIC_ACQUIRE));
	full = ctx->dbr_prod - consumed >= depth;
	if (!full) {
		rec = (void *)(ctx->dbr + VIRTIO_RDMA_DB_RING_RECORDS_OFFSET +
			       (size_t)(ctx->dbr_prod & (depth - 1)) * sizeof(*rec));
		rec->handle = htole32(handle);
		rec->kind = htole16(kind);
		rec->reserved = 0;
		rec->value = htole32(value);
		rec->reserved2 = 0;
		ctx->dbr_prod++;
		/* The record, then the producer the device reads it by. */
		__atomic_store_n(&h->producer, htole32(ctx->dbr_prod), __ATOMIC_RELEASE);
	}
	pthread_spin_unlock(&ctx->dbr_lock);
	/* The producer before the flags (the device clears them, then reads the producers). */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	flags = le32toh(__atomic_load_n(&h->flags, __ATOMIC_ACQUIRE));
	if (full || !(flags & VIRTIO_RDMA_DB_RING_NO_KICK))
		*(volatile uint16_t *)(void *)(ctx->notify_page + ctx->lim.notify_offset) = htole16(ctx->lim.notify_value);
	return full ? EAGAIN : 0;
}

/* ---- Send queue ----------------------------------------------------------------------------- */

static struct virtio_rdma_abi_qp_db *qp_db(struct vrdma_qp *qp)
{
	return (void *)(qp->map + qp->abi.db_offset);
}

static struct virtio_rdma_qp_status *qp_status(struct vrdma_qp *qp)
{
	return (void *)(qp->map + qp->abi.status_offset);
}

struct virtio_rdma_send_wqe *vrdma_sq_next(struct vrdma_qp *qp)
{
	uint32_t consumed = le32toh(__atomic_load_n(&qp_status(qp)->sq_consumed, __ATOMIC_ACQUIRE));
	uint8_t *w;

	if (qp->sq_prod - consumed >= qp->abi.sq_depth)
		return NULL;
	w = qp->map + qp->abi.sq_offset + (size_t)(qp->sq_prod & (qp->abi.sq_depth - 1)) * qp->abi.sq_stride;
	memset(w, 0, qp->abi.sq_stride);
	return (void *)w;
}

uint8_t vrdma_send_flags(const struct vrdma_qp *qp, unsigned int f)
{
	uint8_t flags = 0;

	if (f & IBV_SEND_FENCE)
		flags |= VIRTIO_RDMA_SEND_FENCE;
	if ((f & IBV_SEND_SIGNALED) || qp->sig_all)
		flags |= VIRTIO_RDMA_SEND_SIGNALED;
	if (f & IBV_SEND_SOLICITED)
		flags |= VIRTIO_RDMA_SEND_SOLICITED;
	return flags;
}

/* The WQE's gather list (it has none yet); EINVAL beyond the QP's max_send_sge. */
int vrdma_wqe_sges(const struct vrdma_qp *qp, struct virtio_rdma_send_wqe *h, const struct ibv_sge *sg, size_t n)
{
	struct virtio_rdma_sge *out = (void *)(h + 1);

	if (n > qp->abi.max_send_sge || (h->flags & VIRTIO_RDMA_SEND_INLINE))
		return EINVAL;
	for (size_t i = 0; i < n; i++) {
		out[i].addr = htole64(sg[i].addr);
		out[i].length = htole32(sg[i].length);
		out[i].lkey = htole32(sg[i].lkey);
	}
	h->num_sge = (uint8_t)n;
	return 0;
}

/* Appends len bytes to the WQE's inline data; EINVAL beyond the QP's max_inline. */
int vrdma_wqe_inline(const struct vrdma_qp *qp, struct virtio_rdma_send_wqe *h, const void *addr, size_t len)
{
	uint32_t have = le32toh(h->inline_len);

	if (h->num_sge || len > qp->abi.max_inline - have)
		return EINVAL;
	if (len)
		memcpy((uint8_t *)(h + 1) + have, addr, len);
	h->inline_len = htole32(have + (uint32_t)len);
	h->flags |= VIRTIO_RDMA_SEND_INLINE;
	return 0;
}

/* One send WR into the WQE h; 0 or an errno. */
static int write_send_wqe(struct vrdma_qp *qp, const struct ibv_send_wr *wr, struct virtio_rdma_send_wqe *h)
{
	int ret;

	if (wr->opcode > IBV_WR_ATOMIC_FETCH_AND_ADD || wr->num_sge < 0)
		return EINVAL;
	if (qp->vqp.qp.qp_type == IBV_QPT_UD && wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM)
		return EINVAL;
	h->flags = vrdma_send_flags(qp, wr->send_flags);
	if (wr->send_flags & IBV_SEND_INLINE) {
		for (int i = 0; i < wr->num_sge; i++) {
			ret = vrdma_wqe_inline(qp, h, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
			if (ret)
				return ret;
		}
		h->flags |= VIRTIO_RDMA_SEND_INLINE;  /* also with no bytes */
	} else {
		ret = vrdma_wqe_sges(qp, h, wr->sg_list, (size_t)wr->num_sge);
		if (ret)
			return ret;
	}
	h->wr_id = htole64(wr->wr_id);
	h->opcode = (uint8_t)wr->opcode;
	h->imm_data = htole32(wr->imm_data);  /* the value the WR carries, unchanged */
	switch (wr->opcode) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_RDMA_READ:
		h->remote_addr = htole64(wr->wr.rdma.remote_addr);
		h->rkey = htole32(wr->wr.rdma.rkey);
		break;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		h->remote_addr = htole64(wr->wr.atomic.remote_addr);
		h->rkey = htole32(wr->wr.atomic.rkey);
		h->compare_add = htole64(wr->wr.atomic.compare_add);
		h->swap = htole64(wr->wr.atomic.swap);
		break;
	default:
		break;
	}
	if (qp->vqp.qp.qp_type == IBV_QPT_UD) {
		if (!wr->wr.ud.ah)
			return EINVAL;
		h->ah = htole32(to_vah(wr->wr.ud.ah)->handle);
		h->remote_qpn = htole32(wr->wr.ud.remote_qpn);
		h->remote_qkey = htole32(wr->wr.ud.remote_qkey);
	}
	return 0;
}

/*
 * The WQEs from start to sq_prod made visible: the producer into the doorbell record (release),
 * then one doorbell. When it cannot be rung none of them is posted: sq_prod goes back to start.
 */
int vrdma_sq_ring(struct vrdma_qp *qp, uint32_t start)
{
	struct ibv_send_wr *bad;
	unsigned int tries = 0;
	int err;

	if (qp->sq_prod == start)
		return 0;
	__atomic_store_n(&qp_db(qp)->sq_producer, qp->sq_prod, __ATOMIC_RELEASE);
	do {
		err = vrdma_ring_doorbell(to_vctx(qp->vqp.qp.context), qp->abi.qp_handle, VIRTIO_RDMA_DB_SQ, qp->sq_prod);
		if (err == ENOSYS)
			err = ibv_cmd_post_send(&qp->vqp.qp, NULL, &bad);  /* the doorbell: no work request */
	} while (doorbell_again(err, &tries));
	if (err) {
		qp->sq_prod = start;
		__atomic_store_n(&qp_db(qp)->sq_producer, start, __ATOMIC_RELEASE);
	}
	return err;
}

int vrdma_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct ibv_send_wr *first = wr;
	uint32_t start;
	int ret = 0, err;

	pthread_mutex_lock(&qp->sq_lock);
	start = qp->sq_prod;
	for (; wr; wr = wr->next) {
		struct virtio_rdma_send_wqe *h = vrdma_sq_next(qp);

		if (!h) {
			ret = ENOMEM;
			break;
		}
		ret = write_send_wqe(qp, wr, h);
		if (ret)
			break;
		qp->sq_prod++;
	}
	*bad_wr = ret ? wr : NULL;
	err = vrdma_sq_ring(qp, start);
	if (err) {  /* not rung: none of this call's WRs is posted */
		ret = err;
		*bad_wr = first;
	}
	pthread_mutex_unlock(&qp->sq_lock);
	return ret;
}

/* ---- Receive queues ------------------------------------------------------------------------- */

/* One receive WR into the WQE at w (stride bytes, room for max_sge SGEs). */
static int write_recv_wqe(const struct ibv_recv_wr *wr, uint8_t *w, uint32_t stride, uint32_t max_sge)
{
	struct virtio_rdma_recv_wqe *h = (void *)w;
	struct virtio_rdma_sge *sg = (void *)(h + 1);

	if (wr->num_sge < 0 || (uint32_t)wr->num_sge > max_sge)
		return EINVAL;
	memset(w, 0, stride);
	for (int i = 0; i < wr->num_sge; i++) {
		sg[i].addr = htole64(wr->sg_list[i].addr);
		sg[i].length = htole32(wr->sg_list[i].length);
		sg[i].lkey = htole32(wr->sg_list[i].lkey);
	}
	h->wr_id = htole64(wr->wr_id);
	h->num_sge = htole32((uint32_t)wr->num_sge);
	return 0;
}

/* A receive ring (a QP's or an SRQ's) as post_recv_ring writes it. */
struct recv_ring {
	uint8_t *base;
	uint32_t depth, stride, max_sge;
	uint32_t *prod;				/* ours: the next slot to write */
	const __le32 *consumed;			/* the device's, in the status page */
	uint32_t *producer;			/* the doorbell page's (native order, as the kernel reads it) */
	uint32_t handle;			/* the device's QP or SRQ, for a doorbell-ring record */
	uint16_t kind;				/* VIRTIO_RDMA_DB_RQ or _SRQ */
};

/*
 * Writes the receives into the ring, publishes the producer and asks the kernel to ring the
 * doorbell (`ring`: ibv_cmd_post_recv or ibv_cmd_post_srq_recv); a full ring stops at the work
 * request that did not fit (ENOMEM). A doorbell that fails takes back every receive of the call.
 * The caller holds the ring's lock.
 */
static int post_recv_ring(struct vrdma_context *ctx, const struct recv_ring *r, struct ibv_recv_wr *wr,
			  struct ibv_recv_wr **bad_wr, int (*ring)(void *obj), void *obj)
{
	struct ibv_recv_wr *first = wr;
	uint32_t start = *r->prod;
	int ret = 0;

	for (; wr; wr = wr->next) {
		if (*r->prod - le32toh(__atomic_load_n(r->consumed, __ATOMIC_ACQUIRE)) >= r->depth) {
			ret = ENOMEM;
			break;
		}
		ret = write_recv_wqe(wr, r->base + (size_t)(*r->prod & (r->depth - 1)) * r->stride, r->stride, r->max_sge);
		if (ret)
			break;
		(*r->prod)++;
	}
	*bad_wr = ret ? wr : NULL;
	if (*r->prod != start) {
		unsigned int tries = 0;
		int err;

		__atomic_store_n(r->producer, *r->prod, __ATOMIC_RELEASE);
		do {
			err = vrdma_ring_doorbell(ctx, r->handle, r->kind, *r->prod);
			if (err == ENOSYS)
				err = ring(obj);
		} while (doorbell_again(err, &tries));
		if (err) {
			*r->prod = start;
			__atomic_store_n(r->producer, start, __ATOMIC_RELEASE);
			ret = err;
			*bad_wr = first;
		}
	}
	return ret;
}

static int ring_qp_recv(void *obj)
{
	struct ibv_recv_wr *bad;

	return ibv_cmd_post_recv(obj, NULL, &bad);
}

static int ring_srq_recv(void *obj)
{
	struct ibv_recv_wr *bad;

	return ibv_cmd_post_srq_recv(obj, NULL, &bad);
}

int vrdma_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct recv_ring r = {
		.base = qp->map + qp->abi.rq_offset, .depth = qp->abi.rq_depth, .stride = qp->abi.rq_stride,
		.max_sge = qp->abi.max_recv_sge, .prod = &qp->rq_prod, .consumed = &qp_status(qp)->rq_consumed,
		.producer = &qp_db(qp)->rq_producer, .handle = qp->abi.qp_handle, .kind = VIRTIO_RDMA_DB_RQ,
	};
	int ret;

	if (ibqp->srq) {
		*bad_wr = wr;
		return EINVAL;
	}
	pthread_mutex_lock(&qp->rq_lock);
	ret = post_recv_ring(to_vctx(ibqp->context), &r, wr, bad_wr, ring_qp_recv, ibqp);
	pthread_mutex_unlock(&qp->rq_lock);
	return ret;
}

int vrdma_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	struct recv_ring r = {
		.base = srq->map + srq->abi.ring_offset, .depth = srq->abi.depth, .stride = srq->abi.stride,
		.max_sge = srq->abi.max_sge, .prod = &srq->prod,
		.consumed = &((struct virtio_rdma_qp_status *)(void *)(srq->map + srq->abi.status_offset))->rq_consumed,
		.producer = &((struct virtio_rdma_abi_qp_db *)(void *)(srq->map + srq->abi.db_offset))->rq_producer,
		.handle = srq->abi.srq_handle, .kind = VIRTIO_RDMA_DB_SRQ,
	};
	int ret;

	pthread_mutex_lock(&srq->lock);
	ret = post_recv_ring(to_vctx(ibsrq->context), &r, wr, bad_wr, ring_srq_recv, ibsrq);
	pthread_mutex_unlock(&srq->lock);
	return ret;
}

