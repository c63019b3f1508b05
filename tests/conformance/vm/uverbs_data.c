/*
 * uverbs_data DEV MODE: moves data through virtio_rdma.ko from user space with no rdma-core
 * provider (kmod_test.sh), speaking the kernel's uverbs write() commands
 * (<rdma/ib_user_verbs.h>) and the driver's ABI (guest/include/vrdma/virtio_rdma_abi.h), the way
 * the provider will: GET_CONTEXT, ALLOC_PD, REG_MR of a 64 KiB buffer, a completion channel and
 * a CQ, two RC QPs, both mapped; the QPs are connected to each other through the device's own
 * address (the guest GID equal to the device's GID 0, found in sysfs).
 *   MODE rc:   a receive is written into B's mapped receive ring and rung (POST_RECV, no WR), the
 *              CQ armed (REQ_NOTIFY_CQ), a SEND (4 KiB) and an RDMA WRITE (8 KiB) written into
 *              A's mapped send ring and rung (POST_SEND, no WR); the CQ is polled in its mapping
 *              until the three completions arrive (10 s at most), each checked (status, opcode,
 *              byte_len, wr_id, qp_num), the completion event read from the channel, and the
 *              bytes compared with the pattern. Everything is destroyed in order.
 *   MODE ud:   two UD QPs instead, an AH (CREATE_AH) to the device's own address, a 256-byte SEND
 *              to B's QPN and Q_Key and a receive on B; both completions (the receive's byte_len
 *              40 + 256 with the GRH, src_qp A) and the bytes checked; "ud ok". The process exits
 *              holding everything: ib_core's cleanup destroys it.
 *   MODE srq:  an SRQ (its ring mapped), an RC QP on it, a receive rung with POST_SRQ_RECV and a
 *              1 KiB SEND to that QP; POST_RECV on that QP refused; "srq ok". Exits holding all.
 *   MODE hold: sets the RC objects up, prints "held pid=N", and waits to be killed (60 s at most).
 * Prints one line per step; "rc ok" at the end; exits 1 at the first failure with a sentence.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <rdma/ib_user_ioctl_verbs.h>
#include <rdma/ib_user_verbs.h>

#include "uverbs_cmd.h"
#include <vrdma/virtio_rdma.h>
#include <vrdma/virtio_rdma_abi.h>

/* libibverbs' values (verbs.h), which the uverbs ABI carries and <rdma/> does not name. */
enum { IB_QPS_INIT = 1, IB_QPS_RTR = 2, IB_QPS_RTS = 3 };
enum { IB_QP_QKEY = 1 << 6 };
#define UD_QKEY 0x11111111u
enum { IB_MTU_1024 = 3 };
enum {
	IB_QP_STATE = 1 << 0, IB_QP_ACCESS_FLAGS = 1 << 3, IB_QP_PKEY_INDEX = 1 << 4, IB_QP_PORT = 1 << 5,
	IB_QP_AV = 1 << 7, IB_QP_PATH_MTU = 1 << 8, IB_QP_TIMEOUT = 1 << 9, IB_QP_RETRY_CNT = 1 << 10,
	IB_QP_RNR_RETRY = 1 << 11, IB_QP_RQ_PSN = 1 << 12, IB_QP_MAX_QP_RD_ATOMIC = 1 << 13,
	IB_QP_MIN_RNR_TIMER = 1 << 15, IB_QP_SQ_PSN = 1 << 16, IB_QP_MAX_DEST_RD_ATOMIC = 1 << 17,
	IB_QP_DEST_QPN = 1 << 20,
};
#define IB_ACCESS_LOCAL_WRITE IB_UVERBS_ACCESS_LOCAL_WRITE
#define IB_ACCESS_REMOTE_WRITE IB_UVERBS_ACCESS_REMOTE_WRITE
#define IB_ACCESS_REMOTE_READ IB_UVERBS_ACCESS_REMOTE_READ

static int fd;

#define DIE(...) do { printf(__VA_ARGS__); printf("\n"); exit(1); } while (0)

static int command(__u32 cmd, const void *req, size_t req_len, size_t resp_len)
{
	return uverbs_command(fd, cmd, req, req_len, resp_len);
}

struct qp {
	__u32 handle, qpn;
	struct virtio_rdma_abi_create_qp_resp abi;
	unsigned char *map;
	__u32 sq_prod, rq_prod;
};

static struct virtio_rdma_abi_qp_db *qp_db(struct qp *q)
{
	return (struct virtio_rdma_abi_qp_db *)(q->map + q->abi.db_offset);
}

/*
 * The next send WQE of q, written: zeroed, signaled, one SGE (addr, len, lkey); the producer
 * moves past it but is not published (the caller stores it in the doorbell page and rings).
 * Returns the WQE for the opcode's own fields.
 */
static struct virtio_rdma_send_wqe *next_send(struct qp *q, __u64 wr_id, __u8 opcode, __u64 addr, __u32 len, __u32 lkey)
{
	struct virtio_rdma_send_wqe *sw =
		(void *)(q->map + q->abi.sq_offset + (q->sq_prod % q->abi.sq_depth) * q->abi.sq_stride);
	struct virtio_rdma_sge *ss = (void *)(sw + 1);

	memset(sw, 0, q->abi.sq_stride);
	sw->wr_id = wr_id;
	sw->opcode = opcode;
	sw->flags = VIRTIO_RDMA_SEND_SIGNALED;
	sw->num_sge = 1;
	ss->addr = addr;
	ss->length = len;
	ss->lkey = lkey;
	q->sq_prod++;
	return sw;
}

