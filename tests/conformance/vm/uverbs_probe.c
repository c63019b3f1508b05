/*
 * uverbs_probe DEV NPDS HOLD: talks to an RDMA device's uverbs file (e.g.
 * /dev/infiniband/uverbs0) with the kernel's write() commands (<rdma/ib_user_verbs.h>), the way
 * libibverbs does below its provider, so that a driver with no rdma-core provider yet can be
 * checked from user space (kmod_test.sh): GET_CONTEXT, QUERY_DEVICE, QUERY_PORT 1 (and port 2,
 * which must fail), NPDS x ALLOC_PD, a pause with the PDs held, QUERY_PORT 1 again, DEALLOC_PD
 * each. HOLD is a
 * number of seconds, or a file: the PDs are held until it exists (at most 60 s).
 * Prints one "key=value ..." line per step; exits 1 on the first failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <rdma/ib_user_verbs.h>

#include "uverbs_cmd.h"

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: uverbs_probe DEV NPDS SECONDS|FILE\n");
		return 2;
	}
	int npds = atoi(argv[2]), err;
	const char *hold = argv[3];
	int fd = open(argv[1], O_RDWR | O_CLOEXEC);
	if (fd < 0 || npds < 0 || npds > 64) {
		printf("open %s: %s\n", argv[1], strerror(errno));
		return 1;
	}

	struct ib_uverbs_get_context_resp ctx;
	struct ib_uverbs_get_context gc = { .response = (uintptr_t)&ctx };
	if ((err = uverbs_command(fd, IB_USER_VERBS_CMD_GET_CONTEXT, &gc, sizeof(gc), sizeof(ctx)))) {
		printf("get_context failed: %s\n", strerror(err));
		return 1;
	}
	printf("context num_comp_vectors=%u\n", ctx.num_comp_vectors);

	struct ib_uverbs_query_device_resp d;
	struct ib_uverbs_query_device qd = { .response = (uintptr_t)&d };
	memset(&d, 0, sizeof(d));
	if ((err = uverbs_command(fd, IB_USER_VERBS_CMD_QUERY_DEVICE, &qd, sizeof(qd), sizeof(d)))) {
		printf("query_device failed: %s\n", strerror(err));
		return 1;
	}
	printf("device max_qp=%u max_qp_wr=%u max_sge=%u max_cq=%u max_cqe=%u max_mr=%u max_pd=%u max_ah=%u "
	       "max_srq=%u max_srq_wr=%u max_qp_rd_atom=%u atomic_cap=%u phys_port_cnt=%u max_mr_size=%" PRIu64
	       " page_size_cap=%#" PRIx64 "\n",
	       d.max_qp, d.max_qp_wr, d.max_sge, d.max_cq, d.max_cqe, d.max_mr, d.max_pd, d.max_ah, d.max_srq,
	       d.max_srq_wr, d.max_qp_rd_atom, d.atomic_cap, d.phys_port_cnt, (uint64_t)d.max_mr_size,
	       (uint64_t)d.page_size_cap);

	struct ib_uverbs_query_port_resp p;
	struct ib_uverbs_query_port qp = { .response = (uintptr_t)&p, .port_num = 1 };
	memset(&p, 0, sizeof(p));
	if ((err = uverbs_command(fd, IB_USER_VERBS_CMD_QUERY_PORT, &qp, sizeof(qp), sizeof(p)))) {
		printf("query_port failed: %s\n", strerror(err));
		return 1;
	}
	printf("port state=%u max_mtu=%u active_mtu=%u gid_tbl_len=%d pkey_tbl_len=%u max_msg_sz=%u link_layer=%u\n",
	       p.state, p.max_mtu, p.active_mtu, p.gid_tbl_len, p.pkey_tbl_len, p.max_msg_sz, p.link_layer);
	qp.port_num = 2;
	err = uverbs_command(fd, IB_USER_VERBS_CMD_QUERY_PORT, &qp, sizeof(qp), sizeof(p));
	printf("port2 %s\n", err ? strerror(err) : "answered");

	__u32 pds[64];
	for (int i = 0; i < npds; i++) {
		struct ib_uverbs_alloc_pd_resp r;
		struct ib_uverbs_alloc_pd a = { .response = (uintptr_t)&r };
		if ((err = uverbs_command(fd, IB_USER_VERBS_CMD_ALLOC_PD, &a, sizeof(a), sizeof(r)))) {
			printf("alloc_pd %d failed: %s\n", i, strerror(err));
			return 1;
		}
		pds[i] = r.pd_handle;
	}
	printf("pds allocated=%d\n", npds);
	fflush(stdout);
	if (hold[0] >= '0' && hold[0] <= '9') {
		sleep((unsigned)atoi(hold));
	} else {
		struct stat st;
		for (int i = 0; i < 600 && stat(hold, &st) != 0; i++)
			usleep(100000);
	}
	/* After a disassociation (the device unregistered under us) only destroy commands answer. */
	qp.port_num = 1;
	err = uverbs_command(fd, IB_USER_VERBS_CMD_QUERY_PORT, &qp, sizeof(qp), sizeof(p));
	printf("port1 after the hold: %s\n", err ? strerror(err) : "answered");
	for (int i = 0; i < npds; i++) {
		struct ib_uverbs_dealloc_pd dp = { .pd_handle = pds[i] };
		if ((err = uverbs_command(fd, IB_USER_VERBS_CMD_DEALLOC_PD, &dp, sizeof(dp), 0))) {
			printf("dealloc_pd %d failed: %s\n", i, strerror(err));
			return 1;
		}
	}
	printf("pds freed=%d\n", npds);
	close(fd);
	return 0;
}
