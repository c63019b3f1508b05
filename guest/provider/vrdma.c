// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * libvrdma: the rdma-core (libibverbs) provider of virtio_rdma.ko's devices (docs/virtio-rdma.md
 * "The rdma-core provider"). Control verbs are the uverbs write() commands (ibv_cmd_*) with the
 * driver's udata (guest/include/vrdma/virtio_rdma_abi.h); the data path is the device's rings
 * (include/vrdma/virtio_rdma.h), which the kernel allocates and this library maps: WQEs are
 * written into the mapped send/receive ring, the producer index into the doorbell record, and
 * the doorbell is the uverbs POST_SEND / POST_RECV / POST_SRQ_RECV command carrying no work
 * request. Completions are read from the mapped CQ ring by the owner/phase rule and the
 * consumer index written back. Every value the kernel answers in udata is checked before use.
 *
 * Built against rdma-core's provider headers (guest/provider/build.sh), matched by device name
 * ("vrdma*"): the module registers RDMA_DRIVER_UNKNOWN.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sched.h>
#include <unistd.h>
#include <endian.h>

#include <infiniband/driver.h>
#include <infiniband/verbs.h>

#include <vrdma/virtio_rdma.h>
#include <vrdma/virtio_rdma_abi.h>

struct vrdma_device {
	struct verbs_device ibv_dev;
};

struct vrdma_context {
	struct verbs_context ibv_ctx;
	struct virtio_rdma_abi_ucontext_resp lim;
	long page_size;
};

struct vrdma_cq {
	struct ibv_cq ibv_cq;
	pthread_spinlock_t lock;
	uint8_t *map;
	uint32_t map_size, depth, next;
};

struct vrdma_qp {
	struct ibv_qp ibv_qp;
	pthread_mutex_t sq_lock, rq_lock;  /* a post may wait for the doorbell queue */
	uint8_t *map;
	struct virtio_rdma_abi_create_qp_resp abi;
	uint32_t sq_prod, rq_prod;
	int sig_all;
};

struct vrdma_srq {
	struct ibv_srq ibv_srq;
	pthread_mutex_t lock;
	uint8_t *map;
	struct virtio_rdma_abi_create_srq_resp abi;
	uint32_t prod;
};

struct vrdma_ah {
	struct ibv_ah ibv_ah;
	uint32_t handle;
};

/* The uverbs core responses followed by the driver's (no padding between: asserted). */
struct vrdma_get_context_resp {
	struct ib_uverbs_get_context_resp ibv_resp;
	struct virtio_rdma_abi_ucontext_resp drv;
};
struct vrdma_create_cq_resp {
	struct ib_uverbs_create_cq_resp ibv_resp;
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
struct vrdma_create_ah_resp {
	struct ib_uverbs_create_ah_resp ibv_resp;
	struct virtio_rdma_abi_create_ah_resp drv;
};
#define VRDMA_RESP_PACKED(t) \
	_Static_assert(offsetof(struct t, drv) == sizeof(((struct t *)0)->ibv_resp), #t " has no padding")
VRDMA_RESP_PACKED(vrdma_get_context_resp);
VRDMA_RESP_PACKED(vrdma_create_cq_resp);
VRDMA_RESP_PACKED(vrdma_create_qp_resp);
VRDMA_RESP_PACKED(vrdma_create_srq_resp);
VRDMA_RESP_PACKED(vrdma_create_ah_resp);

#define to_vctx(c) container_of(c, struct vrdma_context, ibv_ctx.context)
#define to_vcq(c) container_of(c, struct vrdma_cq, ibv_cq)
#define to_vqp(q) container_of(q, struct vrdma_qp, ibv_qp)
#define to_vsrq(s) container_of(s, struct vrdma_srq, ibv_srq)
#define to_vah(a) container_of(a, struct vrdma_ah, ibv_ah)

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

static void warn(struct ibv_context *ctx, const char *what)
{
	verbs_err(verbs_get_ctx(ctx), "vrdma: %s\n", what);
}

/* ---- Device and port ----------------------------------------------------------------------- */

static int vrdma_query_device(struct ibv_context *ctx, const struct ibv_query_device_ex_input *input,
			      struct ibv_device_attr_ex *attr, size_t attr_size)
{
	struct ib_uverbs_ex_query_device_resp resp;
	size_t resp_size = sizeof(resp);

	return ibv_cmd_query_device_any(ctx, input, attr, attr_size, &resp, &resp_size);
}

static int vrdma_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	struct ibv_query_port cmd;

	return ibv_cmd_query_port(ctx, port, attr, &cmd, sizeof(cmd));
}

/* ---- PD, MR --------------------------------------------------------------------------------- */

static struct ibv_pd *vrdma_alloc_pd(struct ibv_context *ctx)
{
	struct ibv_alloc_pd cmd;
	struct ib_uverbs_alloc_pd_resp resp;
	struct ibv_pd *pd = calloc(1, sizeof(*pd));