static void *map(__u64 offset, __u32 size, const char *what)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);
	if (p == MAP_FAILED)
		DIE("mmap of the %s (offset %#" PRIx64 ", %u bytes) failed: %s", what, (uint64_t)offset, size, strerror(errno));
	return p;
}

/* srq: an SRQ's handle, or -1 for a QP with its own receive ring. */
static void create_qp_srq(struct qp *q, __u32 pd, __u32 cq, __u8 type, long srq)
{
	struct {
		struct ib_uverbs_create_qp_resp core;
		struct virtio_rdma_abi_create_qp_resp abi;
	} r;
	struct ib_uverbs_create_qp c = {
		.response = (uintptr_t)&r, .user_handle = (uintptr_t)q, .pd_handle = pd, .send_cq_handle = cq,
		.recv_cq_handle = cq, .srq_handle = srq < 0 ? 0 : (__u32)srq, .is_srq = srq >= 0,
		.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 2, .max_inline_data = 64,
		.qp_type = type,
	};
	int err;

	memset(&r, 0, sizeof(r));
	if ((err = command(IB_USER_VERBS_CMD_CREATE_QP, &c, sizeof(c), sizeof(r))))
		DIE("create_qp failed: %s", strerror(err));
	q->handle = r.core.qp_handle;
	q->qpn = r.core.qpn;
	q->abi = r.abi;
	if (r.abi.qp_num != q->qpn || r.abi.sq_depth != 16 || r.abi.rq_depth != (srq < 0 ? 16 : 0) ||
	    r.abi.sq_stride != virtio_rdma_send_stride(2, 64) ||
	    r.abi.rq_stride != (srq < 0 ? virtio_rdma_recv_stride(2) : 0) ||
	    r.abi.db_offset + sizeof(struct virtio_rdma_abi_qp_db) > r.abi.mmap_size)
		DIE("create_qp answered qpn %u/%u, depths %u/%u, strides %u/%u, db at %u of %u: not what was asked",
		    q->qpn, r.abi.qp_num, r.abi.sq_depth, r.abi.rq_depth, r.abi.sq_stride, r.abi.rq_stride,
		    r.abi.db_offset, r.abi.mmap_size);
	q->map = map(r.abi.mmap_offset, r.abi.mmap_size, "QP rings");
	printf("qp qpn=%u sq=%ux%u rq=%ux%u map=%u\n", q->qpn, r.abi.sq_depth, r.abi.sq_stride, r.abi.rq_depth,
	       r.abi.rq_stride, r.abi.mmap_size);
}

static int try_modify(struct qp *q, __u32 mask, struct ib_uverbs_modify_qp *m)
{
	m->qp_handle = q->handle;
	m->attr_mask = mask;
	return command(IB_USER_VERBS_CMD_MODIFY_QP, m, sizeof(*m), 0);
}

static void create_qp(struct qp *q, __u32 pd, __u32 cq, __u8 type)
{
	create_qp_srq(q, pd, cq, type, -1);
}

static void modify(struct qp *q, __u32 mask, struct ib_uverbs_modify_qp *m, const char *what)
{
	int err = try_modify(q, mask, m);

	if (err)
		DIE("modify_qp %s of QP %u failed: %s", what, q->qpn, strerror(err));
}

/* RESET -> INIT -> RTR -> RTS, connected to `peer` at `gid` (guest GID index `sgid`). */
static void connect_qp(struct qp *q, struct qp *peer, const __u8 *gid, int sgid)
{
	struct ib_uverbs_modify_qp m;

	memset(&m, 0, sizeof(m));
	m.qp_state = IB_QPS_INIT;
	m.port_num = 1;
	m.qp_access_flags = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE | IB_ACCESS_REMOTE_READ;
	modify(q, IB_QP_STATE | IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS, &m, "to INIT");
	memset(&m, 0, sizeof(m));
	m.qp_state = IB_QPS_RTR;
	m.path_mtu = IB_MTU_1024;
	m.dest_qp_num = peer->qpn;
	m.rq_psn = 100;
	m.max_dest_rd_atomic = 1;
	m.min_rnr_timer = 12;
	memcpy(m.dest.dgid, gid, 16);
	m.dest.sgid_index = (__u8)sgid;
	m.dest.hop_limit = 64;
	m.dest.is_global = 1;
	m.dest.port_num = 1;
	modify(q, IB_QP_STATE | IB_QP_AV | IB_QP_PATH_MTU | IB_QP_DEST_QPN | IB_QP_RQ_PSN | IB_QP_MAX_DEST_RD_ATOMIC |
		   IB_QP_MIN_RNR_TIMER, &m, "to RTR");
	memset(&m, 0, sizeof(m));
	m.qp_state = IB_QPS_RTS;
	m.sq_psn = 100;
	m.timeout = 14;
	m.retry_cnt = 7;
	m.rnr_retry = 7;
	m.max_rd_atomic = 1;
	modify(q, IB_QP_STATE | IB_QP_TIMEOUT | IB_QP_RETRY_CNT | IB_QP_RNR_RETRY | IB_QP_SQ_PSN | IB_QP_MAX_QP_RD_ATOMIC,
	       &m, "to RTS");
}

