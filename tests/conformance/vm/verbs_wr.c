// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * verbs_wr: the extended send API (ibv_create_qp_ex with send ops flags, ibv_wr_*) through
 * Debian's libibverbs and the rdma-core provider (guest/provider) on vrdma0, in vm_kmod_test's
 * guest. perftest falls back to ibv_post_send on any device it does not know (vendor 0 here), so
 * this program is what drives the provider's wr_* API. Two RC QPs on vrdma0 connected to each
 * other through the device's GID (GID index argv[1]), then:
 *   - refusals: send ops the device cannot do (BIND_MW, LOCAL_INV, SEND_WITH_INV, TSO; RDMA WRITE
 *     on UD) fail with EOPNOTSUPP; a QP made by ibv_create_qp has no ibv_qp_ex;
 *   - one batch of every builder (SEND with one SGE, SEND_IMM with an SGE list, WRITE with inline
 *     data, WRITE_IMM with an inline list, READ, FETCH_ADD, CMP_SWP) rung by one doorbell: the
 *     completions in order with their wr_ids, the receiver's data, immediates and the atomics'
 *     results checked;
 *   - wr_abort discards its WRs; latched errors (too many SGEs, inline beyond max_inline, a full
 *     ring, a setter before any builder) fail wr_complete with nothing posted; a batch of exactly
 *     the ring's depth goes; ibv_post_send still works on the same QP;
 *   - UD: SENDs addressed with wr_set_ud_addr arrive after their 40-byte GRH; a UD WR without an
 *     address fails wr_complete with EINVAL.
 * Prints "ok <what>" per check, "doorbells=<n> send_wqes=<m>" (the doorbells it rang: every
 * successful ibv_post_recv, ibv_post_send and wr_complete; the send WQEs those posted: the test
 * compares vrdmad's counts, so a batch is one doorbell and an aborted or failed one puts nothing
 * in front of the device) and exits 0 when every check passed.
 *
 * `verbs_wr GID-INDEX cq_ex` instead: the extended CQ (verbs_cqx.c).
 */
#include "verbs_wr.h"

int passed, failed, doorbells, wqes;  /* doorbells rung, send WQEs posted */
struct ibv_context *ctx;
struct ibv_pd *pd;
struct ibv_mr *mr;
unsigned char *buf;
union ibv_gid gid;
int sgid;

void check(int ok, const char *what)
{
	printf("%s %s\n", ok ? "ok  " : "FAIL", what);
	if (ok)
		passed++;
	else
		failed++;
}

struct ibv_qp *make_qp(struct ibv_cq *cq, enum ibv_qp_type type, uint64_t ops, int ex)
{
	struct ibv_qp_init_attr_ex a = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = DEPTH, .max_recv_wr = DEPTH, .max_send_sge = MAX_SGE, .max_recv_sge = MAX_SGE,
			 .max_inline_data = MAX_INLINE },
		.qp_type = type,
		.comp_mask = IBV_QP_INIT_ATTR_PD | (ex ? IBV_QP_INIT_ATTR_SEND_OPS_FLAGS : 0),
		.pd = pd,
		.send_ops_flags = ops,
	};

	return ibv_create_qp_ex(ctx, &a);
}

void modify(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, const char *what)
{
	int err = ibv_modify_qp(qp, a, mask);

	if (err)
		DIE("modify_qp %s: %s", what, strerror(err));
}

void connect_rc(struct ibv_qp *qp, uint32_t peer)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
						    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC };

	modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = (uint8_t)sgid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER, "RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 4;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			       IBV_QP_MAX_QP_RD_ATOMIC, "RTS");
}

/* n completions from cq within about 5 s (fewer if they do not come). */
int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n)
{
	int got = 0;
	struct timespec t0, t;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (got < n) {
		int r = ibv_poll_cq(cq, n - got, wc + got);

		if (r < 0)
			DIE("poll_cq failed");
		got += r;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 5)
			break;
	}
	return got;
}

