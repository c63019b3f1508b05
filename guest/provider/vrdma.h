/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */
/*
 * libvrdma's private header: the provider's objects and what its files share (docs/virtio-rdma.md
 * "The rdma-core provider"). Files by role: device.c (device, context, query, PD, MR, AH, the
 * ops table), objects.c (CQ, QP, SRQ: creation checks the kernel's udata answers and maps the
 * rings), post.c (the data path: send/receive WQEs, doorbells, CQ arming), cq.c (CQ polling:
 * ibv_poll_cq and the extended CQ's start/next/end_poll, one reader of the ring) and wr.c (the
 * extended send API, ibv_qp_ex's wr_*).
 */
#ifndef VRDMA_PROVIDER_H
#define VRDMA_PROVIDER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <infiniband/driver.h>
#include <infiniband/verbs.h>

#include <vrdma/virtio_rdma.h>
#include <vrdma/virtio_rdma_abi.h>

#define VRDMA_HIDDEN __attribute__((visibility("hidden")))

struct vrdma_context {
	struct verbs_context ibv_ctx;
	struct virtio_rdma_abi_ucontext_resp lim;
	long page_size;
	/*
	 * The context's doorbell ring and the device's notify page (NULL: every doorbell is a
	 * uverbs command). Records are appended under dbr_lock; post.c vrdma_ring_doorbell.
	 */
	uint8_t *dbr;
	uint8_t *notify_page;
	pthread_spinlock_t dbr_lock;
	uint32_t dbr_prod;
};

/*
 * A CQ made by ibv_create_cq or ibv_create_cq_ex: the same object and ring either way (libibverbs'
 * ibv_cq_ex begins with ibv_cq's members; ibv_poll_cq, req_notify and destroy take both).
 */
struct vrdma_cq {
	struct verbs_cq vcq;
	uint32_t handle;  /* the device's: what a CQ_ARM record names */
	pthread_spinlock_t lock;  /* also held from a successful start_poll to end_poll */
	uint8_t *map;
	uint32_t map_size, depth;
	uint32_t next;  /* the free-running index of the next CQE to consume */
	int ipv4;       /* the device's packets are IPv4 (VIRTIO_RDMA_ABI_UCTX_IPV4): the SL cq.c reports */
	const struct virtio_rdma_cqe *cur;  /* start_poll..end_poll: the CQE the readers read, at next */
};

/*
 * libibverbs' struct verbs_qp as the library loaded at run time lays it out. Its comp_mask
 * (VERBS_QP_EX, read by ibv_qp_to_qp_ex, written by ibv_cmd_create_qp_ex) follows a union whose
 * size is that library's sizeof(struct ibv_qp_ex), which grows between releases (rdma-core 56.1
 * appended wr_flush to 44.0's, same private ABI 34): the provider is built against one release's
 * headers and runs under the installed library, so build.sh measures the installed library's
 * size (VRDMA_IBV_QP_EX_SIZE, from its libibverbs-dev) and the members up to wr_abort, which
 * both have at the same offsets, are all this provider fills.
 */
#ifndef VRDMA_IBV_QP_EX_SIZE
#error "VRDMA_IBV_QP_EX_SIZE: the installed libibverbs' sizeof(struct ibv_qp_ex) (build.sh)"
#endif
struct vrdma_vqp {
	union {
		struct ibv_qp qp;
		unsigned char qp_ex[VRDMA_IBV_QP_EX_SIZE];
	};
	uint32_t comp_mask;
	struct verbs_xrcd *xrcd;
};
_Static_assert(VRDMA_IBV_QP_EX_SIZE <= sizeof(struct ibv_qp_ex) && VRDMA_IBV_QP_EX_SIZE % 8 == 0,
	       "the installed ibv_qp_ex is a prefix of the headers' one");
_Static_assert(offsetof(struct ibv_qp_ex, wr_abort) + sizeof(void (*)(void)) <= VRDMA_IBV_QP_EX_SIZE,
	       "every ibv_qp_ex member this provider fills is in the installed library's struct");
_Static_assert(VRDMA_IBV_QP_EX_SIZE != sizeof(struct ibv_qp_ex) ||
		       (offsetof(struct vrdma_vqp, comp_mask) == offsetof(struct verbs_qp, comp_mask) &&
			offsetof(struct vrdma_vqp, xrcd) == offsetof(struct verbs_qp, xrcd)),
	       "with the headers' own library, struct verbs_qp exactly");

