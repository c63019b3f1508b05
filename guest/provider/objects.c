// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * libvrdma's objects with rings: CQ (ibv_create_cq and ibv_create_cq_ex), QP (ibv_create_qp and
 * ibv_create_qp_ex with send ops flags) and SRQ. Each is created through uverbs with the driver's
 * udata answer (guest/include/vrdma/virtio_rdma_abi.h), which is checked against the contract
 * (depths powers of two, at least what was asked and within GET_CONTEXT's limits, strides as the
 * contract computes them, every part inside a mapping of whole pages) before its rings are mapped.
 * An answer that fails is destroyed again and the verb fails with EPROTO and a sentence in
 * libibverbs' log.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <endian.h>

#include "vrdma.h"

/* The uverbs core responses followed by the driver's (no padding between: asserted). */
struct vrdma_create_cq_resp {
	struct ib_uverbs_create_cq_resp ibv_resp;
	struct virtio_rdma_abi_create_cq_resp drv;
};
struct vrdma_create_cq_ex_resp {
	struct ib_uverbs_ex_create_cq_resp ibv_resp;
	struct virtio_rdma_abi_create_cq_resp drv;
};
struct vrdma_create_qp_resp {
	struct ib_uverbs_create_qp_resp ibv_resp;
	struct virtio_rdma_abi_create_qp_resp drv;
};
struct vrdma_create_srq_resp {
	struct ib_uverbs_create_srq_resp ibv_resp;
	struct virtio_rdma_abi_create_srq_resp drv;
};
#define VRDMA_RESP_PACKED(t) \
	_Static_assert(offsetof(struct t, drv) == sizeof(((struct t *)0)->ibv_resp), #t " has no padding")
VRDMA_RESP_PACKED(vrdma_create_cq_resp);
VRDMA_RESP_PACKED(vrdma_create_cq_ex_resp);
VRDMA_RESP_PACKED(vrdma_create_qp_resp);
VRDMA_RESP_PACKED(vrdma_create_srq_resp);

static int is_pow2(uint32_t v)
{
	return v && !(v & (v - 1));
}

/* A part [off, off + len) lies inside a mapping of size bytes. */
static int fits(uint64_t off, uint64_t len, uint32_t size)
{
	return off <= size && len <= size - off;
}

static void *map_ring(struct ibv_context *ctx, uint64_t offset, uint32_t size)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, ctx->cmd_fd, (off_t)offset);

	return p == MAP_FAILED ? NULL : p;
}


/* ---- CQ ------------------------------------------------------------------------------------- */

/* A CQ of at least cqe entries within GET_CONTEXT's max_cqe (else EINVAL), not yet created. */
static struct vrdma_cq *cq_alloc(struct vrdma_context *vctx, int64_t cqe)
{
	if (cqe < 1 || cqe > vctx->lim.max_cqe) {
		errno = EINVAL;
		return NULL;
	}
	return calloc(1, sizeof(struct vrdma_cq));
}

/*
 * After either CREATE_CQ command: the driver's answer checked (a power-of-two depth of at least
 * cqe within max_cqe, the CQEs inside a mapping of whole pages) and the ring mapped. 0, or -1
 * with the CQ destroyed again and errno EPROTO.
 */
static int cq_from_answer(struct ibv_context *ctx, struct vrdma_cq *cq, uint32_t cqe,
			  const struct virtio_rdma_abi_create_cq_resp *r)
{
	struct vrdma_context *vctx = to_vctx(ctx);

	if (!is_pow2(r->depth) || r->depth < cqe || r->depth > vctx->lim.max_cqe || r->mmap_size % vctx->page_size ||
	    !fits(VIRTIO_RDMA_CQE_OFFSET, (uint64_t)r->depth * VIRTIO_RDMA_CQE_SIZE, r->mmap_size)) {
		vrdma_warn(ctx, "CREATE_CQ answered a ring that does not fit its depth");
		goto err_destroy;
	}
	cq->map = map_ring(ctx, r->mmap_offset, r->mmap_size);
	if (!cq->map) {
		vrdma_warn(ctx, "mmap of a CQ ring failed");
		goto err_destroy;
	}
	cq->map_size = r->mmap_size;
	cq->depth = r->depth;
	cq->handle = r->cq_handle;
	cq->next = le32toh(((struct virtio_rdma_cq_control *)cq->map)->consumer);
	cq->ipv4 = !!(vctx->lim.flags & VIRTIO_RDMA_ABI_UCTX_IPV4);
	cq->vcq.cq.cqe = (int)cq->depth;
	pthread_spin_init(&cq->lock, PTHREAD_PROCESS_PRIVATE);
	return 0;

err_destroy:
	ibv_cmd_destroy_cq(&cq->vcq.cq);
	errno = EPROTO;
	return -1;
}

