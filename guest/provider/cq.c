// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * libvrdma's CQ polling: ibv_poll_cq and the extended CQ's poll API (ibv_create_cq_ex(3):
 * start_poll, next_poll, end_poll and the ibv_wc_read_* readers), both through one reader of the
 * CQ's mapped ring ("Rings in guest memory", include/vrdma/virtio_rdma.h).
 *
 * Who owns what at the ring: the device produces. It writes a CQE's body, then its owner byte,
 * last, with the phase of the pass (release; IBA 11.4.2.2 for what a completion holds). This
 * library consumes: a slot holds a CQE when its owner byte, acquired, is the phase of the
 * consumer's free-running index (cq_peek); the body is read after that. A slot goes back to the
 * device only when the consumer index it reads (control.consumer, stored with release:
 * cq_release) has passed it; the device waits for room rather than overwrite (control.overruns).
 * So between start_poll and end_poll, under the CQ's lock, the readers read the current CQE in
 * place, and end_poll hands back what the poll consumed, as ibv_poll_cq does after its batch.
 */
#include <errno.h>
#include <string.h>
#include <endian.h>

#include "vrdma.h"

/* ---- The ring ------------------------------------------------------------------------------- */

/* The CQE at the consumer index once the device has written it, else NULL. Under cq->lock. */
static const struct virtio_rdma_cqe *cq_peek(const struct vrdma_cq *cq)
{
	const struct virtio_rdma_cqe *e = (const void *)(cq->map + VIRTIO_RDMA_CQE_OFFSET +
							 (size_t)(cq->next & (cq->depth - 1)) * VIRTIO_RDMA_CQE_SIZE);

	/* The owner byte is written last by the device (release): acquire it, then the body. */
	if (__atomic_load_n(&e->owner, __ATOMIC_ACQUIRE) != virtio_rdma_cqe_phase(cq->next, cq->depth))
		return NULL;
	return e;
}

/* The slots before the consumer index back to the device (after their bodies were read). */
static void cq_release(struct vrdma_cq *cq)
{
	struct virtio_rdma_cq_control *ctl = (void *)cq->map;

	__atomic_store_n(&ctl->consumer, htole32(cq->next), __ATOMIC_RELEASE);
}

/* ---- A CQE as libibverbs reports it: shared by ibv_wc and the ibv_cq_ex readers ------------- */

static unsigned int cqe_wc_flags(const struct virtio_rdma_cqe *e)
{
	unsigned int f = 0;

	if (e->wc_flags & VIRTIO_RDMA_WC_WITH_IMM)
		f |= IBV_WC_WITH_IMM;
	if (e->wc_flags & VIRTIO_RDMA_WC_WITH_INV)
		f |= IBV_WC_WITH_INV;  /* imm_data holds the key invalidated */
	if (e->wc_flags & VIRTIO_RDMA_WC_GRH)
		f |= IBV_WC_GRH;
	return f;
}

/* RoCE has no SL: ConnectX's L3 header type there with a GRH (2: IPv4), which UCX 1.13-1.18 reads. */
static uint8_t cqe_sl(const struct vrdma_cq *cq, const struct virtio_rdma_cqe *e)
{
	return cq->ipv4 && (e->wc_flags & VIRTIO_RDMA_WC_GRH) ? 2 : 0;
}

/* imm_data: the value the peer's WR carried (network order there), unchanged; no LIDs (RoCE). */
static void cqe_to_wc(const struct vrdma_cq *cq, const struct virtio_rdma_cqe *e, struct ibv_wc *wc)
{
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = le64toh(e->wr_id);
	wc->status = (enum ibv_wc_status)e->status;
	wc->opcode = (enum ibv_wc_opcode)e->opcode;
	wc->vendor_err = le32toh(e->vendor_err);
	wc->byte_len = le32toh(e->byte_len);
	wc->imm_data = le32toh(e->imm_data);
	wc->qp_num = le32toh(e->qp_num);
	wc->src_qp = le32toh(e->src_qp);
	wc->wc_flags = cqe_wc_flags(e);
	wc->sl = cqe_sl(cq, e);
}

/* ---- ibv_poll_cq ---------------------------------------------------------------------------- */

int vrdma_poll_cq(struct ibv_cq *ibcq, int num, struct ibv_wc *wc)
{
	struct vrdma_cq *cq = to_vcq(ibcq);
	const struct virtio_rdma_cqe *e;
	int n = 0;

	pthread_spin_lock(&cq->lock);
	while (n < num && (e = cq_peek(cq))) {
		cqe_to_wc(cq, e, &wc[n++]);
		cq->next++;
	}
	if (n)
		cq_release(cq);
	pthread_spin_unlock(&cq->lock);
	return n;
}

/* ---- The extended CQ (ibv_cq_ex) ------------------------------------------------------------ */

/*
 * ibv_create_cq_ex's wc_flags this device can report: everything ibv_wc has. Not a completion
 * timestamp (the device has no clock it could report: IBV_WC_EX_WITH_COMPLETION_TIMESTAMP and
 * _WALLCLOCK), nor a CVLAN, flow tag or tag-matching information (no such offloads).
 */
#define VRDMA_CQ_WC_FLAGS                                                                                \
	(IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP | \
	 IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL | IBV_WC_EX_WITH_DLID_PATH_BITS)

