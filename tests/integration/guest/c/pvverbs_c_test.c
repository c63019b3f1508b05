/* A C application on libpvverbs (compiled as C: the header is a C API): two RC QPs on one
 * device connected to each other through vrdmad's engine, RDMA WRITE and SEND with data
 * checked, a CQ event through the event fd, and errors that say what went wrong.
 *   pvverbs_c_test <vrdmad socket>                           exit 0 on success */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vrdma/pvverbs.h"

#define CHECK(cond, what)                                                                      \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "FAIL %s:%d: %s (errno %d: %s)\n", __FILE__, __LINE__, what, errno,     \
              pv_last_error());                                                                \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

static int wait_one(struct pv_cq* cq, struct pv_wc* wc) {
  for (int i = 0; i < 2000000; ++i) {
    int n = pv_poll_cq(cq, 1, wc);
    if (n != 0) return n;
  }
  return 0;
}

static void bring_up(struct pv_qp* qp, uint32_t dest, const union pv_gid* gid) {
  struct pv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = PV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = PV_ACCESS_LOCAL_WRITE | PV_ACCESS_REMOTE_WRITE | PV_ACCESS_REMOTE_READ;
  CHECK(pv_modify_qp(qp, &a, PV_QP_STATE | PV_QP_PKEY_INDEX | PV_QP_PORT | PV_QP_ACCESS_FLAGS) == 0, "INIT");
  a.qp_state = PV_QPS_RTR;
  a.path_mtu = PV_MTU_1024;
  a.dest_qp_num = dest;
  a.rq_psn = 100;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 1;
  a.ah_attr.dgid = *gid;
  CHECK(pv_modify_qp(qp, &a, PV_QP_STATE | PV_QP_AV | PV_QP_PATH_MTU | PV_QP_DEST_QPN | PV_QP_RQ_PSN |
                                 PV_QP_MAX_DEST_RD_ATOMIC | PV_QP_MIN_RNR_TIMER) == 0, "RTR");
  a.qp_state = PV_QPS_RTS;
  a.sq_psn = 100;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  CHECK(pv_modify_qp(qp, &a, PV_QP_STATE | PV_QP_SQ_PSN | PV_QP_TIMEOUT | PV_QP_RETRY_CNT | PV_QP_RNR_RETRY |
                                 PV_QP_MAX_QP_RD_ATOMIC) == 0, "RTS");
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s <vrdmad socket>\n", argv[0]);
    return 2;
  }
  /* A wrong name is an error with a sentence. */
  CHECK(pv_open_device("/nonexistent/vrdmad.sock?ram_mib=16") == NULL && strlen(pv_last_error()) > 10,
        "opening a missing device fails with a sentence");
  struct pv_context* ctx = pv_open_device(argv[1]);
  CHECK(ctx != NULL, "pv_open_device");
  union pv_gid gid;
  CHECK(pv_query_gid(ctx, 0, &gid) == 0, "pv_query_gid");
  struct pv_pd* pd = pv_alloc_pd(ctx);
  CHECK(pd != NULL, "pv_alloc_pd");
  const size_t len = 1 << 20;
  unsigned char* buf = pv_alloc_buf(ctx, 2 * len);
  CHECK(buf != NULL, "pv_alloc_buf");
  unsigned char* plain = malloc(4096);
  CHECK(pv_reg_mr(pd, plain, 4096, PV_ACCESS_LOCAL_WRITE) == NULL && errno == EINVAL,
        "registering memory that is not the device's is refused");
  free(plain);
  struct pv_mr* mr = pv_reg_mr(pd, buf, 2 * len, PV_ACCESS_LOCAL_WRITE | PV_ACCESS_REMOTE_WRITE | PV_ACCESS_REMOTE_READ);
  CHECK(mr != NULL, "pv_reg_mr");
  struct pv_cq* cq_a = pv_create_cq(ctx, 64);
  struct pv_cq* cq_b = pv_create_cq(ctx, 64);
  CHECK(cq_a != NULL && cq_b != NULL, "pv_create_cq");
  struct pv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.qp_type = PV_QPT_RC;
  ia.cap.max_send_wr = 16;
  ia.cap.max_recv_wr = 16;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ia.send_cq = ia.recv_cq = cq_a;
  struct pv_qp* a = pv_create_qp(pd, &ia);
  ia.send_cq = ia.recv_cq = cq_b;
  struct pv_qp* b = pv_create_qp(pd, &ia);
  CHECK(a != NULL && b != NULL, "pv_create_qp");
  bring_up(a, pv_qp_num(b), &gid);
  bring_up(b, pv_qp_num(a), &gid);

  /* RDMA WRITE 1 MiB from a's half to b's half. */
  for (size_t i = 0; i < len; ++i) buf[i] = (unsigned char)(i * 7 + 3);
  struct pv_sge sge = {(uint64_t)(uintptr_t)buf, (uint32_t)len, mr->lkey};
  struct pv_send_wr wr;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 42;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = PV_WR_RDMA_WRITE;
  wr.send_flags = PV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = (uint64_t)(uintptr_t)(buf + len);
  wr.wr.rdma.rkey = mr->rkey;
  struct pv_send_wr* bad = NULL;
  CHECK(pv_post_send(a, &wr, &bad) == 0, "pv_post_send WRITE");
  struct pv_wc wc;
  CHECK(wait_one(cq_a, &wc) == 1 && wc.status == PV_WC_SUCCESS && wc.wr_id == 42 && wc.opcode == PV_WC_RDMA_WRITE,
        "WRITE completion");
  CHECK(memcmp(buf, buf + len, len) == 0, "WRITE data arrived intact");

  /* SEND with immediate, b waiting on its CQ's event fd. */
  struct pv_sge rsge = {(uint64_t)(uintptr_t)(buf + len), 4096, mr->lkey};
  struct pv_recv_wr rwr = {7, NULL, &rsge, 1};
  CHECK(pv_post_recv(b, &rwr, NULL) == 0, "pv_post_recv");
  CHECK(pv_req_notify_cq(cq_b, 0) == 0, "pv_req_notify_cq");
  memcpy(buf, "hello from a C application", 27);
  sge.length = 27;
  wr.opcode = PV_WR_SEND_WITH_IMM;
  wr.imm_data = 0x5eed;
  wr.wr_id = 43;
  CHECK(pv_post_send(a, &wr, &bad) == 0, "pv_post_send SEND");
  struct pollfd p = {pv_cq_event_fd(cq_b), POLLIN, 0};
  CHECK(poll(&p, 1, 10000) == 1, "the CQ event fd became readable");
  pv_ack_cq_events(cq_b);
  CHECK(wait_one(cq_b, &wc) == 1 && wc.status == PV_WC_SUCCESS && wc.wr_id == 7 && wc.byte_len == 27 &&
            (wc.wc_flags & PV_WC_WITH_IMM) && wc.imm_data == 0x5eed && wc.opcode == PV_WC_RECV,
        "receive completion");
  CHECK(memcmp(buf + len, "hello from a C application", 27) == 0, "SEND data arrived intact");
  CHECK(wait_one(cq_a, &wc) == 1 && wc.wr_id == 43 && wc.status == PV_WC_SUCCESS, "send completion");

  /* Errors: a WRITE to a bad rkey completes with a remote access error. */
  wr.opcode = PV_WR_RDMA_WRITE;
  wr.wr.rdma.rkey = mr->rkey ^ 0x5a5a00;
  wr.wr_id = 44;
  CHECK(pv_post_send(a, &wr, &bad) == 0, "pv_post_send bad rkey");
  CHECK(wait_one(cq_a, &wc) == 1 && wc.wr_id == 44 && wc.status == PV_WC_REM_ACCESS_ERR, "remote access error");

  CHECK(pv_destroy_qp(a) == 0 && pv_destroy_qp(b) == 0, "pv_destroy_qp");
  CHECK(pv_destroy_cq(cq_a) == 0 && pv_destroy_cq(cq_b) == 0, "pv_destroy_cq");
  CHECK(pv_dereg_mr(mr) == 0 && pv_free_buf(ctx, buf) == 0 && pv_dealloc_pd(pd) == 0, "teardown");
  CHECK(pv_close_device(ctx) == 0, "pv_close_device");
  printf("pvverbs C API: WRITE 1 MiB, SEND with immediate via CQ event, remote access error: OK\n");
  return 0;
}