struct ibv_cq *vrdma_create_cq(struct ibv_context *ctx, int cqe, struct ibv_comp_channel *channel,
			       int comp_vector)
{
	struct ibv_create_cq cmd;
	struct vrdma_create_cq_resp resp;
	struct vrdma_cq *cq = cq_alloc(to_vctx(ctx), cqe);
	int ret;

	if (!cq)
		return NULL;
	memset(&resp, 0, sizeof(resp));
	ret = ibv_cmd_create_cq(ctx, cqe, channel, comp_vector, &cq->vcq.cq, &cmd, sizeof(cmd), &resp.ibv_resp,
				sizeof(resp));
	if (ret) {
		errno = ret;
		goto err_free;
	}
	if (cq_from_answer(ctx, cq, (uint32_t)cqe, &resp.drv))
		goto err_free;
	return &cq->vcq.cq;

err_free:
	free(cq);
	return NULL;
}

/*
 * ibv_create_cq_ex: the same CREATE_CQ with the same (empty) driver request, through the extended
 * command, and the same ring; then the poll API (cq.c). What the device cannot do is refused
 * before the kernel is asked (vrdma_check_cq_ex: a timestamp, CVLAN, flow tag or TM wc_flag,
 * IGNORE_OVERRUN or a parent domain with EOPNOTSUPP; unknown comp_mask or flags bits with EINVAL).
 */
struct ibv_cq_ex *vrdma_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *attr)
{
	struct ibv_create_cq_ex cmd;
	struct vrdma_create_cq_ex_resp resp;
	struct vrdma_cq *cq;
	int ret = vrdma_check_cq_ex(attr);

	if (ret) {
		errno = ret;
		return NULL;
	}
	cq = cq_alloc(to_vctx(ctx), attr->cqe);
	if (!cq)
		return NULL;
	memset(&resp, 0, sizeof(resp));
	memset(&cmd, 0, sizeof(cmd));
	ret = ibv_cmd_create_cq_ex(ctx, attr, &cq->vcq, &cmd, sizeof(cmd), &resp.ibv_resp, sizeof(resp), 0);
	if (ret) {
		errno = ret;
		goto err_free;
	}
	if (cq_from_answer(ctx, cq, attr->cqe, &resp.drv))
		goto err_free;
	vrdma_set_cq_ex_ops(cq, attr->wc_flags);
	return &cq->vcq.cq_ex;

err_free:
	free(cq);
	return NULL;
}

int vrdma_destroy_cq(struct ibv_cq *ibcq)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	int ret = ibv_cmd_destroy_cq(ibcq);

	if (ret)
		return ret;
	munmap(cq->map, cq->map_size);
	pthread_spin_destroy(&cq->lock);
	free(cq);
	return 0;
}

/* ---- QP ------------------------------------------------------------------------------------- */


/*
 * Both ibv_create_qp and ibv_create_qp_ex: RC or UD, optionally with the send ops flags of the
 * extended send API (wr.c: flags this provider cannot do are refused with EOPNOTSUPP).
 */
struct ibv_qp *vrdma_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr)
{
	struct vrdma_context *vctx = to_vctx(ctx);
	struct ibv_create_qp cmd;
	struct vrdma_create_qp_resp resp;
	struct virtio_rdma_abi_create_qp_resp *r = &resp.drv;
	struct vrdma_qp *qp;
	struct ibv_qp_cap asked = attr->cap;  /* ibv_cmd_create_qp_ex overwrites it with the answer */
	int srq = attr->srq != NULL;