/* Guest GID table entry i as 16 bytes; 0 when it exists. */
static int read_gid(int i, __u8 gid[16])
{
	char path[96], text[64];
	unsigned g[8];
	snprintf(path, sizeof(path), "/sys/class/infiniband/vrdma0/ports/1/gids/%d", i);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	int ok = fgets(text, sizeof(text), f) != NULL;
	fclose(f);
	if (!ok || sscanf(text, "%x:%x:%x:%x:%x:%x:%x:%x", &g[0], &g[1], &g[2], &g[3], &g[4], &g[5], &g[6], &g[7]) != 8)
		return -1;
	for (int k = 0; k < 8; k++) {
		gid[2 * k] = (__u8)(g[k] >> 8);
		gid[2 * k + 1] = (__u8)g[k];
	}
	return 0;
}

/* The guest GID table entry that is the device's address (::ffff:a.b.c.d, RoCE v2). */
static int find_gid(__u8 gid[16])
{
	for (int i = 0; i < 16; i++) {
		char path[96], text[64], type[32] = "";
		snprintf(path, sizeof(path), "/sys/class/infiniband/vrdma0/ports/1/gids/%d", i);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		int ok = fgets(text, sizeof(text), f) != NULL;
		fclose(f);
		snprintf(path, sizeof(path), "/sys/class/infiniband/vrdma0/ports/1/gid_attrs/types/%d", i);
		if ((f = fopen(path, "r"))) {
			if (!fgets(type, sizeof(type), f))
				type[0] = 0;
			fclose(f);
		}
		unsigned g[8];
		if (!ok || !strstr(type, "v2") ||
		    sscanf(text, "%x:%x:%x:%x:%x:%x:%x:%x", &g[0], &g[1], &g[2], &g[3], &g[4], &g[5], &g[6], &g[7]) != 8 ||
		    g[0] || g[1] || g[2] || g[3] || g[4] || g[5] != 0xffff)
			continue;
		for (int k = 0; k < 8; k++) {
			gid[2 * k] = (__u8)(g[k] >> 8);
			gid[2 * k + 1] = (__u8)g[k];
		}
		return i;
	}
	return -1;
}

static int try_post_send(struct qp *q, __u32 wrs)
{
	struct ib_uverbs_post_send_resp r;
	struct {
		struct ib_uverbs_post_send c;
		struct ib_uverbs_send_wr wr;
		struct ib_uverbs_sge sge;
	} c = { .c = { .response = (uintptr_t)&r, .qp_handle = q->handle, .wr_count = wrs, .sge_count = wrs,
		       .wqe_size = sizeof(struct ib_uverbs_send_wr) } };

	c.wr.num_sge = 1;
	c.wr.opcode = IB_UVERBS_WR_SEND;
	return command(IB_USER_VERBS_CMD_POST_SEND, &c, wrs ? sizeof(c) : sizeof(c.c), sizeof(r));
}

static int try_post_recv(struct qp *q)
{
	struct ib_uverbs_post_recv_resp r;
	struct ib_uverbs_post_recv c = { .response = (uintptr_t)&r, .qp_handle = q->handle,
					 .wqe_size = sizeof(struct ib_uverbs_recv_wr) };

	return command(IB_USER_VERBS_CMD_POST_RECV, &c, sizeof(c), sizeof(r));
}

static void ring(__u32 cmd, struct qp *q)
{
	struct ib_uverbs_post_send_resp r;
	int err;

	if (cmd == IB_USER_VERBS_CMD_POST_SEND) {
		err = try_post_send(q, 0);
	} else {
		struct ib_uverbs_post_recv c = { .response = (uintptr_t)&r, .qp_handle = q->handle,
						 .wqe_size = sizeof(struct ib_uverbs_recv_wr) };
		err = command(cmd, &c, sizeof(c), sizeof(r));
	}
	if (err)
		DIE("%s (the doorbell) on QP %u failed: %s", cmd == IB_USER_VERBS_CMD_POST_SEND ? "post_send" : "post_recv",
		    q->qpn, strerror(err));
}

/*
 * What the driver must answer and refuse: QUERY_QP of a connected QP; a QP whose address is a
 * guest GID other than the device's (EINVAL, the driver's sentence in the log); a producer index
 * beyond the ring (EINVAL); POST_SEND carrying a work request for a user QP (EINVAL); a CQ over
 * max_cqe (EINVAL).
 */
