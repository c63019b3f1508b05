// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * What verbs_wr.c (the extended send API) and verbs_cqx.c (the extended CQ) share: the device,
 * its PD and one registered buffer opened by main(), the counted checks, and the helpers that make,
 * connect and drive RC QPs on vrdma0.
 */
#ifndef VERBS_WR_H
#define VERBS_WR_H
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <time.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

extern int passed, failed, doorbells, wqes;  /* doorbells rung, send WQEs posted */

#define DIE(...) do { fprintf(stderr, "verbs_wr: " __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)
void check(int ok, const char *what);  /* prints "ok  WHAT" or "FAIL WHAT", counts it */

enum { BUF = 65536, DEPTH = 16, MAX_SGE = 4, MAX_INLINE = 64 };
#define ALL_OPS                                                                                        \
	(IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |              \
	 IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | \
	 IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)

/* Buffer layout (one MR): A's sources at 0.., B's receive buffers at 16 KiB, B's RDMA target at 32 KiB,
 * A's READ destination at 40 KiB, atomics at 48 KiB (B's targets) and 48 KiB + 64 (A's results). */
enum { SRC = 0, RECV = 16384, TGT = 32768, RDST = 40960, ATOM = 49152, ARES = 49152 + 64 };

extern struct ibv_context *ctx;
extern struct ibv_pd *pd;
extern struct ibv_mr *mr;
extern unsigned char *buf;
extern union ibv_gid gid;
extern int sgid;

struct ibv_qp *make_qp(struct ibv_cq *cq, enum ibv_qp_type type, uint64_t ops, int ex);
void modify(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, const char *what);
void connect_rc(struct ibv_qp *qp, uint32_t peer);
int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n);
int quiet(struct ibv_cq *cq);
void post_recvs(struct ibv_qp *qp, uint64_t first_id, int n, size_t off, uint32_t len);
void fill(size_t off, size_t len, unsigned char seed);
int same(size_t a, size_t b, size_t len);

void cq_ex_tests(void);  /* verbs_cqx.c */

#endif