	if (attr->comp_mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) ||
	    !(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || (attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UD) ||
	    vrdma_check_send_ops(attr)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp)
		return NULL;
	memset(&resp, 0, sizeof(resp));
	/* libibverbs fills vqp's comp_mask (struct vrdma_vqp: the installed library's verbs_qp). */
	if (ibv_cmd_create_qp_ex(ctx, (struct verbs_qp *)&qp->vqp, attr, &cmd, sizeof(cmd), &resp.ibv_resp,
				 sizeof(resp)))
		goto err_free;
	/*
	 * The rings as answered: depths and strides as both sides compute them, parts inside the map.
	 * (The QPN is compared with libibverbs' qp_num: on the ioctl path the core response is unused.)
	 */
	if (r->qp_num != qp->vqp.qp.qp_num || !is_pow2(r->sq_depth) || r->sq_depth < asked.max_send_wr ||
	    r->sq_depth > vctx->lim.max_qp_wr || r->max_send_sge < asked.max_send_sge || r->max_send_sge < 1 ||
	    r->max_send_sge > vctx->lim.max_sge || r->max_inline < asked.max_inline_data ||
	    r->max_inline > vctx->lim.max_inline || r->sq_stride != virtio_rdma_send_stride(r->max_send_sge, r->max_inline) ||
	    (srq ? r->rq_depth || r->rq_stride
		 : !is_pow2(r->rq_depth) || r->rq_depth < asked.max_recv_wr || r->rq_depth > vctx->lim.max_qp_wr ||
			   r->max_recv_sge < asked.max_recv_sge || r->max_recv_sge < 1 || r->max_recv_sge > vctx->lim.max_sge ||
			   r->rq_stride != virtio_rdma_recv_stride(r->max_recv_sge)) ||
	    r->mmap_size % vctx->page_size || !fits(r->sq_offset, (uint64_t)r->sq_depth * r->sq_stride, r->mmap_size) ||
	    !fits(r->rq_offset, (uint64_t)r->rq_depth * r->rq_stride, r->mmap_size) ||
	    !fits(r->status_offset, sizeof(struct virtio_rdma_qp_status), r->mmap_size) ||
	    !fits(r->db_offset, sizeof(struct virtio_rdma_abi_qp_db), r->mmap_size) || r->sq_offset % 8 ||
	    r->rq_offset % 8 || r->status_offset % 8 || r->db_offset % 8) {
		vrdma_warn(ctx, "CREATE_QP answered rings that do not agree with the contract");
		goto err_destroy;
	}
	qp->map = map_ring(ctx, r->mmap_offset, r->mmap_size);
	if (!qp->map) {
		vrdma_warn(ctx, "mmap of a QP's rings failed");
		goto err_destroy;
	}
	qp->abi = *r;
	qp->sig_all = attr->sq_sig_all;
	attr->cap.max_send_wr = r->sq_depth;
	attr->cap.max_recv_wr = r->rq_depth;
	attr->cap.max_send_sge = r->max_send_sge;
	attr->cap.max_recv_sge = r->max_recv_sge;
	attr->cap.max_inline_data = r->max_inline;
	pthread_mutex_init(&qp->sq_lock, NULL);
	pthread_mutex_init(&qp->rq_lock, NULL);
	if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
		vrdma_set_send_ops(qp, attr->send_ops_flags);
		qp->vqp.comp_mask |= VERBS_QP_EX;  /* ibv_qp_to_qp_ex answers it */
	}
	return &qp->vqp.qp;

err_destroy:
	ibv_cmd_destroy_qp(&qp->vqp.qp);
	errno = EPROTO;
err_free:
	free(qp);
	return NULL;
}

struct ibv_qp *vrdma_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct ibv_qp_init_attr_ex ex = {
		.qp_context = attr->qp_context,
		.send_cq = attr->send_cq,
		.recv_cq = attr->recv_cq,
		.srq = attr->srq,
		.cap = attr->cap,
		.qp_type = attr->qp_type,
		.sq_sig_all = attr->sq_sig_all,
		.comp_mask = IBV_QP_INIT_ATTR_PD,
		.pd = pd,
	};
	struct ibv_qp *qp = vrdma_create_qp_ex(pd->context, &ex);

	if (qp)
		attr->cap = ex.cap;
	return qp;
}

