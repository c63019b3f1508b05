// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * verbs_wr's `cq_ex` mode (verbs_wr GID-INDEX cq_ex): the extended CQ (ibv_create_cq_ex, ibv_start_poll /
 * next_poll / end_poll, the ibv_wc_read_* readers), the same two RC QPs' completions on two such
 * CQs:
 *   - refusals: wc_flags the device cannot report (completion timestamps: it has no clock; CVLAN,
 *     flow tag, TM), IGNORE_OVERRUN, a parent domain and an unknown wc_flags bit (libibverbs'
 *     own check) fail with EOPNOTSUPP, unknown comp_mask and creation flag bits with EINVAL;
 *   - an empty CQ's start_poll answers ENOENT; SEND_IMM, RDMA WRITE and WRITE_IMM (and the two
 *     receives they consume) read back through the pollers with every field (opcode, status,
 *     wr_id, byte_len, immediate in network order as posted, qp_num, src_qp, wc_flags), and the
 *     bytes that landed;
 *   - 24 WRITEs in batches of 8 through a ring of 16 (its wrap), in order; one completion taken by
 *     start_poll / end_poll and the next by ibv_poll_cq (one ring, one consumer index); an armed
 *     cq_ex's event through its completion channel; ibv_destroy_cq of both.
 * Prints "ok <what>" per check and "verbs_wr cq_ex: <n> ok, <m> failed"; exits 0 when m is 0.
 */
#include "verbs_wr.h"

/* ---- The extended CQ (verbs_wr GID-INDEX cq_ex) ---------------------------------------------- */

#define WC_ASKED (IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP)

static struct ibv_cq_ex *make_cqx(uint64_t wc_flags, uint32_t comp_mask, uint32_t flags, struct ibv_comp_channel *ch)
{
	struct ibv_cq_init_attr_ex a = { .cqe = 16, .channel = ch, .wc_flags = wc_flags, .comp_mask = comp_mask,
					 .flags = flags, .parent_domain = comp_mask & IBV_CQ_INIT_ATTR_MASK_PD ? pd : NULL };

	errno = 0;
	return ibv_create_cq_ex(ctx, &a);
}

/* One completion as the extended CQ's readers answer it (those of WC_ASKED). */
struct xwc {
	uint64_t wr_id;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	uint32_t vendor_err, byte_len, qp_num, src_qp;
	uint32_t imm;  /* __be32 as read */
	unsigned int flags;
};

static void xread(struct ibv_cq_ex *cq, struct xwc *w)
{
	*w = (struct xwc){ .wr_id = cq->wr_id, .status = cq->status, .opcode = ibv_wc_read_opcode(cq),
			   .vendor_err = ibv_wc_read_vendor_err(cq), .byte_len = ibv_wc_read_byte_len(cq),
			   .qp_num = ibv_wc_read_qp_num(cq), .src_qp = ibv_wc_read_src_qp(cq),
			   .imm = ibv_wc_read_imm_data(cq), .flags = ibv_wc_read_wc_flags(cq) };
}

/*
 * n completions within about 5 s (fewer if they do not come) through start_poll, next_poll until
 * ENOENT or n, end_poll; *polls counts the start_poll..end_poll rounds that found some.
 */
static int xpoll_n(struct ibv_cq_ex *cq, struct xwc *w, int n, int *polls)
{
	struct ibv_poll_cq_attr pa = { .comp_mask = 0 };
	struct timespec t0, t;
	int got = 0, r;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (got < n) {
		r = ibv_start_poll(cq, &pa);
		if (r == 0) {
			do
				xread(cq, &w[got++]);
			while (got < n && (r = ibv_next_poll(cq)) == 0);
			ibv_end_poll(cq);
			if (polls)
				++*polls;
		}
		if (r && r != ENOENT)
			DIE("start_poll/next_poll: %s", strerror(r));
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 5)
			break;
	}
	return got;
}

/* w is a successful receive with an immediate and these fields (printed). */
static int received(const struct xwc *w, uint64_t id, enum ibv_wc_opcode op, uint32_t len, uint32_t imm, uint32_t qpn,
		    uint32_t src)
{
	printf("receive: wr_id %llu status %d opcode %d byte_len %u imm 0x%08x wc_flags 0x%x qp_num %u src_qp %u\n",
	       (unsigned long long)w->wr_id, w->status, w->opcode, w->byte_len, ntohl(w->imm), w->flags, w->qp_num,
	       w->src_qp);
	return w->status == IBV_WC_SUCCESS && w->wr_id == id && w->opcode == op && w->byte_len == len &&
	       (w->flags & IBV_WC_WITH_IMM) && !(w->flags & IBV_WC_WITH_INV) && w->imm == imm && w->qp_num == qpn &&
	       w->src_qp == src && w->vendor_err == 0;
}