/* Nothing more completes on cq within 0.3 s. */
int quiet(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	struct timespec d = { 0, 1000000 };

	for (int i = 0; i < 300; i++) {
		if (ibv_poll_cq(cq, 1, &wc) != 0)
			return 0;
		nanosleep(&d, NULL);
	}
	return 1;
}

void post_recvs(struct ibv_qp *qp, uint64_t first_id, int n, size_t off, uint32_t len)
{
	struct ibv_recv_wr wr[DEPTH], *bad;
	struct ibv_sge sg[DEPTH];

	for (int i = 0; i < n; i++) {
		sg[i] = (struct ibv_sge){ .addr = (uintptr_t)buf + off + (size_t)i * len, .length = len, .lkey = mr->lkey };
		wr[i] = (struct ibv_recv_wr){ .wr_id = first_id + (uint64_t)i, .sg_list = &sg[i], .num_sge = 1,
					      .next = i + 1 < n ? &wr[i + 1] : NULL };
	}
	if (ibv_post_recv(qp, wr, &bad))
		DIE("post_recv failed");
	doorbells++;
}

void fill(size_t off, size_t len, unsigned char seed)
{
	for (size_t i = 0; i < len; i++)
		buf[off + i] = (unsigned char)(seed + i * 7);
}

int same(size_t a, size_t b, size_t len)
{
	return memcmp(buf + a, buf + b, len) == 0;
}