int vrdma_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask, struct ibv_qp_init_attr *init_attr)
{
	struct ibv_query_qp cmd;

	return ibv_cmd_query_qp(ibqp, attr, attr_mask, init_attr, &cmd, sizeof(cmd));
}

int vrdma_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask)
{
	struct ibv_modify_qp cmd;

	return ibv_cmd_modify_qp(ibqp, attr, attr_mask, &cmd, sizeof(cmd));
}

int vrdma_destroy_qp(struct ibv_qp *ibqp)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	int ret = ibv_cmd_destroy_qp(ibqp);

	if (ret)
		return ret;
	munmap(qp->map, qp->abi.mmap_size);
	pthread_mutex_destroy(&qp->sq_lock);
	pthread_mutex_destroy(&qp->rq_lock);
	free(qp);
	return 0;
}

/* ---- SRQ ------------------------------------------------------------------------------------ */

struct ibv_srq *vrdma_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	struct ibv_context *ctx = pd->context;
	struct vrdma_context *vctx = to_vctx(ctx);
	struct ibv_create_srq cmd;
	struct vrdma_create_srq_resp resp;
	struct virtio_rdma_abi_create_srq_resp *r = &resp.drv;
	struct ibv_srq_attr asked = attr->attr;  /* ibv_cmd_create_srq overwrites it with the answer */
	struct vrdma_srq *srq = calloc(1, sizeof(*srq));

	if (!srq)
		return NULL;
	memset(&resp, 0, sizeof(resp));
	if (ibv_cmd_create_srq(pd, &srq->ibv_srq, attr, &cmd, sizeof(cmd), &resp.ibv_resp, sizeof(resp)))
		goto err_free;
	if (!is_pow2(r->depth) || r->depth < asked.max_wr || r->depth > vctx->lim.max_qp_wr || r->max_sge < asked.max_sge ||
	    r->max_sge < 1 ||
	    r->max_sge > vctx->lim.max_sge || r->stride != virtio_rdma_recv_stride(r->max_sge) ||
	    r->mmap_size % vctx->page_size || !fits(r->ring_offset, (uint64_t)r->depth * r->stride, r->mmap_size) ||
	    !fits(r->status_offset, sizeof(struct virtio_rdma_qp_status), r->mmap_size) ||
	    !fits(r->db_offset, sizeof(struct virtio_rdma_abi_qp_db), r->mmap_size) || r->ring_offset % 8 ||
	    r->status_offset % 8 || r->db_offset % 8) {
		vrdma_warn(ctx, "CREATE_SRQ answered a ring that does not agree with the contract");
		goto err_destroy;
	}
	srq->map = map_ring(ctx, r->mmap_offset, r->mmap_size);
	if (!srq->map) {
		vrdma_warn(ctx, "mmap of an SRQ ring failed");
		goto err_destroy;
	}
	srq->abi = *r;
	attr->attr.max_wr = r->depth;
	attr->attr.max_sge = r->max_sge;
	pthread_mutex_init(&srq->lock, NULL);
	return &srq->ibv_srq;

err_destroy:
	ibv_cmd_destroy_srq(&srq->ibv_srq);
	errno = EPROTO;
err_free:
	free(srq);
	return NULL;
}

int vrdma_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr, int mask)
{
	struct ibv_modify_srq cmd;

	return ibv_cmd_modify_srq(ibsrq, attr, mask, &cmd, sizeof(cmd));
}

int vrdma_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
	struct ibv_query_srq cmd;

	return ibv_cmd_query_srq(ibsrq, attr, &cmd, sizeof(cmd));
}

int vrdma_destroy_srq(struct ibv_srq *ibsrq)
{
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	int ret = ibv_cmd_destroy_srq(ibsrq);

	if (ret)
		return ret;
	munmap(srq->map, srq->abi.mmap_size);
	pthread_mutex_destroy(&srq->lock);
	free(srq);
	return 0;
}
