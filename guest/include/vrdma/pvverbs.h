/* libpvverbs: paravirtual RDMA verbs for applications, shaped like libibverbs.
 *
 * A C API over the virtio RDMA device (docs/virtio-rdma.md): open the device, then use the
 * same objects and calls as libibverbs (PD, MR, CQ, QP, AH, SRQ; post_send, post_recv,
 * poll_cq). Numeric values (opcodes, statuses, access flags, QP states, attribute masks) are
 * those of libibverbs, so code ports by renaming ibv_ to pv_.
 *
 * Memory: the device reaches only its own DMA memory. Buffers to register must come from
 * pv_alloc_buf(); pv_reg_mr() of other memory fails with EINVAL.
 *
 * Errors: calls returning a pointer return NULL and set errno; calls returning int return 0
 * or an errno value (as ibv_post_send does). pv_last_error() gives this thread's last error
 * as a sentence. Every object may be used from any thread.
 *
 * Link with -lpvverbs (libpvverbs.so); include <vrdma/pvverbs.h>. */
#ifndef VRDMA_PVVERBS_H
#define VRDMA_PVVERBS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PV_API __attribute__((visibility("default")))

struct pv_context;
struct pv_pd;
struct pv_cq;
struct pv_qp;
struct pv_ah;
struct pv_srq;

struct pv_mr {
  void* addr;
  size_t length;
  uint32_t lkey;
  uint32_t rkey;
};

union pv_gid {
  uint8_t raw[16];
};

enum pv_access_flags {
  PV_ACCESS_LOCAL_WRITE = 1,
  PV_ACCESS_REMOTE_WRITE = 2,
  PV_ACCESS_REMOTE_READ = 4,
  PV_ACCESS_REMOTE_ATOMIC = 8,
};

enum pv_qp_type { PV_QPT_RC = 2, PV_QPT_UD = 4 };
enum pv_qp_state { PV_QPS_RESET, PV_QPS_INIT, PV_QPS_RTR, PV_QPS_RTS, PV_QPS_SQD, PV_QPS_SQE, PV_QPS_ERR };
enum pv_mtu { PV_MTU_256 = 1, PV_MTU_512, PV_MTU_1024, PV_MTU_2048, PV_MTU_4096 };

enum pv_qp_attr_mask {
  PV_QP_STATE = 1 << 0,
  PV_QP_ACCESS_FLAGS = 1 << 3,
  PV_QP_PKEY_INDEX = 1 << 4,
  PV_QP_PORT = 1 << 5,
  PV_QP_QKEY = 1 << 6,
  PV_QP_AV = 1 << 7,
  PV_QP_PATH_MTU = 1 << 8,
  PV_QP_TIMEOUT = 1 << 9,
  PV_QP_RETRY_CNT = 1 << 10,
  PV_QP_RNR_RETRY = 1 << 11,
  PV_QP_RQ_PSN = 1 << 12,
  PV_QP_MAX_QP_RD_ATOMIC = 1 << 13,
  PV_QP_MIN_RNR_TIMER = 1 << 15,
  PV_QP_SQ_PSN = 1 << 16,
  PV_QP_MAX_DEST_RD_ATOMIC = 1 << 17,
  PV_QP_DEST_QPN = 1 << 20,
};

struct pv_qp_cap {
  uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data;
};

struct pv_qp_init_attr {
  struct pv_cq* send_cq;
  struct pv_cq* recv_cq;
  struct pv_srq* srq; /* may be NULL */
  struct pv_qp_cap cap;
  int qp_type;        /* enum pv_qp_type */
  int sq_sig_all;
};

struct pv_ah_attr {
  union pv_gid dgid;
  uint32_t flow_label;
  uint8_t sgid_index, hop_limit, traffic_class, sl, port_num;
};

struct pv_qp_attr {
  int qp_state;       /* enum pv_qp_state */
  int path_mtu;       /* enum pv_mtu */
  uint32_t qkey, rq_psn, sq_psn, dest_qp_num;
  unsigned qp_access_flags;
  struct pv_ah_attr ah_attr;
  uint16_t pkey_index;
  uint8_t max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry;
};

enum pv_wr_opcode {
  PV_WR_RDMA_WRITE,
  PV_WR_RDMA_WRITE_WITH_IMM,
  PV_WR_SEND,
  PV_WR_SEND_WITH_IMM,
  PV_WR_RDMA_READ,
  PV_WR_ATOMIC_CMP_AND_SWP,
  PV_WR_ATOMIC_FETCH_AND_ADD,
};
enum pv_send_flags { PV_SEND_FENCE = 1, PV_SEND_SIGNALED = 2, PV_SEND_SOLICITED = 4, PV_SEND_INLINE = 8 };