static void rc_tests(void)
{
	struct ibv_cq *cqa = ibv_create_cq(ctx, 64, NULL, NULL, 0), *cqb = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_qp *a, *b, *legacy;
	struct ibv_qp_ex *x;
	struct ibv_wc wc[DEPTH + 1];
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	char what[160];
	int n, err;

	if (!cqa || !cqb)
		DIE("create_cq failed");
	/* Refusals. */
	static const struct { uint64_t op; const char *name; } no[] = {
		{ IBV_QP_EX_WITH_BIND_MW, "BIND_MW" }, { IBV_QP_EX_WITH_LOCAL_INV, "LOCAL_INV" },
		{ IBV_QP_EX_WITH_SEND_WITH_INV, "SEND_WITH_INV" }, { IBV_QP_EX_WITH_TSO, "TSO" },
	};
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
		errno = 0;
		struct ibv_qp *q = make_qp(cqa, IBV_QPT_RC, IBV_QP_EX_WITH_SEND | no[i].op, 1);

		snprintf(what, sizeof(what), "create_qp_ex with send op %s is refused with EOPNOTSUPP", no[i].name);
		check(!q && errno == EOPNOTSUPP, what);
		if (q)
			ibv_destroy_qp(q);
	}
	errno = 0;
	legacy = make_qp(cqa, IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE, 1);
	check(!legacy && errno == EOPNOTSUPP, "create_qp_ex UD with RDMA_WRITE is refused with EOPNOTSUPP");
	legacy = make_qp(cqa, IBV_QPT_RC, 0, 0);
	check(legacy && !ibv_qp_to_qp_ex(legacy), "a QP without send ops flags has no ibv_qp_ex");
	if (legacy)
		ibv_destroy_qp(legacy);

	a = make_qp(cqa, IBV_QPT_RC, ALL_OPS, 1);
	b = make_qp(cqb, IBV_QPT_RC, ALL_OPS, 1);
	if (!a || !b)
		DIE("create_qp_ex RC with every supported send op: %s", strerror(errno));
	x = ibv_qp_to_qp_ex(a);
	check(x && ibv_qp_to_qp_ex(b), "create_qp_ex RC with SEND, SEND_IMM, WRITE, WRITE_IMM, READ, CMP_SWP, FETCH_ADD: ibv_qp_to_qp_ex answers");
	if (!x)
		DIE("no ibv_qp_ex");
	if (ibv_query_qp(a, &qa, IBV_QP_CAP, &qia))
		DIE("query_qp failed");
	uint32_t depth = qia.cap.max_send_wr, max_sge = qia.cap.max_send_sge, max_inline = qia.cap.max_inline_data;
	printf("qp caps: max_send_wr %u max_send_sge %u max_inline_data %u\n", depth, max_sge, max_inline);
	connect_rc(a, b->qp_num);
	connect_rc(b, a->qp_num);

	/* One batch of every builder, one doorbell. */
	fill(SRC, 8192, 1);
	memset(buf + RECV, 0, TGT - RECV);
	memset(buf + TGT, 0, RDST - TGT);
	fill(TGT + 4096, 2048, 99);  /* what the READ fetches */
	memset(buf + RDST, 0, 4096);
	uint64_t atom[2] = { 1000, 7 }, res[2] = { 0, 0 };
	memcpy(buf + ATOM, atom, sizeof(atom));
	memcpy(buf + ARES, res, sizeof(res));
	post_recvs(b, 100, 3, RECV, 4096);
	uint64_t base = (uintptr_t)buf;
	struct ibv_sge list[3] = {
		{ .addr = base + SRC + 1000, .length = 100, .lkey = mr->lkey },
		{ .addr = base + SRC + 2000, .length = 200, .lkey = mr->lkey },
		{ .addr = base + SRC + 3000, .length = 300, .lkey = mr->lkey },
	};
	struct ibv_data_buf ilist[2] = { { buf + SRC + 5000, 20 }, { buf + SRC + 6000, 30 } };

	ibv_wr_start(x);
	x->wr_flags = IBV_SEND_SIGNALED;
	x->wr_id = 1;
	ibv_wr_send(x);
	ibv_wr_set_sge(x, mr->lkey, base + SRC, 1500);
	x->wr_id = 2;
	ibv_wr_send_imm(x, htonl(0x11223344));
	ibv_wr_set_sge_list(x, 3, list);
	x->wr_id = 3;
	ibv_wr_rdma_write(x, mr->rkey, base + TGT);
	ibv_wr_set_inline_data(x, buf + SRC + 4000, 40);
	x->wr_id = 4;
	ibv_wr_rdma_write_imm(x, mr->rkey, base + TGT + 100, htonl(0x55667788));
	ibv_wr_set_inline_data_list(x, 2, ilist);
	x->wr_id = 5;
	ibv_wr_rdma_read(x, mr->rkey, base + TGT + 4096);
	ibv_wr_set_sge(x, mr->lkey, base + RDST, 2048);
	x->wr_id = 6;
	ibv_wr_atomic_fetch_add(x, mr->rkey, base + ATOM, 5);
	ibv_wr_set_sge(x, mr->lkey, base + ARES, 8);
	x->wr_id = 7;
	ibv_wr_atomic_cmp_swp(x, mr->rkey, base + ATOM + 8, 7, 42);
	ibv_wr_set_sge(x, mr->lkey, base + ARES + 8, 8);
	err = ibv_wr_complete(x);
	check(err == 0, "a batch of 7 WRs (every builder) is posted by wr_complete");
	if (!err)
		doorbells++, wqes += 7;
	n = poll_n(cqa, wc, 7);
	static const enum ibv_wc_opcode ops[] = { IBV_WC_SEND, IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_WRITE,
						   IBV_WC_RDMA_READ, IBV_WC_FETCH_ADD, IBV_WC_COMP_SWAP };
	int inorder = n == 7;
	for (int i = 0; i < n && inorder; i++)
		inorder = wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)i + 1 && wc[i].opcode == ops[i];
	snprintf(what, sizeof(what), "its 7 completions in order, successful, with their wr_ids and opcodes (%d came)", n);
	check(inorder, what);
	n = poll_n(cqb, wc, 3);
	check(n == 3 && wc[0].status == IBV_WC_SUCCESS && wc[0].byte_len == 1500 && !(wc[0].wc_flags & IBV_WC_WITH_IMM) &&
		      wc[1].status == IBV_WC_SUCCESS && wc[1].byte_len == 600 && (wc[1].wc_flags & IBV_WC_WITH_IMM) &&
		      wc[1].imm_data == htonl(0x11223344) && wc[2].status == IBV_WC_SUCCESS &&
		      wc[2].opcode == IBV_WC_RECV_RDMA_WITH_IMM && wc[2].imm_data == htonl(0x55667788) && wc[2].byte_len == 50,
	      "the receiver's 3 completions: SEND 1500 B, SEND_IMM 600 B with its immediate, WRITE_IMM 50 B with its immediate");
	check(same(RECV, SRC, 1500), "SEND (one SGE): the 1500 bytes arrived");
	check(same(RECV + 4096, SRC + 1000, 100) && same(RECV + 4096 + 100, SRC + 2000, 200) &&
		      same(RECV + 4096 + 300, SRC + 3000, 300),
	      "SEND_IMM (an SGE list of 3): the 600 bytes arrived in order");
	check(same(TGT, SRC + 4000, 40), "RDMA WRITE with inline data: the 40 bytes arrived");
	check(same(TGT + 100, SRC + 5000, 20) && same(TGT + 120, SRC + 6000, 30),
	      "RDMA WRITE_IMM with an inline list of 2: the 50 bytes arrived");
	check(same(RDST, TGT + 4096, 2048), "RDMA READ: the 2048 bytes were fetched");
	memcpy(atom, buf + ATOM, sizeof(atom));
	memcpy(res, buf + ARES, sizeof(res));
	check(atom[0] == 1005 && res[0] == 1000, "FETCH_ADD: 1000 + 5 at the target, 1000 returned");
	check(atom[1] == 42 && res[1] == 7, "CMP_SWP: 7 swapped for 42, 7 returned");

	/* wr_abort: nothing of it completes; the batch after it does. */
	ibv_wr_start(x);
	x->wr_id = 50;
	ibv_wr_rdma_write(x, mr->rkey, base + TGT + 8000);
	ibv_wr_set_sge(x, mr->lkey, base + SRC, 64);
	ibv_wr_abort(x);
	ibv_wr_start(x);
	x->wr_id = 51;
	ibv_wr_rdma_write(x, mr->rkey, base + TGT + 9000);
	ibv_wr_set_sge(x, mr->lkey, base + SRC, 64);
	err = ibv_wr_complete(x);
	if (!err)
		doorbells++, wqes++;
	n = poll_n(cqa, wc, 1);
	check(!err && n == 1 && wc[0].wr_id == 51 && wc[0].status == IBV_WC_SUCCESS && quiet(cqa) && same(TGT + 9000, SRC, 64) &&
		      buf[TGT + 8000] == 0,
	      "wr_abort discards its WR: only the next batch's completes");

	/* Latched errors: wr_complete fails, nothing of the batch is posted. */
	struct ibv_sge many[MAX_SGE + 8];
	for (size_t i = 0; i < sizeof(many) / sizeof(many[0]); i++)
		many[i] = (struct ibv_sge){ .addr = base + SRC + i * 16, .length = 16, .lkey = mr->lkey };
	ibv_wr_start(x);
	x->wr_id = 60;
	ibv_wr_send(x);
	ibv_wr_set_sge(x, mr->lkey, base + SRC, 16);
	x->wr_id = 61;
	ibv_wr_send(x);
	ibv_wr_set_sge_list(x, max_sge + 1, many);
	err = ibv_wr_complete(x);
	snprintf(what, sizeof(what), "max_send_sge + 1 SGEs: wr_complete answers EINVAL (%d), nothing posted", err);
	check(err == EINVAL && quiet(cqa), what);
	ibv_wr_start(x);
	x->wr_id = 62;
	ibv_wr_rdma_write(x, mr->rkey, base + TGT);
	ibv_wr_set_inline_data(x, buf + SRC, max_inline + 1);
	err = ibv_wr_complete(x);
	snprintf(what, sizeof(what), "inline data of max_inline + 1 bytes: wr_complete answers EINVAL (%d), nothing posted", err);
	check(err == EINVAL && quiet(cqa), what);
	ibv_wr_start(x);
	ibv_wr_set_sge(x, mr->lkey, base + SRC, 16);
	err = ibv_wr_complete(x);
	check(err == EINVAL && quiet(cqa), "a setter before any builder: wr_complete answers EINVAL");
	ibv_wr_start(x);
	for (uint32_t i = 0; i <= depth; i++) {
		x->wr_id = 1000 + i;
		ibv_wr_rdma_write(x, mr->rkey, base + TGT);
		ibv_wr_set_sge(x, mr->lkey, base + SRC, 16);
	}
	err = ibv_wr_complete(x);
	snprintf(what, sizeof(what), "%u + 1 WRs into a ring of %u: wr_complete answers ENOMEM (%d), nothing posted", depth, depth, err);
	check(err == ENOMEM && quiet(cqa), what);
	ibv_wr_start(x);
	for (uint32_t i = 0; i < depth; i++) {
		x->wr_id = 2000 + i;
		ibv_wr_rdma_write(x, mr->rkey, base + TGT + 16 * i);
		ibv_wr_set_sge(x, mr->lkey, base + SRC + 16 * i, 16);
	}
	err = ibv_wr_complete(x);
	if (!err)
		doorbells++, wqes += (int)depth;
	n = poll_n(cqa, wc, (int)depth);
	inorder = !err && n == (int)depth;
	for (int i = 0; i < n && inorder; i++)
		inorder = wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == 2000 + (uint64_t)i;
	snprintf(what, sizeof(what), "a batch of exactly %u WRs (the ring's depth) goes, %d completions in order", depth, n);
	check(inorder && quiet(cqa), what);

	/* ibv_post_send on the same QP. */
	struct ibv_sge sg = { .addr = base + SRC, .length = 256, .lkey = mr->lkey };
	struct ibv_send_wr swr = { .wr_id = 70, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				   .send_flags = IBV_SEND_SIGNALED }, *bad;
	swr.wr.rdma.remote_addr = base + TGT + 12000;
	swr.wr.rdma.rkey = mr->rkey;
	err = ibv_post_send(a, &swr, &bad);
	if (!err)
		doorbells++, wqes++;
	n = poll_n(cqa, wc, 1);
	check(!err && n == 1 && wc[0].wr_id == 70 && wc[0].status == IBV_WC_SUCCESS && same(TGT + 12000, SRC, 256),
	      "ibv_post_send still works on the same QP");

	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_destroy_cq(cqa);
	ibv_destroy_cq(cqb);
}