static void refusals(struct qp *a, struct qp *b, __u32 pd, __u32 cq, __u32 max_cqe, int sgid)
{
	struct ib_uverbs_query_qp_resp qr;
	struct ib_uverbs_query_qp qq = { .response = (uintptr_t)&qr, .qp_handle = a->handle, .attr_mask = 0x1fffff };
	int err;

	memset(&qr, 0, sizeof(qr));
	if ((err = command(IB_USER_VERBS_CMD_QUERY_QP, &qq, sizeof(qq), sizeof(qr))))
		DIE("query_qp failed: %s", strerror(err));
	printf("query_qp state=%u dest_qp_num=%u sq_psn=%u rq_psn=%u path_mtu=%u sgid_index=%u max_send_wr=%u\n",
	       qr.qp_state, qr.dest_qp_num, qr.sq_psn, qr.rq_psn, qr.path_mtu, qr.dest.sgid_index, qr.max_send_wr);

	struct qp c;
	struct ib_uverbs_modify_qp m;
	memset(&c, 0, sizeof(c));
	create_qp(&c, pd, cq, IB_UVERBS_QPT_RC);
	memset(&m, 0, sizeof(m));
	m.qp_state = IB_QPS_INIT;
	m.port_num = 1;
	modify(&c, IB_QP_STATE | IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS, &m, "to INIT");
	memset(&m, 0, sizeof(m));
	m.qp_state = IB_QPS_RTR;
	m.path_mtu = IB_MTU_1024;
	m.dest_qp_num = b->qpn;
	m.dest.sgid_index = (__u8)(sgid == 0 ? 1 : 0);  /* the fe80:: default GID: not the device's */
	m.dest.hop_limit = 64;
	m.dest.is_global = 1;
	m.dest.port_num = 1;
	/* To the link-local GID itself: ib_core takes the MAC from it, and the driver decides. */
	if (read_gid(m.dest.sgid_index, m.dest.dgid) != 0)
		DIE("vrdma0 has no GID %u to try", m.dest.sgid_index);
	err = try_modify(&c, IB_QP_STATE | IB_QP_AV | IB_QP_PATH_MTU | IB_QP_DEST_QPN | IB_QP_RQ_PSN |
				 IB_QP_MAX_DEST_RD_ATOMIC | IB_QP_MIN_RNR_TIMER, &m);
	printf("refused: another GID: %s\n", strerror(err));
	struct ib_uverbs_destroy_qp_resp dqr;
	struct ib_uverbs_destroy_qp dq = { .response = (uintptr_t)&dqr, .qp_handle = c.handle };
	munmap(c.map, c.abi.mmap_size);
	if ((err = command(IB_USER_VERBS_CMD_DESTROY_QP, &dq, sizeof(dq), sizeof(dqr))))
		DIE("destroy_qp failed: %s", strerror(err));

	__atomic_store_n(&qp_db(a)->sq_producer, a->abi.sq_depth + 1, __ATOMIC_RELEASE);
	err = try_post_send(a, 0);
	printf("refused: a producer beyond the ring: %s\n", strerror(err));
	__atomic_store_n(&qp_db(a)->sq_producer, 0, __ATOMIC_RELEASE);
	err = try_post_send(a, 1);
	printf("refused: a work request in POST_SEND: %s\n", strerror(err));

	struct {
		struct ib_uverbs_create_cq_resp core;
		struct virtio_rdma_abi_create_cq_resp abi;
	} cr;
	struct ib_uverbs_create_cq ccq = { .response = (uintptr_t)&cr, .cqe = max_cqe + 1, .comp_channel = -1 };
	err = command(IB_USER_VERBS_CMD_CREATE_CQ, &ccq, sizeof(ccq), sizeof(cr));
	printf("refused: a CQ of %u entries: %s\n", max_cqe + 1, strerror(err));
}

/* Waits for n CQEs in the mapped CQ (from index *next), 10 s at most. */
static void poll_cq(unsigned char *cq, __u32 depth, __u32 *next, struct virtio_rdma_cqe *got, __u32 n)
{
	struct virtio_rdma_cq_control *ctl = (void *)cq;
	struct timespec t0, t;
	__u32 have = 0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (have < n) {
		struct virtio_rdma_cqe *e = (void *)(cq + VIRTIO_RDMA_CQE_OFFSET + (*next % depth) * VIRTIO_RDMA_CQE_SIZE);
		if (__atomic_load_n(&e->owner, __ATOMIC_ACQUIRE) == virtio_rdma_cqe_phase(*next, depth)) {
			got[have++] = *e;
			__atomic_store_n(&ctl->consumer, ++*next, __ATOMIC_RELEASE);
			continue;
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 10)
			DIE("only %u of %u completions in 10 s (device produced %u)", have, n, ctl->producer);
		usleep(1000);
	}
}

/*
 * UD: both QPs to RTS with one Q_Key, an AH to the device's own address, a receive (GRH room +
 * 256 bytes) on B, a 256-byte SEND from A naming the AH, B's QPN and the Q_Key; the two
 * completions and the bytes checked. The process exits without destroying: ib_core's cleanup does.
 */