	if (!pd)
		return NULL;
	if (ibv_cmd_alloc_pd(ctx, pd, &cmd, sizeof(cmd), &resp, sizeof(resp))) {
		free(pd);
		return NULL;
	}
	return pd;
}

static int vrdma_dealloc_pd(struct ibv_pd *pd)
{
	int ret = ibv_cmd_dealloc_pd(pd);

	if (!ret)
		free(pd);
	return ret;
}

static struct ibv_mr *vrdma_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t hca_va, int access)
{
	struct ibv_reg_mr cmd;
	struct ib_uverbs_reg_mr_resp resp;
	struct verbs_mr *vmr = calloc(1, sizeof(*vmr));

	if (!vmr)
		return NULL;
	if (ibv_cmd_reg_mr(pd, addr, length, hca_va, access, vmr, &cmd, sizeof(cmd), &resp, sizeof(resp))) {
		free(vmr);
		return NULL;
	}
	return &vmr->ibv_mr;
}

static int vrdma_dereg_mr(struct verbs_mr *vmr)
{
	int ret = ibv_cmd_dereg_mr(vmr);

	if (!ret)
		free(vmr);
	return ret;
}

/* ---- CQ ------------------------------------------------------------------------------------- */

static struct ibv_cq *vrdma_create_cq(struct ibv_context *ctx, int cqe, struct ibv_comp_channel *channel,
				      int comp_vector)
{
	struct vrdma_context *vctx = to_vctx(ctx);
	struct ibv_create_cq cmd;
	struct vrdma_create_cq_resp resp;
	struct vrdma_cq *cq;

	if (cqe < 1 || (uint32_t)cqe > vctx->lim.max_cqe) {
		errno = EINVAL;
		return NULL;
	}
	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return NULL;
	memset(&resp, 0, sizeof(resp));
	if (ibv_cmd_create_cq(ctx, cqe, channel, comp_vector, &cq->ibv_cq, &cmd, sizeof(cmd), &resp.ibv_resp,
			      sizeof(resp)))
		goto err_free;
	if (!is_pow2(resp.drv.depth) || resp.drv.depth < (uint32_t)cqe || resp.drv.depth > vctx->lim.max_cqe ||
	    resp.drv.mmap_size % vctx->page_size ||
	    !fits(VIRTIO_RDMA_CQE_OFFSET, (uint64_t)resp.drv.depth * VIRTIO_RDMA_CQE_SIZE, resp.drv.mmap_size)) {
		warn(ctx, "CREATE_CQ answered a ring that does not fit its depth");
		goto err_destroy;
	}
	cq->map = map_ring(ctx, resp.drv.mmap_offset, resp.drv.mmap_size);
	if (!cq->map) {
		warn(ctx, "mmap of a CQ ring failed");
		goto err_destroy;
	}
	cq->map_size = resp.drv.mmap_size;
	cq->depth = resp.drv.depth;
	cq->next = le32toh(((struct virtio_rdma_cq_control *)cq->map)->consumer);
	cq->ibv_cq.cqe = (int)cq->depth;
	pthread_spin_init(&cq->lock, PTHREAD_PROCESS_PRIVATE);
	return &cq->ibv_cq;

err_destroy:
	ibv_cmd_destroy_cq(&cq->ibv_cq);
	errno = EPROTO;
err_free:
	free(cq);
	return NULL;
}

static int vrdma_destroy_cq(struct ibv_cq *ibcq)
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

static void cqe_to_wc(const struct virtio_rdma_cqe *e, struct ibv_wc *wc)
{
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = le64toh(e->wr_id);
	wc->status = (enum ibv_wc_status)e->status;
	wc->opcode = (enum ibv_wc_opcode)e->opcode;
	wc->vendor_err = le32toh(e->vendor_err);
	wc->byte_len = le32toh(e->byte_len);
	wc->imm_data = le32toh(e->imm_data);  /* the value the peer put in its WR, unchanged */
	wc->qp_num = le32toh(e->qp_num);
	wc->src_qp = le32toh(e->src_qp);
	if (e->wc_flags & VIRTIO_RDMA_WC_WITH_IMM)
		wc->wc_flags |= IBV_WC_WITH_IMM;
	if (e->wc_flags & VIRTIO_RDMA_WC_GRH)
		wc->wc_flags |= IBV_WC_GRH;
}