static void ud_tests(void)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_qp *s, *r;
	struct ibv_qp_ex *x;
	struct ibv_ah *ah;
	struct ibv_wc wc[4];
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1 };
	const uint32_t qkey = 0x11111111;
	uint64_t base = (uintptr_t)buf;
	int n, err;

	if (!cq)
		DIE("create_cq failed");
	s = make_qp(cq, IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM, 1);
	r = make_qp(cq, IBV_QPT_UD, IBV_QP_EX_WITH_SEND, 1);
	x = s ? ibv_qp_to_qp_ex(s) : NULL;
	check(s && r && x, "create_qp_ex UD with SEND and SEND_IMM");
	if (!x || !r)
		DIE("no UD QPs: %s", strerror(errno));
	for (int i = 0; i < 2; i++) {
		struct ibv_qp *q = i ? r : s;
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = qkey };

		modify(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY, "UD INIT");
		a.qp_state = IBV_QPS_RTR;
		modify(q, &a, IBV_QP_STATE, "UD RTR");
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = 0;
		modify(q, &a, IBV_QP_STATE | IBV_QP_SQ_PSN, "UD RTS");
	}
	aa.grh.dgid = gid;
	aa.grh.sgid_index = (uint8_t)sgid;
	aa.grh.hop_limit = 64;
	ah = ibv_create_ah(pd, &aa);
	if (!ah)
		DIE("create_ah failed: %s", strerror(errno));
	memset(buf + RECV, 0, 8192);
	post_recvs(r, 300, 2, RECV, 2048);
	fill(SRC, 2048, 33);
	ibv_wr_start(x);
	x->wr_flags = IBV_SEND_SIGNALED;
	x->wr_id = 80;
	ibv_wr_send(x);
	ibv_wr_set_ud_addr(x, ah, r->qp_num, qkey);
	ibv_wr_set_sge(x, mr->lkey, base + SRC, 1000);
	x->wr_id = 81;
	ibv_wr_send_imm(x, htonl(0xabcdef01));
	ibv_wr_set_ud_addr(x, ah, r->qp_num, qkey);
	ibv_wr_set_inline_data(x, buf + SRC + 1000, 48);
	err = ibv_wr_complete(x);
	if (!err)
		doorbells++, wqes += 2;
	n = poll_n(cq, wc, 4);
	int sends = 0, recvs = 0, ok = 1;
	for (int i = 0; i < n; i++) {
		if (wc[i].status != IBV_WC_SUCCESS)
			ok = 0;
		else if (wc[i].opcode == IBV_WC_SEND)
			sends++;
		else if (wc[i].opcode == IBV_WC_RECV && wc[i].wr_id == 300)
			ok &= wc[i].byte_len == 40 + 1000 && !(wc[i].wc_flags & IBV_WC_WITH_IMM);
		else if (wc[i].opcode == IBV_WC_RECV && wc[i].wr_id == 301)
			ok &= wc[i].byte_len == 40 + 48 && (wc[i].wc_flags & IBV_WC_WITH_IMM) && wc[i].imm_data == htonl(0xabcdef01);
		else
			ok = 0;
		recvs += wc[i].opcode == IBV_WC_RECV;
	}
	check(!err && n == 4 && sends == 2 && recvs == 2 && ok && same(RECV + 40, SRC, 1000) && same(RECV + 2048 + 40, SRC + 1000, 48),
	      "UD: SEND (an SGE) and SEND_IMM (inline) addressed by wr_set_ud_addr arrive after the 40-byte GRH");
	ibv_wr_start(x);
	x->wr_id = 82;
	ibv_wr_send(x);
	ibv_wr_set_sge(x, mr->lkey, base + SRC, 100);
	err = ibv_wr_complete(x);
	check(err == EINVAL && quiet(cq), "UD: a WR without wr_set_ud_addr fails wr_complete with EINVAL, nothing posted");
	ibv_destroy_ah(ah);
	ibv_destroy_qp(s);
	ibv_destroy_qp(r);
	ibv_destroy_cq(cq);
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	int num;

	if (argc != 2 && !(argc == 3 && !strcmp(argv[2], "cq_ex")))
		DIE("usage: verbs_wr GID-INDEX [cq_ex]");
	sgid = atoi(argv[1]);
	list = ibv_get_device_list(&num);
	for (int i = 0; list && i < num && !ctx; i++)
		if (!strcmp(ibv_get_device_name(list[i]), "vrdma0"))
			ctx = ibv_open_device(list[i]);
	if (!ctx)
		DIE("cannot open vrdma0");
	if (ibv_query_gid(ctx, 1, sgid, &gid))
		DIE("no GID %d", sgid);
	pd = ibv_alloc_pd(ctx);
	buf = aligned_alloc(4096, BUF);
	if (!pd || !buf)
		DIE("alloc_pd failed");
	mr = ibv_reg_mr(pd, buf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
					      IBV_ACCESS_REMOTE_ATOMIC);
	if (!mr)
		DIE("reg_mr failed: %s", strerror(errno));
	if (argc == 3) {
		cq_ex_tests();
	} else {
		rc_tests();
		ud_tests();
	}
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	if (argc == 3) {
		printf("verbs_wr cq_ex: %d ok, %d failed\n", passed, failed);
	} else {
		printf("doorbells=%d send_wqes=%d\n", doorbells, wqes);
		printf("verbs_wr: %d failed\n", failed);
	}
	return failed ? 1 : 0;
}