static int ud_test(struct qp *a, struct qp *b, const __u8 *gid, int sgid, __u32 pd, unsigned char *buf, __u32 lkey,
		   unsigned char *cq, __u32 depth)
{
	struct qp *qs[2] = { a, b };
	struct ib_uverbs_modify_qp m;
	int err;

	for (int i = 0; i < 2; i++) {
		memset(&m, 0, sizeof(m));
		m.qp_state = IB_QPS_INIT;
		m.port_num = 1;
		m.qkey = UD_QKEY;
		modify(qs[i], IB_QP_STATE | IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_QKEY, &m, "to INIT");
		memset(&m, 0, sizeof(m));
		m.qp_state = IB_QPS_RTR;
		modify(qs[i], IB_QP_STATE, &m, "to RTR");
		memset(&m, 0, sizeof(m));
		m.qp_state = IB_QPS_RTS;
		m.sq_psn = 7;
		modify(qs[i], IB_QP_STATE | IB_QP_SQ_PSN, &m, "to RTS");
	}
	struct {
		struct ib_uverbs_create_ah_resp core;
		struct virtio_rdma_abi_create_ah_resp abi;
	} __attribute__((packed)) ar;
	struct ib_uverbs_create_ah ca = { .response = (uintptr_t)&ar, .pd_handle = pd };
	memcpy(ca.attr.grh.dgid, gid, 16);
	ca.attr.grh.sgid_index = (__u8)sgid;
	ca.attr.grh.hop_limit = 64;
	ca.attr.is_global = 1;
	ca.attr.port_num = 1;
	memset(&ar, 0, sizeof(ar));
	if ((err = command(IB_USER_VERBS_CMD_CREATE_AH, &ca, sizeof(ca), sizeof(ar))))
		DIE("create_ah failed: %s", strerror(err));
	if (ar.abi.ah_handle == 0)
		DIE("create_ah answered device handle 0");
	printf("ud qpn %u and %u in RTS, ah handle %u through GID index %d\n", a->qpn, b->qpn, ar.abi.ah_handle, sgid);

	struct virtio_rdma_recv_wqe *rw = (void *)(b->map + b->abi.rq_offset);
	struct virtio_rdma_sge *rs = (void *)(rw + 1);
	rw->wr_id = 0x4001;
	rw->num_sge = 1;
	rs->addr = (uintptr_t)buf + 49152;
	rs->length = 40 + 256;
	rs->lkey = lkey;
	__atomic_store_n(&qp_db(b)->rq_producer, ++b->rq_prod, __ATOMIC_RELEASE);
	ring(IB_USER_VERBS_CMD_POST_RECV, b);
	struct virtio_rdma_send_wqe *sw = next_send(a, 0x3001, 2 /* IBV_WR_SEND */, (uintptr_t)buf, 256, lkey);
	sw->ah = ar.abi.ah_handle;
	sw->remote_qpn = b->qpn;
	sw->remote_qkey = UD_QKEY;
	__atomic_store_n(&qp_db(a)->sq_producer, a->sq_prod, __ATOMIC_RELEASE);
	ring(IB_USER_VERBS_CMD_POST_SEND, a);

	struct virtio_rdma_cqe got[2];
	__u32 next = 0;
	poll_cq(cq, depth, &next, got, 2);
	int send = 0, recv = 0;
	for (int i = 0; i < 2; i++) {
		struct virtio_rdma_cqe *e = &got[i];
		printf("ud cqe wr_id=%#" PRIx64 " status=%u opcode=%u byte_len=%u qp_num=%u src_qp=%u wc_flags=%#x\n",
		       (uint64_t)e->wr_id, e->status, e->opcode, e->byte_len, e->qp_num, e->src_qp, e->wc_flags);
		if (e->status == 0 && e->wr_id == 0x3001 && e->opcode == 0 && e->qp_num == a->qpn)
			send++;
		else if (e->status == 0 && e->wr_id == 0x4001 && e->opcode == 128 && e->byte_len == 40 + 256 &&
			 e->qp_num == b->qpn && e->src_qp == a->qpn)
			recv++;
		else
			DIE("UD completion %#" PRIx64 " is not one that was asked for", (uint64_t)e->wr_id);
	}
	if (send != 1 || recv != 1)
		DIE("UD completions: %d SEND, %d RECV (want one each)", send, recv);
	if (memcmp(buf + 49152 + 40, buf, 256) != 0)
		DIE("the UD SEND's bytes did not land after the GRH");
	printf("ud ok: SEND and RECV (40 + 256 bytes, src_qp %u) completed, data matches\n", a->qpn);
	return 0;
}

/*
 * SRQ: an SRQ (CREATE_SRQ, its ring mapped), RC QP B on it and A connected to B, a receive
 * written into the SRQ's ring and rung (POST_SRQ_RECV, no WR), a 1 KiB SEND from A; both
 * completions and the bytes checked. The process exits holding everything.
 */