static int vrdma_poll_cq(struct ibv_cq *ibcq, int num, struct ibv_wc *wc)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	struct virtio_rdma_cq_control *ctl = (void *)cq->map;
	int n = 0;

	pthread_spin_lock(&cq->lock);
	while (n < num) {
		const struct virtio_rdma_cqe *e =
			(const void *)(cq->map + VIRTIO_RDMA_CQE_OFFSET + (cq->next & (cq->depth - 1)) * VIRTIO_RDMA_CQE_SIZE);

		/* The owner byte is written last by the device (release): acquire it, then the body. */
		if (__atomic_load_n(&e->owner, __ATOMIC_ACQUIRE) != virtio_rdma_cqe_phase(cq->next, cq->depth))
			break;
		cqe_to_wc(e, &wc[n++]);
		cq->next++;
	}
	if (n)
		__atomic_store_n(&ctl->consumer, htole32(cq->next), __ATOMIC_RELEASE);
	pthread_spin_unlock(&cq->lock);
	return n;
}

static int vrdma_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	return ibv_cmd_req_notify_cq(ibcq, solicited_only);
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

/* ---- QP ------------------------------------------------------------------------------------- */

static struct ibv_qp *vrdma_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct ibv_context *ctx = pd->context;
	struct vrdma_context *vctx = to_vctx(ctx);
	struct ibv_create_qp cmd;
	struct vrdma_create_qp_resp resp;
	struct virtio_rdma_abi_create_qp_resp *r = &resp.drv;
	struct vrdma_qp *qp;
	struct ibv_qp_cap asked = attr->cap;  /* ibv_cmd_create_qp overwrites it with the answer */
	int srq = attr->srq != NULL;

	if (attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UD) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp)
		return NULL;
	memset(&resp, 0, sizeof(resp));
	if (ibv_cmd_create_qp(pd, &qp->ibv_qp, attr, &cmd, sizeof(cmd), &resp.ibv_resp, sizeof(resp)))
		goto err_free;
	/*
	 * The rings as answered: depths and strides as both sides compute them, parts inside the map.
	 * (The QPN is compared with libibverbs' qp_num: on the ioctl path the core response is unused.)
	 */
	if (r->qp_num != qp->ibv_qp.qp_num || !is_pow2(r->sq_depth) || r->sq_depth < asked.max_send_wr ||
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
		warn(ctx, "CREATE_QP answered rings that do not agree with the contract");
		goto err_destroy;
	}
	qp->map = map_ring(ctx, r->mmap_offset, r->mmap_size);
	if (!qp->map) {
		warn(ctx, "mmap of a QP's rings failed");
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
	return &qp->ibv_qp;

err_destroy:
	ibv_cmd_destroy_qp(&qp->ibv_qp);
	errno = EPROTO;
err_free:
	free(qp);
	return NULL;
}

static int vrdma_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask,
			  struct ibv_qp_init_attr *init_attr)
{
	struct ibv_query_qp cmd;

	return ibv_cmd_query_qp(ibqp, attr, attr_mask, init_attr, &cmd, sizeof(cmd));
}

static int vrdma_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask)
{
	struct ibv_modify_qp cmd;

	return ibv_cmd_modify_qp(ibqp, attr, attr_mask, &cmd, sizeof(cmd));
}

static int vrdma_destroy_qp(struct ibv_qp *ibqp)
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

static struct virtio_rdma_abi_qp_db *qp_db(struct vrdma_qp *qp)
{
	return (void *)(qp->map + qp->abi.db_offset);
}

static struct virtio_rdma_qp_status *qp_status(struct vrdma_qp *qp)
{
	return (void *)(qp->map + qp->abi.status_offset);
}