struct vrdma_qp {
	struct vrdma_vqp vqp;
	pthread_mutex_t sq_lock, rq_lock;  /* a post may wait for the doorbell queue */
	uint8_t *map;
	struct virtio_rdma_abi_create_qp_resp abi;
	uint32_t sq_prod, rq_prod;
	int sig_all;
	/* The extended send API (wr.c) between wr_start and wr_complete / wr_abort. */
	uint32_t wr_start_prod;               /* sq_prod at wr_start */
	struct virtio_rdma_send_wqe *wr_cur;  /* the WQE the setters fill; NULL before a builder */
	int wr_err;                           /* the first error, returned by wr_complete */
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

#define to_vctx(c) container_of(c, struct vrdma_context, ibv_ctx.context)
#define to_vcq(c) container_of(c, struct vrdma_cq, vcq.cq)
#define cqx_to_vcq(c) container_of(c, struct vrdma_cq, vcq.cq_ex)
#define to_vqp(q) container_of(q, struct vrdma_qp, vqp.qp)
#define to_vsrq(s) container_of(s, struct vrdma_srq, ibv_srq)
#define to_vah(a) container_of(a, struct vrdma_ah, ibv_ah)

static inline struct ibv_qp_ex *vrdma_qpx(struct vrdma_qp *qp)
{
	return (struct ibv_qp_ex *)qp->vqp.qp_ex;
}

static inline struct vrdma_qp *qpx_to_vqp(struct ibv_qp_ex *qpx)
{
	return container_of((struct ibv_qp *)qpx, struct vrdma_qp, vqp.qp);
}

void vrdma_warn(struct ibv_context *ctx, const char *what) VRDMA_HIDDEN;

/* objects.c */
struct ibv_cq *vrdma_create_cq(struct ibv_context *ctx, int cqe, struct ibv_comp_channel *channel,
			       int comp_vector) VRDMA_HIDDEN;
struct ibv_cq_ex *vrdma_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *attr) VRDMA_HIDDEN;
int vrdma_destroy_cq(struct ibv_cq *ibcq) VRDMA_HIDDEN;
struct ibv_qp *vrdma_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr) VRDMA_HIDDEN;
struct ibv_qp *vrdma_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr) VRDMA_HIDDEN;
int vrdma_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask,
		   struct ibv_qp_init_attr *init_attr) VRDMA_HIDDEN;
int vrdma_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask) VRDMA_HIDDEN;
int vrdma_destroy_qp(struct ibv_qp *ibqp) VRDMA_HIDDEN;
struct ibv_srq *vrdma_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr) VRDMA_HIDDEN;
int vrdma_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr, int mask) VRDMA_HIDDEN;
int vrdma_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr) VRDMA_HIDDEN;
int vrdma_destroy_srq(struct ibv_srq *ibsrq) VRDMA_HIDDEN;

/* cq.c */
int vrdma_poll_cq(struct ibv_cq *ibcq, int num, struct ibv_wc *wc) VRDMA_HIDDEN;
/* ibv_create_cq_ex's attributes this provider can do: 0, EINVAL (unknown bits) or EOPNOTSUPP. */
int vrdma_check_cq_ex(const struct ibv_cq_init_attr_ex *attr) VRDMA_HIDDEN;
/* The poll functions and the readers of the wc_flags asked for (checked), on a created CQ. */
void vrdma_set_cq_ex_ops(struct vrdma_cq *cq, uint64_t wc_flags) VRDMA_HIDDEN;

/* post.c */
int vrdma_req_notify_cq(struct ibv_cq *ibcq, int solicited_only) VRDMA_HIDDEN;
int vrdma_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr) VRDMA_HIDDEN;
int vrdma_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr) VRDMA_HIDDEN;
int vrdma_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr) VRDMA_HIDDEN;
/* Send WQE parts shared by post_send and the wr_* API; the caller holds sq_lock. */
struct virtio_rdma_send_wqe *vrdma_sq_next(struct vrdma_qp *qp) VRDMA_HIDDEN;  /* zeroed; NULL: full */
uint8_t vrdma_send_flags(const struct vrdma_qp *qp, unsigned int ibv_send_flags) VRDMA_HIDDEN;
int vrdma_wqe_sges(const struct vrdma_qp *qp, struct virtio_rdma_send_wqe *h, const struct ibv_sge *sg,
		   size_t n) VRDMA_HIDDEN;
int vrdma_wqe_inline(const struct vrdma_qp *qp, struct virtio_rdma_send_wqe *h, const void *addr,
		     size_t len) VRDMA_HIDDEN;
int vrdma_sq_ring(struct vrdma_qp *qp, uint32_t start) VRDMA_HIDDEN;
/*
 * One record on the context's doorbell ring and, unless the device polls, its notification: no
 * system call. ENOSYS when the context has no ring (ring through the kernel instead); EAGAIN
 * while the ring is full of records the device has not taken (notified: retry).
 */
int vrdma_ring_doorbell(struct vrdma_context *ctx, uint32_t handle, uint16_t kind, uint32_t value) VRDMA_HIDDEN;

/* wr.c */
int vrdma_check_send_ops(const struct ibv_qp_init_attr_ex *attr) VRDMA_HIDDEN;
void vrdma_set_send_ops(struct vrdma_qp *qp, uint64_t send_ops_flags) VRDMA_HIDDEN;

#endif