static int srq_test(__u32 pd, __u32 cqh, unsigned char *buf, __u32 lkey, unsigned char *cq, __u32 depth)
{
	struct {
		struct ib_uverbs_create_srq_resp core;
		struct virtio_rdma_abi_create_srq_resp abi;
	} sr;
	struct ib_uverbs_create_srq cs = { .response = (uintptr_t)&sr, .pd_handle = pd, .max_wr = 10, .max_sge = 2 };
	int err;

	memset(&sr, 0, sizeof(sr));
	if ((err = command(IB_USER_VERBS_CMD_CREATE_SRQ, &cs, sizeof(cs), sizeof(sr))))
		DIE("create_srq failed: %s", strerror(err));
	if (sr.abi.depth != 16 || sr.core.max_wr != 16 || sr.abi.stride != virtio_rdma_recv_stride(2) ||
	    sr.abi.db_offset + sizeof(struct virtio_rdma_abi_qp_db) > sr.abi.mmap_size)
		DIE("create_srq answered depth %u/%u, stride %u, db at %u of %u", sr.abi.depth, sr.core.max_wr, sr.abi.stride,
		    sr.abi.db_offset, sr.abi.mmap_size);
	unsigned char *srq_map = map(sr.abi.mmap_offset, sr.abi.mmap_size, "SRQ ring");
	printf("srq depth=%u stride=%u map=%u\n", sr.abi.depth, sr.abi.stride, sr.abi.mmap_size);

	struct qp a, b;
	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	create_qp(&a, pd, cqh, IB_UVERBS_QPT_RC);
	create_qp_srq(&b, pd, cqh, IB_UVERBS_QPT_RC, sr.core.srq_handle);
	__u8 gid[16];
	int sgid = find_gid(gid);
	if (sgid < 0)
		DIE("no RoCEv2 GID ::ffff:a.b.c.d in vrdma0's table");
	connect_qp(&a, &b, gid, sgid);
	connect_qp(&b, &a, gid, sgid);

	struct virtio_rdma_recv_wqe *rw = (void *)(srq_map + sr.abi.ring_offset);
	struct virtio_rdma_sge *rs = (void *)(rw + 1);
	rw->wr_id = 0x5001;
	rw->num_sge = 1;
	rs->addr = (uintptr_t)buf + 57344;
	rs->length = 1024;
	rs->lkey = lkey;
	struct virtio_rdma_abi_qp_db *db = (void *)(srq_map + sr.abi.db_offset);
	__atomic_store_n(&db->rq_producer, 1, __ATOMIC_RELEASE);
	struct ib_uverbs_post_srq_recv_resp pr;
	struct ib_uverbs_post_srq_recv ps = { .response = (uintptr_t)&pr, .srq_handle = sr.core.srq_handle,
					      .wqe_size = sizeof(struct ib_uverbs_recv_wr) };
	if ((err = command(IB_USER_VERBS_CMD_POST_SRQ_RECV, &ps, sizeof(ps), sizeof(pr))))
		DIE("post_srq_recv (the doorbell) failed: %s", strerror(err));
	if (try_post_recv(&b) != EINVAL)
		DIE("POST_RECV on a QP on an SRQ was not refused");

	next_send(&a, 0x6001, 2 /* IBV_WR_SEND */, (uintptr_t)buf + 1000, 1024, lkey);
	__atomic_store_n(&qp_db(&a)->sq_producer, a.sq_prod, __ATOMIC_RELEASE);
	ring(IB_USER_VERBS_CMD_POST_SEND, &a);

	struct virtio_rdma_cqe got[2];
	__u32 next = 0;
	poll_cq(cq, depth, &next, got, 2);
	int send = 0, recv = 0;
	for (int i = 0; i < 2; i++) {
		struct virtio_rdma_cqe *e = &got[i];
		printf("srq cqe wr_id=%#" PRIx64 " status=%u opcode=%u byte_len=%u qp_num=%u\n", (uint64_t)e->wr_id,
		       e->status, e->opcode, e->byte_len, e->qp_num);
		if (e->status == 0 && e->wr_id == 0x6001 && e->opcode == 0 && e->qp_num == a.qpn)
			send++;
		else if (e->status == 0 && e->wr_id == 0x5001 && e->opcode == 128 && e->byte_len == 1024 && e->qp_num == b.qpn)
			recv++;
		else
			DIE("SRQ completion %#" PRIx64 " is not one that was asked for", (uint64_t)e->wr_id);
	}
	if (send != 1 || recv != 1 || memcmp(buf + 57344, buf + 1000, 1024) != 0)
		DIE("SRQ: %d SEND, %d RECV completions, data %s", send, recv,
		    memcmp(buf + 57344, buf + 1000, 1024) ? "differs" : "matches");
	printf("srq ok: a SEND to a QP on the SRQ took the SRQ's receive (1024 bytes), data matches\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 3)
		DIE("usage: uverbs_data DEV rc|ud|srq|hold");
	int hold = strcmp(argv[2], "hold") == 0, err;
	if ((fd = open(argv[1], O_RDWR | O_CLOEXEC)) < 0)
		DIE("open %s: %s", argv[1], strerror(errno));

	struct {
		struct ib_uverbs_get_context_resp core;
		struct virtio_rdma_abi_ucontext_resp abi;
	} ctx;
	struct ib_uverbs_get_context gc = { .response = (uintptr_t)&ctx };
	memset(&ctx, 0, sizeof(ctx));
	if ((err = command(IB_USER_VERBS_CMD_GET_CONTEXT, &gc, sizeof(gc), sizeof(ctx))))
		DIE("get_context failed: %s", strerror(err));
	if (ctx.abi.abi_version != VIRTIO_RDMA_ABI_VERSION)
		DIE("the driver speaks ABI %u, this program %u", ctx.abi.abi_version, VIRTIO_RDMA_ABI_VERSION);
	printf("context abi=%u max_qp_wr=%u max_cqe=%u max_sge=%u max_inline=%u\n", ctx.abi.abi_version,
	       ctx.abi.max_qp_wr, ctx.abi.max_cqe, ctx.abi.max_sge, ctx.abi.max_inline);

	struct ib_uverbs_alloc_pd_resp pr;
	struct ib_uverbs_alloc_pd ap = { .response = (uintptr_t)&pr };
	if ((err = command(IB_USER_VERBS_CMD_ALLOC_PD, &ap, sizeof(ap), sizeof(pr))))
		DIE("alloc_pd failed: %s", strerror(err));

	enum { BUF = 64 << 10 };
	unsigned char *buf = aligned_alloc(4096, BUF);
	if (!buf)
		DIE("no memory");
	memset(buf, 0, BUF);
	for (int i = 0; i < 12288; i++)
		buf[i] = (unsigned char)(i * 7 + 3);  /* the SEND's 4 KiB, then the WRITE's 8 KiB */
	struct ib_uverbs_reg_mr_resp mr;
	struct ib_uverbs_reg_mr rm = {
		.response = (uintptr_t)&mr, .start = (uintptr_t)buf, .length = BUF, .hca_va = (uintptr_t)buf,
		.pd_handle = pr.pd_handle,
		.access_flags = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE | IB_ACCESS_REMOTE_READ,
	};
	if ((err = command(IB_USER_VERBS_CMD_REG_MR, &rm, sizeof(rm), sizeof(mr))))
		DIE("reg_mr failed: %s", strerror(err));
	printf("mr lkey=%#x rkey=%#x\n", mr.lkey, mr.rkey);

	struct ib_uverbs_create_comp_channel_resp ch;
	struct ib_uverbs_create_comp_channel cc = { .response = (uintptr_t)&ch };
	if ((err = command(IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL, &cc, sizeof(cc), sizeof(ch))))
		DIE("create_comp_channel failed: %s", strerror(err));

	struct {
		struct ib_uverbs_create_cq_resp core;
		struct virtio_rdma_abi_create_cq_resp abi;
	} cr;
	struct ib_uverbs_create_cq ccq = { .response = (uintptr_t)&cr, .user_handle = 0xc0ffee, .cqe = 50,
					   .comp_channel = (__s32)ch.fd };
	memset(&cr, 0, sizeof(cr));
	if ((err = command(IB_USER_VERBS_CMD_CREATE_CQ, &ccq, sizeof(ccq), sizeof(cr))))
		DIE("create_cq failed: %s", strerror(err));
	if (cr.abi.depth != 64 || cr.core.cqe != 64 || cr.abi.mmap_size < VIRTIO_RDMA_CQE_OFFSET + 64 * VIRTIO_RDMA_CQE_SIZE)
		DIE("create_cq answered depth %u/%u, %u bytes (asked 50: want 64)", cr.abi.depth, cr.core.cqe, cr.abi.mmap_size);
	unsigned char *cq = map(cr.abi.mmap_offset, cr.abi.mmap_size, "CQ ring");
	printf("cq depth=%u map=%u\n", cr.abi.depth, cr.abi.mmap_size);

	struct qp a, b;
	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	int ud = strcmp(argv[2], "ud") == 0, srq = strcmp(argv[2], "srq") == 0;
	if (srq)
		return srq_test(pr.pd_handle, cr.core.cq_handle, buf, mr.lkey, cq, cr.abi.depth);
	create_qp(&a, pr.pd_handle, cr.core.cq_handle, ud ? IB_UVERBS_QPT_UD : IB_UVERBS_QPT_RC);
	create_qp(&b, pr.pd_handle, cr.core.cq_handle, ud ? IB_UVERBS_QPT_UD : IB_UVERBS_QPT_RC);
	__u8 gid[16];
	int sgid = find_gid(gid);
	if (sgid < 0)
		DIE("no RoCEv2 GID ::ffff:a.b.c.d in vrdma0's table");
	if (ud)
		return ud_test(&a, &b, gid, sgid, pr.pd_handle, buf, mr.lkey, cq, cr.abi.depth);
	connect_qp(&a, &b, gid, sgid);
	connect_qp(&b, &a, gid, sgid);
	printf("connected qpn %u <-> %u through GID index %d\n", a.qpn, b.qpn, sgid);
	if (!hold)
		refusals(&a, &b, pr.pd_handle, cr.core.cq_handle, ctx.abi.max_cqe, sgid);
	if (hold) {
		printf("held pid=%d\n", (int)getpid());
		fflush(stdout);
		sleep(60);
		return 1;
	}

	/* A receive for the SEND: 4 KiB at 16 KiB. */
	struct virtio_rdma_recv_wqe *rw = (void *)(b.map + b.abi.rq_offset + (b.rq_prod % b.abi.rq_depth) * b.abi.rq_stride);
	struct virtio_rdma_sge *rs = (void *)(rw + 1);
	rw->wr_id = 0x2001;
	rw->num_sge = 1;
	rs->addr = (uintptr_t)buf + 16384;
	rs->length = 4096;
	rs->lkey = mr.lkey;
	__atomic_store_n(&qp_db(&b)->rq_producer, ++b.rq_prod, __ATOMIC_RELEASE);
	ring(IB_USER_VERBS_CMD_POST_RECV, &b);

	struct ib_uverbs_req_notify_cq rn = { .cq_handle = cr.core.cq_handle };
	if ((err = command(IB_USER_VERBS_CMD_REQ_NOTIFY_CQ, &rn, sizeof(rn), 0)))
		DIE("req_notify_cq failed: %s", strerror(err));

	/* A SEND of bytes 0..4095 and an RDMA WRITE of bytes 4096..12287 to 32 KiB. */
	next_send(&a, 0x1001, 2 /* IBV_WR_SEND */, (uintptr_t)buf, 4096, mr.lkey);
	struct virtio_rdma_send_wqe *sw = next_send(&a, 0x1002, 0 /* IBV_WR_RDMA_WRITE */, (uintptr_t)buf + 4096, 8192, mr.lkey);
	sw->remote_addr = (uintptr_t)buf + 32768;
	sw->rkey = mr.rkey;
	__atomic_store_n(&qp_db(&a)->sq_producer, a.sq_prod, __ATOMIC_RELEASE);
	ring(IB_USER_VERBS_CMD_POST_SEND, &a);

	/* Poll the mapped CQ: three completions within 10 s. */
	struct virtio_rdma_cqe got[3];
	__u32 next = 0;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	poll_cq(cq, cr.abi.depth, &next, got, 3);
	clock_gettime(CLOCK_MONOTONIC, &t);
	printf("polled 3 completions in %ld ms\n", (long)((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000));
	int seen_send = 0, seen_write = 0, seen_recv = 0;
	for (int i = 0; i < 3; i++) {
		struct virtio_rdma_cqe *e = &got[i];
		printf("cqe wr_id=%#" PRIx64 " status=%u opcode=%u byte_len=%u qp_num=%u\n", (uint64_t)e->wr_id, e->status,
		       e->opcode, e->byte_len, e->qp_num);
		if (e->status != 0)
			DIE("completion %#" PRIx64 " has status %u", (uint64_t)e->wr_id, e->status);
		if (e->wr_id == 0x1001 && e->opcode == 0 /* IBV_WC_SEND */ && e->qp_num == a.qpn)
			seen_send++;
		else if (e->wr_id == 0x1002 && e->opcode == 1 /* IBV_WC_RDMA_WRITE */ && e->qp_num == a.qpn)
			seen_write++;
		else if (e->wr_id == 0x2001 && e->opcode == 128 /* IBV_WC_RECV */ && e->byte_len == 4096 && e->qp_num == b.qpn)
			seen_recv++;
		else
			DIE("completion %#" PRIx64 " (opcode %u, %u bytes, QP %u) is not one that was asked for",
			    (uint64_t)e->wr_id, e->opcode, e->byte_len, e->qp_num);
	}
	if (seen_send != 1 || seen_write != 1 || seen_recv != 1)
		DIE("completions: %d SEND, %d WRITE, %d RECV (want one each)", seen_send, seen_write, seen_recv);
	printf("cqes ok: SEND, RDMA_WRITE and RECV (4096 bytes) with their wr_ids, status success\n");

	struct pollfd pf = { .fd = (int)ch.fd, .events = POLLIN };
	struct ib_uverbs_comp_event_desc ev;
	if (poll(&pf, 1, 5000) != 1 || read((int)ch.fd, &ev, sizeof(ev)) != sizeof(ev) || ev.cq_handle != 0xc0ffee)
		DIE("no completion event on the channel within 5 s after the CQ was armed");
	printf("completion event for the armed CQ (user handle %#" PRIx64 ")\n", (uint64_t)ev.cq_handle);

	if (memcmp(buf + 16384, buf, 4096) != 0)
		DIE("the SEND's bytes did not land at 16 KiB");
	if (memcmp(buf + 32768, buf + 4096, 8192) != 0)
		DIE("the RDMA WRITE's bytes did not land at 32 KiB");
	printf("data ok: SEND 4096 bytes and RDMA WRITE 8192 bytes match the pattern\n");

	/* An RDMA WRITE with a wrong rkey: a remote access error, and the QP's fatal event. */
	sw = next_send(&a, 0x1003, 0 /* IBV_WR_RDMA_WRITE */, (uintptr_t)buf, 64, mr.lkey);
	sw->remote_addr = (uintptr_t)buf + 32768;
	sw->rkey = mr.rkey ^ 0x5a5a00;
	__atomic_store_n(&qp_db(&a)->sq_producer, a.sq_prod, __ATOMIC_RELEASE);
	ring(IB_USER_VERBS_CMD_POST_SEND, &a);
	poll_cq(cq, cr.abi.depth, &next, got, 1);
	printf("bad rkey: cqe wr_id=%#" PRIx64 " status=%u\n", (uint64_t)got[0].wr_id, got[0].status);
	if (got[0].wr_id != 0x1003 || got[0].status != 10 /* IBV_WC_REM_ACCESS_ERR */)
		DIE("the WRITE with a wrong rkey completed with status %u, not REM_ACCESS_ERR (10)", got[0].status);
	struct pollfd af = { .fd = (int)ctx.core.async_fd, .events = POLLIN };
	struct ib_uverbs_async_event_desc ae;
	int fatal = 0;
	for (int i = 0; i < 4 && !fatal; i++) {
		if (poll(&af, 1, 5000) != 1 || read((int)ctx.core.async_fd, &ae, sizeof(ae)) != sizeof(ae))
			break;
		printf("async event type=%u element=%s\n", ae.event_type,
		       ae.element == (uintptr_t)&a ? "QP A" : ae.element == (uintptr_t)&b ? "QP B" : "?");
		fatal = ae.event_type == 1 /* IB_EVENT_QP_FATAL */ && ae.element == (uintptr_t)&a;
	}
	if (!fatal)
		DIE("no QP_FATAL event for QP A on the async fd within 5 s");
	printf("qp fatal event: QP A's error reached its async event fd\n");

	/* Destroyed in order (ib_uverbs would do the same at close). */
	struct ib_uverbs_destroy_qp_resp dqr;
	struct qp *qs[2] = { &a, &b };
	for (int i = 0; i < 2; i++) {
		struct ib_uverbs_destroy_qp dq = { .response = (uintptr_t)&dqr, .qp_handle = qs[i]->handle };
		munmap(qs[i]->map, qs[i]->abi.mmap_size);
		if ((err = command(IB_USER_VERBS_CMD_DESTROY_QP, &dq, sizeof(dq), sizeof(dqr))))
			DIE("destroy_qp failed: %s", strerror(err));
	}
	munmap(cq, cr.abi.mmap_size);
	struct ib_uverbs_destroy_cq_resp dcr;
	struct ib_uverbs_destroy_cq dc = { .response = (uintptr_t)&dcr, .cq_handle = cr.core.cq_handle };
	if ((err = command(IB_USER_VERBS_CMD_DESTROY_CQ, &dc, sizeof(dc), sizeof(dcr))))
		DIE("destroy_cq failed: %s", strerror(err));
	struct ib_uverbs_dereg_mr dm = { .mr_handle = mr.mr_handle };
	if ((err = command(IB_USER_VERBS_CMD_DEREG_MR, &dm, sizeof(dm), 0)))
		DIE("dereg_mr failed: %s", strerror(err));
	struct ib_uverbs_dealloc_pd dp = { .pd_handle = pr.pd_handle };
	if ((err = command(IB_USER_VERBS_CMD_DEALLOC_PD, &dp, sizeof(dp), 0)))
		DIE("dealloc_pd failed: %s", strerror(err));
	printf("rc ok\n");
	return 0;
}