/* One send WR into the WQE at w (sq_stride bytes); 0 or an errno. */
static int write_send_wqe(struct vrdma_qp *qp, const struct ibv_send_wr *wr, uint8_t *w)
{
	struct virtio_rdma_send_wqe *h = (void *)w;
	struct virtio_rdma_sge *sg = (void *)(h + 1);
	uint8_t flags = 0;

	if (wr->opcode > IBV_WR_ATOMIC_FETCH_AND_ADD || wr->num_sge < 0)
		return EINVAL;
	if (qp->ibv_qp.qp_type == IBV_QPT_UD && wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM)
		return EINVAL;
	memset(w, 0, qp->abi.sq_stride);
	if (wr->send_flags & IBV_SEND_INLINE) {
		uint32_t len = 0;

		for (int i = 0; i < wr->num_sge; i++) {
			if (wr->sg_list[i].length > qp->abi.max_inline - len)
				return EINVAL;
			memcpy(w + sizeof(*h) + len, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
			len += wr->sg_list[i].length;
		}
		h->inline_len = htole32(len);
		flags |= VIRTIO_RDMA_SEND_INLINE;
	} else {
		if ((uint32_t)wr->num_sge > qp->abi.max_send_sge)
			return EINVAL;
		for (int i = 0; i < wr->num_sge; i++) {
			sg[i].addr = htole64(wr->sg_list[i].addr);
			sg[i].length = htole32(wr->sg_list[i].length);
			sg[i].lkey = htole32(wr->sg_list[i].lkey);
		}
		h->num_sge = (uint8_t)wr->num_sge;
	}
	if (wr->send_flags & IBV_SEND_FENCE)
		flags |= VIRTIO_RDMA_SEND_FENCE;
	if ((wr->send_flags & IBV_SEND_SIGNALED) || qp->sig_all)
		flags |= VIRTIO_RDMA_SEND_SIGNALED;
	if (wr->send_flags & IBV_SEND_SOLICITED)
		flags |= VIRTIO_RDMA_SEND_SOLICITED;
	h->wr_id = htole64(wr->wr_id);
	h->opcode = (uint8_t)wr->opcode;
	h->flags = flags;
	h->imm_data = htole32(wr->imm_data);
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
	if (qp->ibv_qp.qp_type == IBV_QPT_UD) {
		if (!wr->wr.ud.ah)
			return EINVAL;
		h->ah = htole32(to_vah(wr->wr.ud.ah)->handle);
		h->remote_qpn = htole32(wr->wr.ud.remote_qpn);
		h->remote_qkey = htole32(wr->wr.ud.remote_qkey);
	}
	return 0;
}

static int vrdma_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct ibv_send_wr *bad, *first = wr;
	uint32_t start;
	int ret = 0;

	pthread_mutex_lock(&qp->sq_lock);
	start = qp->sq_prod;
	for (; wr; wr = wr->next) {
		uint32_t consumed = le32toh(__atomic_load_n(&qp_status(qp)->sq_consumed, __ATOMIC_ACQUIRE));

		if (qp->sq_prod - consumed >= qp->abi.sq_depth) {
			ret = ENOMEM;
			break;
		}
		ret = write_send_wqe(qp, wr, qp->map + qp->abi.sq_offset +
						  (size_t)(qp->sq_prod & (qp->abi.sq_depth - 1)) * qp->abi.sq_stride);
		if (ret)
			break;
		qp->sq_prod++;
	}
	*bad_wr = ret ? wr : NULL;
	if (qp->sq_prod != start) {
		unsigned int tries = 0;
		int err;

		__atomic_store_n(&qp_db(qp)->sq_producer, qp->sq_prod, __ATOMIC_RELEASE);
		do
			err = ibv_cmd_post_send(ibqp, NULL, &bad);  /* the doorbell: no work request */
		while (doorbell_again(err, &tries));
		if (err) {  /* not rung: none of this call's WRs is posted */
			qp->sq_prod = start;
			__atomic_store_n(&qp_db(qp)->sq_producer, start, __ATOMIC_RELEASE);
			ret = err;
			*bad_wr = first;
		}
	}
	pthread_mutex_unlock(&qp->sq_lock);
	return ret;
}

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