int vrdma_check_cq_ex(const struct ibv_cq_init_attr_ex *attr)
{
	if (attr->comp_mask & ~(uint32_t)(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD))
		return EINVAL;
	if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
	    (attr->flags & ~(uint32_t)(IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN)))
		return EINVAL;
	/*
	 * SINGLE_THREADED is a hint the CQ's lock satisfies anyway. IGNORE_OVERRUN: the device never
	 * overruns a CQ (it waits for room), and the driver takes no creation flags. A parent domain:
	 * this provider has none (no alloc_parent_domain), so no allocator or thread domain to use.
	 */
	if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && (attr->flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN))
		return EOPNOTSUPP;
	if (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD)
		return EOPNOTSUPP;
	return attr->wc_flags & ~(uint64_t)VRDMA_CQ_WC_FLAGS ? EOPNOTSUPP : 0;
}

/* The current CQE's status and wr_id into the ibv_cq_ex, where ibv_cq_ex's users read them. */
static void cqx_load(struct vrdma_cq *cq, const struct virtio_rdma_cqe *e)
{
	cq->cur = e;
	cq->vcq.cq_ex.status = (enum ibv_wc_status)e->status;
	cq->vcq.cq_ex.wr_id = le64toh(e->wr_id);
}

/* ENOENT (lock not held, no end_poll) when the ring holds no CQE; else 0 with the lock held. */
static int cqx_start_poll(struct ibv_cq_ex *x, struct ibv_poll_cq_attr *attr)
{
	struct vrdma_cq *cq = cqx_to_vcq(x);
	const struct virtio_rdma_cqe *e;

	if (attr && attr->comp_mask)
		return EINVAL;
	pthread_spin_lock(&cq->lock);
	e = cq_peek(cq);
	if (!e) {
		pthread_spin_unlock(&cq->lock);
		return ENOENT;
	}
	cqx_load(cq, e);
	return 0;
}

/* The current CQE consumed (not yet released: end_poll does), the next one current; ENOENT: none. */
static int cqx_next_poll(struct ibv_cq_ex *x)
{
	struct vrdma_cq *cq = cqx_to_vcq(x);
	const struct virtio_rdma_cqe *e;

	if (cq->cur) {
		cq->next++;
		cq->cur = NULL;
	}
	e = cq_peek(cq);
	if (!e)
		return ENOENT;
	cqx_load(cq, e);
	return 0;
}

static void cqx_end_poll(struct ibv_cq_ex *x)
{
	struct vrdma_cq *cq = cqx_to_vcq(x);

	if (cq->cur) {
		cq->next++;
		cq->cur = NULL;
	}
	cq_release(cq);  /* start_poll found one: at least that one was consumed */
	pthread_spin_unlock(&cq->lock);
}

static const struct virtio_rdma_cqe *cqx_cur(struct ibv_cq_ex *x)
{
	return cqx_to_vcq(x)->cur;
}

static enum ibv_wc_opcode cqx_read_opcode(struct ibv_cq_ex *x)
{
	return (enum ibv_wc_opcode)cqx_cur(x)->opcode;
}

static uint32_t cqx_read_vendor_err(struct ibv_cq_ex *x)
{
	return le32toh(cqx_cur(x)->vendor_err);
}

static uint32_t cqx_read_byte_len(struct ibv_cq_ex *x)
{
	return le32toh(cqx_cur(x)->byte_len);
}

/* Also ibv_wc_read_invalidated_rkey (IBV_WC_WITH_INV), as ibv_wc's union. */
static __be32 cqx_read_imm_data(struct ibv_cq_ex *x)
{
	return le32toh(cqx_cur(x)->imm_data);
}

static uint32_t cqx_read_qp_num(struct ibv_cq_ex *x)
{
	return le32toh(cqx_cur(x)->qp_num);
}

static uint32_t cqx_read_src_qp(struct ibv_cq_ex *x)
{
	return le32toh(cqx_cur(x)->src_qp);
}

static unsigned int cqx_read_wc_flags(struct ibv_cq_ex *x)
{
	return cqe_wc_flags(cqx_cur(x));
}

static uint32_t cqx_read_slid(struct ibv_cq_ex *x)
{
	(void)x;
	return 0;
}

static uint8_t cqx_read_sl(struct ibv_cq_ex *x)
{
	return cqe_sl(cqx_to_vcq(x), cqx_cur(x));
}

static uint8_t cqx_read_dlid_path_bits(struct ibv_cq_ex *x)
{
	(void)x;
	return 0;
}

void vrdma_set_cq_ex_ops(struct vrdma_cq *cq, uint64_t wc_flags)
{
	struct ibv_cq_ex *x = &cq->vcq.cq_ex;

	x->start_poll = cqx_start_poll;
	x->next_poll = cqx_next_poll;
	x->end_poll = cqx_end_poll;
	x->read_opcode = cqx_read_opcode;
	x->read_vendor_err = cqx_read_vendor_err;
	x->read_wc_flags = cqx_read_wc_flags;
	/* The readers asked for only, as rdma-core's providers do: another is NULL, not a guess. */
	if (wc_flags & IBV_WC_EX_WITH_BYTE_LEN)
		x->read_byte_len = cqx_read_byte_len;
	if (wc_flags & IBV_WC_EX_WITH_IMM)
		x->read_imm_data = cqx_read_imm_data;
	if (wc_flags & IBV_WC_EX_WITH_QP_NUM)
		x->read_qp_num = cqx_read_qp_num;
	if (wc_flags & IBV_WC_EX_WITH_SRC_QP)
		x->read_src_qp = cqx_read_src_qp;
	if (wc_flags & IBV_WC_EX_WITH_SLID)
		x->read_slid = cqx_read_slid;
	if (wc_flags & IBV_WC_EX_WITH_SL)
		x->read_sl = cqx_read_sl;
	if (wc_flags & IBV_WC_EX_WITH_DLID_PATH_BITS)
		x->read_dlid_path_bits = cqx_read_dlid_path_bits;
}