struct pv_sge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

struct pv_send_wr {
  uint64_t wr_id;
  struct pv_send_wr* next;
  struct pv_sge* sg_list;
  int num_sge;
  int opcode;         /* enum pv_wr_opcode */
  unsigned send_flags;
  uint32_t imm_data;
  union {
    struct {
      uint64_t remote_addr;
      uint32_t rkey;
    } rdma;
    struct {
      uint64_t remote_addr;
      uint64_t compare_add;
      uint64_t swap;
      uint32_t rkey;
    } atomic;
  } wr;
  struct {
    struct pv_ah* ah;
    uint32_t remote_qpn;
    uint32_t remote_qkey;
  } ud;
};

struct pv_recv_wr {
  uint64_t wr_id;
  struct pv_recv_wr* next;
  struct pv_sge* sg_list;
  int num_sge;
};

enum pv_wc_status { PV_WC_SUCCESS = 0, PV_WC_LOC_LEN_ERR, PV_WC_LOC_QP_OP_ERR, PV_WC_LOC_PROT_ERR = 4, PV_WC_WR_FLUSH_ERR,
                    PV_WC_REM_ACCESS_ERR = 10, PV_WC_RETRY_EXC_ERR = 12, PV_WC_RNR_RETRY_EXC_ERR = 13 };
enum pv_wc_opcode { PV_WC_SEND, PV_WC_RDMA_WRITE, PV_WC_RDMA_READ, PV_WC_COMP_SWAP, PV_WC_FETCH_ADD,
                    PV_WC_RECV = 128, PV_WC_RECV_RDMA_WITH_IMM };
enum pv_wc_flags { PV_WC_GRH = 1, PV_WC_WITH_IMM = 2 };

struct pv_wc {
  uint64_t wr_id;
  int status;         /* enum pv_wc_status (all ibv_wc_status values) */
  int opcode;         /* enum pv_wc_opcode */
  uint32_t vendor_err, byte_len, imm_data, qp_num, src_qp;
  unsigned wc_flags;
};

/* Device: name is "pv:<vrdmad socket>[?ram_mib=N]" (or a bare socket path). */
PV_API struct pv_context* pv_open_device(const char* name);
PV_API int pv_close_device(struct pv_context* ctx);
PV_API const char* pv_last_error(void);
PV_API int pv_query_gid(struct pv_context* ctx, int index, union pv_gid* gid);
PV_API void* pv_alloc_buf(struct pv_context* ctx, size_t length);
PV_API int pv_free_buf(struct pv_context* ctx, void* buf);

PV_API struct pv_pd* pv_alloc_pd(struct pv_context* ctx);
PV_API int pv_dealloc_pd(struct pv_pd* pd);
PV_API struct pv_mr* pv_reg_mr(struct pv_pd* pd, void* addr, size_t length, int access);
PV_API int pv_dereg_mr(struct pv_mr* mr);

PV_API struct pv_cq* pv_create_cq(struct pv_context* ctx, int cqe);
PV_API int pv_destroy_cq(struct pv_cq* cq);
PV_API int pv_poll_cq(struct pv_cq* cq, int num_entries, struct pv_wc* wc); /* entries, or -errno */
PV_API int pv_req_notify_cq(struct pv_cq* cq, int solicited_only);
PV_API int pv_cq_event_fd(struct pv_cq* cq); /* poll() it after pv_req_notify_cq; then pv_ack_cq_events */
PV_API void pv_ack_cq_events(struct pv_cq* cq);

PV_API struct pv_qp* pv_create_qp(struct pv_pd* pd, const struct pv_qp_init_attr* attr);
PV_API int pv_modify_qp(struct pv_qp* qp, const struct pv_qp_attr* attr, int attr_mask);
PV_API int pv_destroy_qp(struct pv_qp* qp);
PV_API uint32_t pv_qp_num(const struct pv_qp* qp);
PV_API int pv_post_send(struct pv_qp* qp, struct pv_send_wr* wr, struct pv_send_wr** bad_wr);
PV_API int pv_post_recv(struct pv_qp* qp, struct pv_recv_wr* wr, struct pv_recv_wr** bad_wr);

PV_API struct pv_ah* pv_create_ah(struct pv_pd* pd, const struct pv_ah_attr* attr);
PV_API int pv_destroy_ah(struct pv_ah* ah);

#ifdef __cplusplus
}
#endif

#endif /* VRDMA_PVVERBS_H */