static int vrdma_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct vrdma_qp *qp = to_vqp(ibqp);
	struct ibv_recv_wr *bad, *first = wr;
	uint32_t start;
	int ret = 0;

	if (ibqp->srq) {
		*bad_wr = wr;
		return EINVAL;
	}
	pthread_mutex_lock(&qp->rq_lock);
	start = qp->rq_prod;
	for (; wr; wr = wr->next) {
		uint32_t consumed = le32toh(__atomic_load_n(&qp_status(qp)->rq_consumed, __ATOMIC_ACQUIRE));

		if (qp->rq_prod - consumed >= qp->abi.rq_depth) {
			ret = ENOMEM;
			break;
		}
		ret = write_recv_wqe(wr, qp->map + qp->abi.rq_offset +
					     (size_t)(qp->rq_prod & (qp->abi.rq_depth - 1)) * qp->abi.rq_stride,
				     qp->abi.rq_stride, qp->abi.max_recv_sge);
		if (ret)
			break;
		qp->rq_prod++;
	}
	*bad_wr = ret ? wr : NULL;
	if (qp->rq_prod != start) {
		unsigned int tries = 0;
		int err;

		__atomic_store_n(&qp_db(qp)->rq_producer, qp->rq_prod, __ATOMIC_RELEASE);
		do
			err = ibv_cmd_post_recv(ibqp, NULL, &bad);
		while (doorbell_again(err, &tries));
		if (err) {
			qp->rq_prod = start;
			__atomic_store_n(&qp_db(qp)->rq_producer, start, __ATOMIC_RELEASE);
			ret = err;
			*bad_wr = first;
		}
	}
	pthread_mutex_unlock(&qp->rq_lock);
	return ret;
}

/* ---- SRQ ------------------------------------------------------------------------------------ */

static struct ibv_srq *vrdma_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
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
		warn(ctx, "CREATE_SRQ answered a ring that does not agree with the contract");
		goto err_destroy;
	}
	srq->map = map_ring(ctx, r->mmap_offset, r->mmap_size);
	if (!srq->map) {
		warn(ctx, "mmap of an SRQ ring failed");
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

static int vrdma_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr, int mask)
{
	struct ibv_modify_srq cmd;

	return ibv_cmd_modify_srq(ibsrq, attr, mask, &cmd, sizeof(cmd));
}

static int vrdma_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
	struct ibv_query_srq cmd;

	return ibv_cmd_query_srq(ibsrq, attr, &cmd, sizeof(cmd));
}

static int vrdma_destroy_srq(struct ibv_srq *ibsrq)
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

static int vrdma_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	struct vrdma_srq *srq = to_vsrq(ibsrq);
	struct virtio_rdma_qp_status *st = (void *)(srq->map + srq->abi.status_offset);
	struct virtio_rdma_abi_qp_db *db = (void *)(srq->map + srq->abi.db_offset);
	struct ibv_recv_wr *bad, *first = wr;
	uint32_t start;
	int ret = 0;

	pthread_mutex_lock(&srq->lock);
	start = srq->prod;
	for (; wr; wr = wr->next) {
		if (srq->prod - le32toh(__atomic_load_n(&st->rq_consumed, __ATOMIC_ACQUIRE)) >= srq->abi.depth) {
			ret = ENOMEM;
			break;
		}
		ret = write_recv_wqe(wr, srq->map + srq->abi.ring_offset +
					     (size_t)(srq->prod & (srq->abi.depth - 1)) * srq->abi.stride,
				     srq->abi.stride, srq->abi.max_sge);
		if (ret)
			break;
		srq->prod++;
	}
	*bad_wr = ret ? wr : NULL;
	if (srq->prod != start) {
		unsigned int tries = 0;
		int err;

		__atomic_store_n(&db->rq_producer, srq->prod, __ATOMIC_RELEASE);
		do
			err = ibv_cmd_post_srq_recv(ibsrq, NULL, &bad);
		while (doorbell_again(err, &tries));
		if (err) {
			srq->prod = start;
			__atomic_store_n(&db->rq_producer, start, __ATOMIC_RELEASE);
			ret = err;
			*bad_wr = first;
		}
	}
	pthread_mutex_unlock(&srq->lock);
	return ret;
}

/* ---- AH ------------------------------------------------------------------------------------- */

static struct ibv_ah *vrdma_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	struct vrdma_create_ah_resp resp;
	struct vrdma_ah *ah = calloc(1, sizeof(*ah));

	if (!ah)
		return NULL;
	memset(&resp, 0, sizeof(resp));
	if (ibv_cmd_create_ah(pd, &ah->ibv_ah, attr, &resp.ibv_resp, sizeof(resp))) {
		free(ah);
		return NULL;
	}
	if (resp.drv.ah_handle == 0) {
		warn(pd->context, "CREATE_AH answered device handle 0");
		ibv_cmd_destroy_ah(&ah->ibv_ah);
		free(ah);
		errno = EPROTO;
		return NULL;
	}
	ah->handle = resp.drv.ah_handle;
	return &ah->ibv_ah;
}