static void post_one(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op, size_t src, uint32_t len, size_t dst,
		     uint32_t imm)
{
	struct ibv_sge sg = { .addr = (uintptr_t)buf + src, .length = len, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sg, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED, .imm_data = imm }, *bad;

	wr.wr.rdma.remote_addr = (uintptr_t)buf + dst;
	wr.wr.rdma.rkey = mr->rkey;
	if (ibv_post_send(qp, &wr, &bad))
		DIE("post_send failed");
}

void cq_ex_tests(void)
{
	static const struct { uint64_t flag; const char *name; } no[] = {
		{ IBV_WC_EX_WITH_COMPLETION_TIMESTAMP, "COMPLETION_TIMESTAMP (the device has no clock)" },
		{ IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK, "COMPLETION_TIMESTAMP_WALLCLOCK" },
		{ IBV_WC_EX_WITH_CVLAN, "CVLAN" }, { IBV_WC_EX_WITH_FLOW_TAG, "FLOW_TAG" },
		{ IBV_WC_EX_WITH_TM_INFO, "TM_INFO" },
	};
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq_ex *cqa, *cqb, *c;
	struct ibv_qp *a, *b;
	struct ibv_poll_cq_attr pa = { .comp_mask = 0 };
	struct xwc w[32];
	struct ibv_wc wc[2];
	char what[200];
	int n, polls = 0, ok;

	if (!ch)
		DIE("create_comp_channel failed");
	/* Refusals: nothing is created. */
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
		c = make_cqx(WC_ASKED | no[i].flag, 0, 0, NULL);
		snprintf(what, sizeof(what), "create_cq_ex with IBV_WC_EX_WITH_%s is refused with EOPNOTSUPP (%s)", no[i].name,
			 strerror(errno));
		check(!c && errno == EOPNOTSUPP, what);
		if (c)
			ibv_destroy_cq(ibv_cq_ex_to_cq(c));
	}
	c = make_cqx(WC_ASKED | (1ull << 40), 0, 0, NULL);
	snprintf(what, sizeof(what), "create_cq_ex with an unknown wc_flags bit (1 << 40) fails with EOPNOTSUPP (%s)",
		 strerror(errno));
	check(!c && errno == EOPNOTSUPP, what);
	c = make_cqx(WC_ASKED, 1u << 7, 0, NULL);
	snprintf(what, sizeof(what), "create_cq_ex with an unknown comp_mask bit (1 << 7) fails with EINVAL (%s)", strerror(errno));
	check(!c && errno == EINVAL, what);
	c = make_cqx(WC_ASKED, IBV_CQ_INIT_ATTR_MASK_FLAGS, 1u << 6, NULL);
	snprintf(what, sizeof(what), "create_cq_ex with an unknown creation flag (1 << 6) fails with EINVAL (%s)", strerror(errno));
	check(!c && errno == EINVAL, what);
	c = make_cqx(WC_ASKED, IBV_CQ_INIT_ATTR_MASK_FLAGS, IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN, NULL);
	snprintf(what, sizeof(what), "create_cq_ex with IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN is refused with EOPNOTSUPP (%s)",
		 strerror(errno));
	check(!c && errno == EOPNOTSUPP, what);
	c = make_cqx(WC_ASKED, IBV_CQ_INIT_ATTR_MASK_PD, 0, NULL);
	snprintf(what, sizeof(what), "create_cq_ex with a parent domain is refused with EOPNOTSUPP (%s)", strerror(errno));
	check(!c && errno == EOPNOTSUPP, what);
	c = make_cqx(IBV_WC_STANDARD_FLAGS, IBV_CQ_INIT_ATTR_MASK_FLAGS, IBV_CREATE_CQ_ATTR_SINGLE_THREADED, NULL);
	check(c && c->read_byte_len && c->read_imm_data && c->read_qp_num && c->read_src_qp && c->read_slid && c->read_sl &&
		      c->read_dlid_path_bits && !c->read_completion_ts && ibv_destroy_cq(ibv_cq_ex_to_cq(c)) == 0,
	      "create_cq_ex with every standard wc_flag and SINGLE_THREADED: created with each reader, no timestamp reader; destroyed");

	cqa = make_cqx(WC_ASKED, 0, 0, ch);
	cqb = make_cqx(WC_ASKED, 0, 0, NULL);
	if (!cqa || !cqb)
		DIE("create_cq_ex with byte_len, imm, qp_num, src_qp: %s", strerror(errno));
	snprintf(what, sizeof(what), "create_cq_ex with byte_len, imm, qp_num, src_qp (cqe %d); an empty CQ's start_poll answers ENOENT",
		 ibv_cq_ex_to_cq(cqa)->cqe);
	check(ibv_start_poll(cqa, &pa) == ENOENT && ibv_start_poll(cqb, &pa) == ENOENT, what);
	a = make_qp(ibv_cq_ex_to_cq(cqa), IBV_QPT_RC, 0, 0);
	b = make_qp(ibv_cq_ex_to_cq(cqb), IBV_QPT_RC, 0, 0);
	if (!a || !b)
		DIE("create_qp RC on the cq_ex CQs: %s", strerror(errno));
	connect_rc(a, b->qp_num);
	connect_rc(b, a->qp_num);

	/* SEND_IMM, WRITE, WRITE_IMM; B's two receives. */
	fill(SRC, 8192, 5);
	memset(buf + RECV, 0, RDST - RECV);
	post_recvs(b, 200, 2, RECV, 4096);
	post_one(a, 1, IBV_WR_SEND_WITH_IMM, SRC, 1000, 0, htonl(0x12345678));
	post_one(a, 2, IBV_WR_RDMA_WRITE, SRC + 1024, 3000, TGT, 0);
	post_one(a, 3, IBV_WR_RDMA_WRITE_WITH_IMM, SRC + 5000, 500, TGT + 4096, htonl(0x9abcdef0));
	n = xpoll_n(cqa, w, 3, NULL);
	static const enum ibv_wc_opcode sops[] = { IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_WRITE };
	ok = n == 3;
	for (int i = 0; i < n && ok; i++)
		ok = w[i].status == IBV_WC_SUCCESS && w[i].wr_id == (uint64_t)i + 1 && w[i].opcode == sops[i] &&
		     w[i].qp_num == a->qp_num && w[i].vendor_err == 0;
	snprintf(what, sizeof(what),
		 "the sender's 3 completions by start/next/end_poll: in order, SUCCESS, wr_ids 1-3, SEND, RDMA_WRITE x2, qp_num %u (%d came)",
		 a->qp_num, n);
	check(ok, what);
	n = xpoll_n(cqb, w, 2, NULL);
	check(n >= 1 && received(&w[0], 200, IBV_WC_RECV, 1000, htonl(0x12345678), b->qp_num, a->qp_num),
	      "receive of the SEND_IMM: wr_id 200, RECV, byte_len 1000, IBV_WC_WITH_IMM, imm_data htonl(0x12345678), qp_num B, src_qp A");
	check(n == 2 && received(&w[1], 201, IBV_WC_RECV_RDMA_WITH_IMM, 500, htonl(0x9abcdef0), b->qp_num, a->qp_num),
	      "receive of the WRITE_IMM: wr_id 201, RECV_RDMA_WITH_IMM, byte_len 500, WITH_IMM, imm_data htonl(0x9abcdef0), qp_num B, src_qp A");
	check(same(RECV, SRC, 1000) && same(TGT, SRC + 1024, 3000) && same(TGT + 4096, SRC + 5000, 500),
	      "the bytes landed: SEND_IMM 1000 B in the receive buffer, WRITE 3000 B and WRITE_IMM 500 B at their targets");
	check(ibv_start_poll(cqa, &pa) == ENOENT && ibv_start_poll(cqb, &pa) == ENOENT,
	      "both CQs drained: start_poll answers ENOENT");
	pa.comp_mask = 1;
	check(ibv_start_poll(cqa, &pa) == EINVAL, "start_poll with a comp_mask bit answers EINVAL");
	pa.comp_mask = 0;

	/* Through the ring's wrap, several CQEs a poll. */
	ok = 1;
	n = 0;
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < 8; i++)
			post_one(a, 10 + (uint64_t)(round * 8 + i), IBV_WR_RDMA_WRITE, SRC + (size_t)i * 64, 64,
				 TGT + 8192 + (size_t)(round * 8 + i) * 64, 0);
		int got = xpoll_n(cqa, w + round * 8, 8, &polls);

		n += got;
		for (int i = 0; i < got; i++)
			ok &= w[round * 8 + i].status == IBV_WC_SUCCESS && w[round * 8 + i].wr_id == 10 + (uint64_t)(round * 8 + i) &&
			      w[round * 8 + i].opcode == IBV_WC_RDMA_WRITE;
	}
	snprintf(what, sizeof(what), "24 WRITEs in 3 batches of 8 through a ring of %d (its wrap): %d completions in order in %d polls",
		 ibv_cq_ex_to_cq(cqa)->cqe, n, polls);
	check(ok && n == 24 && same(TGT + 8192, SRC, 64) && same(TGT + 8192 + 23 * 64, SRC + 7 * 64, 64), what);

	/* One ring, one consumer index: start_poll/end_poll takes one, ibv_poll_cq the next. */
	post_one(a, 40, IBV_WR_RDMA_WRITE, SRC, 128, TGT + 12288, 0);
	post_one(a, 41, IBV_WR_RDMA_WRITE, SRC + 128, 128, TGT + 12288 + 128, 0);
	n = xpoll_n(cqa, w, 1, NULL);
	int m = poll_n(ibv_cq_ex_to_cq(cqa), wc, 1);
	check(n == 1 && w[0].wr_id == 40 && m == 1 && wc[0].wr_id == 41 && wc[0].status == IBV_WC_SUCCESS &&
		      wc[0].opcode == IBV_WC_RDMA_WRITE && wc[0].qp_num == a->qp_num && quiet(ibv_cq_ex_to_cq(cqa)) &&
		      same(TGT + 12288, SRC, 256),
	      "one completion by start_poll/end_poll, the next by ibv_poll_cq on the same cq_ex: none lost or repeated");
	post_recvs(b, 300, 1, RECV, 4096);
	post_one(a, 42, IBV_WR_SEND_WITH_IMM, SRC + 2048, 700, 0, htonl(0xcafe0042));
	m = poll_n(ibv_cq_ex_to_cq(cqb), wc, 1);
	check(m == 1 && wc[0].wr_id == 300 && wc[0].status == IBV_WC_SUCCESS && wc[0].opcode == IBV_WC_RECV &&
		      wc[0].byte_len == 700 && (wc[0].wc_flags & IBV_WC_WITH_IMM) && wc[0].imm_data == htonl(0xcafe0042) &&
		      wc[0].qp_num == b->qp_num && wc[0].src_qp == a->qp_num && same(RECV, SRC + 2048, 700),
	      "ibv_poll_cq on a cq_ex: a SEND_IMM's receive with byte_len, immediate, qp_num, src_qp and its bytes");
	m = poll_n(ibv_cq_ex_to_cq(cqa), wc, 1);
	check(m == 1 && wc[0].wr_id == 42 && wc[0].opcode == IBV_WC_SEND, "ibv_poll_cq on a cq_ex: the SEND_IMM's own completion");

	/* Arming: req_notify_cq on the cq_ex, the event through its channel. */
	struct ibv_cq *ev = NULL;
	void *evctx = NULL;
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	int armed = ibv_req_notify_cq(ibv_cq_ex_to_cq(cqa), 0);

	post_one(a, 50, IBV_WR_RDMA_WRITE, SRC, 32, TGT, 0);
	ok = !armed && poll(&pfd, 1, 5000) == 1 && ibv_get_cq_event(ch, &ev, &evctx) == 0 && ev == ibv_cq_ex_to_cq(cqa);
	if (ev)
		ibv_ack_cq_events(ev, 1);
	n = xpoll_n(cqa, w, 1, NULL);
	check(ok && n == 1 && w[0].wr_id == 50 && w[0].status == IBV_WC_SUCCESS,
	      "req_notify_cq on the cq_ex: its event through the completion channel, then the completion by start_poll");

	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	check(ibv_destroy_cq(ibv_cq_ex_to_cq(cqa)) == 0 && ibv_destroy_cq(ibv_cq_ex_to_cq(cqb)) == 0,
	      "ibv_destroy_cq(ibv_cq_ex_to_cq()) destroys both");
	ibv_destroy_comp_channel(ch);
}