static int vrdma_destroy_ah(struct ibv_ah *ibah)
{
	int ret = ibv_cmd_destroy_ah(ibah);

	if (!ret)
		free(to_vah(ibah));
	return ret;
}

/* ---- Context and device --------------------------------------------------------------------- */

static void vrdma_free_context(struct ibv_context *ibctx)
{
	struct vrdma_context *ctx = to_vctx(ibctx);

	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
}

static const struct verbs_context_ops vrdma_ctx_ops = {
	.free_context = vrdma_free_context,
	.query_device_ex = vrdma_query_device,
	.query_port = vrdma_query_port,
	.alloc_pd = vrdma_alloc_pd,
	.dealloc_pd = vrdma_dealloc_pd,
	.reg_mr = vrdma_reg_mr,
	.dereg_mr = vrdma_dereg_mr,
	.create_cq = vrdma_create_cq,
	.poll_cq = vrdma_poll_cq,
	.req_notify_cq = vrdma_req_notify_cq,
	.destroy_cq = vrdma_destroy_cq,
	.create_qp = vrdma_create_qp,
	.query_qp = vrdma_query_qp,
	.modify_qp = vrdma_modify_qp,
	.destroy_qp = vrdma_destroy_qp,
	.post_send = vrdma_post_send,
	.post_recv = vrdma_post_recv,
	.create_srq = vrdma_create_srq,
	.modify_srq = vrdma_modify_srq,
	.query_srq = vrdma_query_srq,
	.destroy_srq = vrdma_destroy_srq,
	.post_srq_recv = vrdma_post_srq_recv,
	.create_ah = vrdma_create_ah,
	.destroy_ah = vrdma_destroy_ah,
};

static struct verbs_context *vrdma_alloc_context(struct ibv_device *ibdev, int cmd_fd, void *private_data)
{
	struct vrdma_context *ctx;
	struct ibv_get_context cmd;
	struct vrdma_get_context_resp resp;

	(void)private_data;
	ctx = verbs_init_and_alloc_context(ibdev, cmd_fd, ctx, ibv_ctx, RDMA_DRIVER_UNKNOWN);
	if (!ctx)
		return NULL;
	memset(&resp, 0, sizeof(resp));
	if (ibv_cmd_get_context(&ctx->ibv_ctx, &cmd, sizeof(cmd), &resp.ibv_resp, sizeof(resp)))
		goto err;
	if (resp.drv.abi_version != VIRTIO_RDMA_ABI_VERSION) {
		verbs_err(&ctx->ibv_ctx, "vrdma: the kernel driver speaks ABI %u, this provider %u\n",
			  resp.drv.abi_version, VIRTIO_RDMA_ABI_VERSION);
		errno = EPROTO;
		goto err;
	}
	if (!resp.drv.max_qp_wr || !resp.drv.max_cqe || !resp.drv.max_sge || resp.drv.max_sge > 255) {
		verbs_err(&ctx->ibv_ctx, "vrdma: GET_CONTEXT answered limits no ring can have\n");
		errno = EPROTO;
		goto err;
	}
	ctx->lim = resp.drv;
	ctx->page_size = sysconf(_SC_PAGESIZE);
	verbs_set_ops(&ctx->ibv_ctx, &vrdma_ctx_ops);
	return &ctx->ibv_ctx;

err:
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
	return NULL;
}

static struct verbs_device *vrdma_device_alloc(struct verbs_sysfs_dev *sysfs_dev)
{
	struct vrdma_device *dev = calloc(1, sizeof(*dev));

	(void)sysfs_dev;
	return dev ? &dev->ibv_dev : NULL;
}

static void vrdma_uninit_device(struct verbs_device *verbs_device)
{
	free(container_of(verbs_device, struct vrdma_device, ibv_dev));
}

static const struct verbs_match_ent vrdma_match[] = {
	VERBS_NAME_MATCH("vrdma", NULL),
	{},
};

static const struct verbs_device_ops vrdma_dev_ops = {
	.name = "vrdma",
	.match_min_abi_version = VIRTIO_RDMA_ABI_VERSION,
	.match_max_abi_version = VIRTIO_RDMA_ABI_VERSION,
	.match_table = vrdma_match,
	.alloc_device = vrdma_device_alloc,
	.uninit_device = vrdma_uninit_device,
	.alloc_context = vrdma_alloc_context,
};
PROVIDER_DRIVER(vrdma, vrdma_dev_ops);
