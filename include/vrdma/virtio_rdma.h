/*
 * The virtio RDMA device's contract (docs/virtio-rdma.md): config space, control commands and
 * their payloads, statuses, doorbells, events, the layouts of the work-request and completion
 * rings in guest memory, and the state area. This header IS the contract: the device (vrdmad,
 * device/src/), libpvverbs (guest/src/pv/, through the C++ view
 * include/vrdma/virtio_rdma.hpp), the guest kernel module and the rdma-core provider
 * all compile against it.
 *
 * Plain C11, the style of Linux's include/uapi/linux/virtio_*.h: it builds in userspace (C11 and
 * C++20; the types come from linux-libc-dev's <linux/types.h>) and in a kernel module (no libc
 * headers). Every field is little-endian (__le*, convert with le32_to_cpu() and friends in the
 * kernel); every struct is packed by construction (natural alignment, explicit reserved fields,
 * sizes checked below), so the layout is the same for every compiler and ABI. No bitfields.
 * Numeric values that come from libibverbs (opcodes, statuses, access flags, QP states, attribute
 * masks, MTU codes) are the ibv values.
 */
#ifndef VRDMA_VIRTIO_RDMA_H
#define VRDMA_VIRTIO_RDMA_H

#include <linux/types.h>

/* C11's _Static_assert is C++'s static_assert; both take a message. */
#ifdef __cplusplus
#define VIRTIO_RDMA_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define VIRTIO_RDMA_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

/* The helpers below are static inline in C, constexpr in C++ (same body, no casts). */
#ifdef __cplusplus
#define VIRTIO_RDMA_INLINE constexpr
#else
#define VIRTIO_RDMA_INLINE static inline
#endif

/* ---- Identity and queues (docs/virtio-rdma.md "Identity and queues") ----------------------- */
#define VIRTIO_RDMA_DEVICE_ID 42u          /* virtio device ID of the native device */
#define VIRTIO_RDMA_SIGNATURE 0x4d445256u  /* "VRDM" at config offset 0 */
#define VIRTIO_RDMA_VERSION 1u

#define VIRTIO_RDMA_CONTROL_QUEUE 0u
#define VIRTIO_RDMA_EVENT_QUEUE 1u
#define VIRTIO_RDMA_DOORBELL_QUEUE 2u
/*
 * Optional: the driver keeps one writable buffer posted here, the state area, into which the
 * device writes its state when the frontend stops it during a migration ("State in guest
 * memory"). A driver (or a frontend with num-queues=3) may leave it out.
 */
#define VIRTIO_RDMA_STATE_QUEUE 3u
#define VIRTIO_RDMA_NUM_QUEUES 4u
#define VIRTIO_RDMA_REQUIRED_QUEUES 3u  /* queues 0..2 must run; the state queue may not */

/* ---- Config space (256 bytes at most; read with GET_CONFIG) --------------------------------- */
struct virtio_rdma_config {
	__le32 signature;   /* VIRTIO_RDMA_SIGNATURE */
	__le16 version;     /* VIRTIO_RDMA_VERSION */
	__le16 num_queues;  /* VIRTIO_RDMA_NUM_QUEUES */
	__le64 features;    /* VIRTIO_RDMA_FEATURE_* (device features a carrier may mask travel here) */
	__le32 max_qp, max_cq, max_mr, max_pd;
	__le32 max_ah, max_srq, max_qp_wr, max_cqe;
	__le32 max_sge, max_inline, max_mr_pages, max_qp_rd_atom;
	__le64 max_registered_bytes;  /* per guest */
	__u8 mac[6];
	__u8 port_state;  /* ibv_port_state */
	__u8 active_mtu;  /* ibv_mtu */
	__u8 gid[16];     /* GID index 0 (RoCEv2 IPv4-mapped: the guest's own address) */
	__le32 transport; /* 0 IB, 1 RoCE, 2 iWARP, 3 software RoCEv2 */
	__le32 max_fast_reg_pages; /* FEATURE_FAST_REG: pages ALLOC_MR may ask for (else 0) */
	__le32 reserved[2];
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_config) == 112, "virtio_rdma_config is 112 bytes");

/* virtio_rdma_config.features: masks (not bit numbers), in the config, not the virtio word. */
#define VIRTIO_RDMA_FEATURE_UD (1ull << 0)
#define VIRTIO_RDMA_FEATURE_SRQ (1ull << 1)
#define VIRTIO_RDMA_FEATURE_ATOMIC (1ull << 2)
#define VIRTIO_RDMA_FEATURE_MIGRATION (1ull << 3)
#define VIRTIO_RDMA_FEATURE_DMA_MR (1ull << 4)  /* REG_DMA_MR: a PD's local DMA key (kernel verbs) */
#define VIRTIO_RDMA_FEATURE_GSI (1ull << 5)     /* CREATE_QP of VIRTIO_RDMA_QPT_GSI: QP1, the CM's MADs */
/* ALLOC_MR, the send WQEs LOCAL_INV, REG_MR and SEND_WITH_INV, and CQEs WITH_INV ("Fast registration") */
#define VIRTIO_RDMA_FEATURE_FAST_REG (1ull << 6)
/* CREATE_DB_RING / DESTROY_DB_RING: doorbells a process writes without a system call ("Doorbell rings") */
#define VIRTIO_RDMA_FEATURE_DB_RING (1ull << 7)

/* ---- Carrier window ("Inside a VM: riding vhost-user-blk") ---------------------------------- */
/*
 * Stock QEMU has no vhost-user RDMA device, so the device rides vhost-user-blk-pci. That
 * frontend reads only a blk-sized config (GET_CONFIG of 36..60 bytes at offset 0 in QEMU 7.2),
 * shows it to the guest as a virtio_blk_config, overwrites bytes 34..35 (blk num_queues) with its
 * own queue count, and masks the virtio feature word to the blk feature list. A GET_CONFIG at
 * offset 0 shorter than virtio_rdma_config therefore gets this layout instead: blk capacity 0
 * (virtio_blk sees an empty disk and does no I/O), our signature at offset 8, and the device
 * features the carrier masks. The driver reads the whole config with QUERY_CONFIG.
 */
struct virtio_rdma_carrier_config {
	__le64 blk_capacity;  /* 0 */
	__le32 signature;     /* VIRTIO_RDMA_SIGNATURE */
	__le16 version;       /* VIRTIO_RDMA_VERSION */
	__le16 num_queues;    /* VIRTIO_RDMA_NUM_QUEUES */
	__le64 features;      /* virtio_rdma_config.features */
	__le32 config_size;   /* sizeof(struct virtio_rdma_config): what QUERY_CONFIG returns */
	__le32 reserved;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_carrier_config) == 32, "virtio_rdma_carrier_config is 32 bytes");
#define VIRTIO_RDMA_CARRIER_SIGNATURE_OFFSET 8u
/* Bytes the carrier owns in its window (virtio_blk_config.num_queues): never ours. */
#define VIRTIO_RDMA_CARRIER_BLK_NUM_QUEUES_OFFSET 34u
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_carrier_config) <= VIRTIO_RDMA_CARRIER_BLK_NUM_QUEUES_OFFSET,
			  "the carrier window stays clear of virtio_blk_config.num_queues");
/* virtio_blk_config's size up to num_queues: the smallest window QEMU's vhost-user-blk reads. */
#define VIRTIO_RDMA_CARRIER_MIN_WINDOW 36u

/* ---- Control queue: one chain = readable request, writable response ("Control queue (0)") -- */
#define VIRTIO_RDMA_CMD_QUERY_DEVICE 1u
#define VIRTIO_RDMA_CMD_QUERY_PORT 2u
#define VIRTIO_RDMA_CMD_QUERY_GID 3u
#define VIRTIO_RDMA_CMD_CREATE_PD 4u
#define VIRTIO_RDMA_CMD_DESTROY_PD 5u
#define VIRTIO_RDMA_CMD_REG_MR 6u
#define VIRTIO_RDMA_CMD_DEREG_MR 7u
#define VIRTIO_RDMA_CMD_CREATE_CQ 8u
#define VIRTIO_RDMA_CMD_DESTROY_CQ 9u
#define VIRTIO_RDMA_CMD_CREATE_QP 10u
#define VIRTIO_RDMA_CMD_MODIFY_QP 11u
#define VIRTIO_RDMA_CMD_QUERY_QP 12u
#define VIRTIO_RDMA_CMD_DESTROY_QP 13u
#define VIRTIO_RDMA_CMD_CREATE_AH 14u
#define VIRTIO_RDMA_CMD_DESTROY_AH 15u
#define VIRTIO_RDMA_CMD_CREATE_SRQ 16u
#define VIRTIO_RDMA_CMD_DESTROY_SRQ 17u
#define VIRTIO_RDMA_CMD_QUERY_CONFIG 18u  /* response: virtio_rdma_config (for drivers behind a carrier) */
#define VIRTIO_RDMA_CMD_REG_DMA_MR 19u    /* a PD's local DMA key over all guest memory */
#define VIRTIO_RDMA_CMD_ALLOC_MR 20u      /* a region for fast registration (FEATURE_FAST_REG) */
#define VIRTIO_RDMA_CMD_CREATE_DB_RING 21u /* a doorbell ring in guest memory (FEATURE_DB_RING) */
#define VIRTIO_RDMA_CMD_DESTROY_DB_RING 22u
#define VIRTIO_RDMA_CMD_COUNT 23u         /* one past the highest command */

struct virtio_rdma_cmd_hdr {
	__le32 cmd;  /* VIRTIO_RDMA_CMD_* */
	__le32 reserved;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_cmd_hdr) == 8, "virtio_rdma_cmd_hdr is 8 bytes");

/* Status values are Linux errno numbers (0 = success), so a guest can hand them to its callers. */
#define VIRTIO_RDMA_S_OK 0u
#define VIRTIO_RDMA_S_PERM 1u            /* EPERM: the object belongs to another PD / rights missing */
#define VIRTIO_RDMA_S_NOT_FOUND 2u       /* ENOENT: no object with that handle */
#define VIRTIO_RDMA_S_IO 5u              /* EIO: the engine failed */
#define VIRTIO_RDMA_S_NO_MEMORY 12u      /* ENOMEM */
#define VIRTIO_RDMA_S_FAULT 14u          /* EFAULT: a guest address is outside guest memory */
#define VIRTIO_RDMA_S_BUSY 16u           /* EBUSY: still in use */
#define VIRTIO_RDMA_S_INVALID 22u        /* EINVAL: a malformed field */
#define VIRTIO_RDMA_S_NO_SPACE 28u       /* ENOSPC: a per-guest limit is reached */
#define VIRTIO_RDMA_S_NOT_SUPPORTED 95u  /* EOPNOTSUPP */

/*
 * On success the response body follows; on an error the body is the device's sentence saying
 * why (msg_len bytes of UTF-8, no terminator, as much as fits the writable buffer).
 */
struct virtio_rdma_resp_hdr {
	__le32 status;  /* VIRTIO_RDMA_S_* */
	__le32 msg_len;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_resp_hdr) == 8, "virtio_rdma_resp_hdr is 8 bytes");
#define VIRTIO_RDMA_MAX_ERROR_MESSAGE 480u

/* Handles are non-zero; 0 means "none" where a handle is optional. */
#define VIRTIO_RDMA_NO_HANDLE 0u

/* QUERY_DEVICE response. */
struct virtio_rdma_device_attr_resp {
	__le64 node_guid, max_mr_size;
	__le32 vendor_id, vendor_part_id;
	__le32 max_qp, max_qp_wr, max_sge, max_cq, max_cqe, max_mr, max_pd, max_ah, max_srq, max_srq_wr;
	__le32 max_qp_rd_atom, max_qp_init_rd_atom, max_inline_data;
	__u8 atomic_cap, phys_port_cnt, transport, reserved;
	char fw_ver[32];
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_device_attr_resp) == 112, "virtio_rdma_device_attr_resp is 112 bytes");

/* QUERY_PORT response. */
struct virtio_rdma_port_attr_resp {
	__u8 state, max_mtu, active_mtu, link_layer;
	__le32 gid_tbl_len, max_msg_sz, active_speed_mbps;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_port_attr_resp) == 16, "virtio_rdma_port_attr_resp is 16 bytes");

struct virtio_rdma_query_gid_req {
	__le32 index;
	__le32 reserved;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_query_gid_req) == 8, "virtio_rdma_query_gid_req is 8 bytes");
struct virtio_rdma_gid_resp {
	__u8 gid[16];
	__le32 type;  /* 0 IB, 1 RoCEv1, 2 RoCEv2, 3 iWARP */
	__le32 reserved;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_gid_resp) == 24, "virtio_rdma_gid_resp is 24 bytes");

struct virtio_rdma_handle_req {  /* DESTROY_*, QUERY_QP */
	__le32 handle;
	__le32 reserved;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_handle_req) == 8, "virtio_rdma_handle_req is 8 bytes");
struct virtio_rdma_handle_resp {  /* CREATE_PD, CREATE_CQ, CREATE_AH */
	__le32 handle;
	__le32 reserved;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_handle_resp) == 8, "virtio_rdma_handle_resp is 8 bytes");

/*
 * Memory registration ("Memory registration"): the region's bytes are `length` bytes starting
 * `iova % page_size` into pages[0] and running through the following pages. pages_gpa points to
 * npages little-endian u64 guest-physical page addresses, each aligned to 1 << page_shift.
 */
struct virtio_rdma_reg_mr_req {
	__le32 pd;
	__le32 access;      /* ibv_access_flags */
	__le64 iova;        /* the address work requests and peers use for the first byte */
	__le64 length;
	__le64 pages_gpa;
	__le32 npages;
	__le32 page_shift;  /* 12 (4 KiB) .. 30 (1 GiB) */
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_reg_mr_req) == 40, "virtio_rdma_reg_mr_req is 40 bytes");
struct virtio_rdma_reg_mr_resp {
	__le32 mr, lkey, rkey, reserved;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_reg_mr_resp) == 16, "virtio_rdma_reg_mr_resp is 16 bytes");

/*
 * The DMA memory region ("The DMA memory region", VIRTIO_RDMA_FEATURE_DMA_MR): one per PD, the
 * key a kernel driver gives as its PD's local_dma_lkey. Its addresses are guest-physical
 * addresses (a virtio device's DMA addresses without an IOMMU); it covers all guest memory and
 * nothing else. Local access only: access is 0 or VIRTIO_RDMA_ACCESS_LOCAL_WRITE, and the
 * response's rkey is 0. DEREG_MR with the response's handle removes it.
 */
#define VIRTIO_RDMA_ACCESS_LOCAL_WRITE 1u  /* IBV_ACCESS_LOCAL_WRITE */
struct virtio_rdma_reg_dma_mr_req {
	__le32 pd;
	__le32 access;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_reg_dma_mr_req) == 8, "virtio_rdma_reg_dma_mr_req is 8 bytes");

/*
 * Fast registration ("Fast registration", VIRTIO_RDMA_FEATURE_FAST_REG; IBA 10.6.3.4, Linux
 * ib_alloc_mr(IB_MR_TYPE_MEM_REG)): ALLOC_MR makes a region that holds no memory yet, for up to
 * max_pages pages (1..config max_fast_reg_pages); the response is a virtio_rdma_reg_mr_resp
 * whose lkey and rkey are one key. A REG_MR send WQE gives it pages, rights and a key that
 * differs from the allocated one only in its low 8 bits; LOCAL_INV or a peer's SEND with
 * Invalidate makes it invalid again. DEREG_MR removes it.
 */
struct virtio_rdma_alloc_mr_req {
	__le32 pd;
	__le32 max_pages;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_alloc_mr_req) == 8, "virtio_rdma_alloc_mr_req is 8 bytes");

/*
 * Completion ring ("Rings in guest memory"): a 64-byte control block, then `depth` 32-byte
 * CQEs, contiguous in guest-physical memory at ring_gpa (4 KiB-aligned). depth is a power of two.
 */
struct virtio_rdma_create_cq_req {
	__le32 depth;
	__le32 db_ring;  /* 0, or the doorbell ring whose CQ_ARM records may name this CQ */
	__le64 ring_gpa;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_create_cq_req) == 16, "virtio_rdma_create_cq_req is 16 bytes");
struct virtio_rdma_cq_control {
	__le32 consumer;  /* driver writes: CQEs it has consumed (free-running) */
	__le32 producer;  /* device writes: CQEs it has produced (free-running; informative) */
	__le32 overruns;  /* device writes: times it found the ring full and waited */
	__le32 reserved[13];
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_cq_control) == 64, "virtio_rdma_cq_control is 64 bytes");
/*
 * The device writes a CQE's body first and its owner byte last (release); the driver reads the
 * owner byte (acquire), then the body (IBA 11.4.2.2 for what a completion holds).
 */
struct virtio_rdma_cqe {
	__le64 wr_id;
	__le32 qp_num;
	__le32 byte_len;
	__le32 imm_data;  /* host order of the value the peer sent */
	__le32 src_qp;
	__u8 status;      /* ibv_wc_status */
	__u8 opcode;      /* ibv_wc_opcode */
	__u8 wc_flags;    /* VIRTIO_RDMA_WC_* */
	__u8 owner;       /* phase: virtio_rdma_cqe_phase(index, depth) when valid */
	__le32 vendor_err;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_cqe) == 32, "virtio_rdma_cqe is 32 bytes");
#define VIRTIO_RDMA_WC_WITH_IMM (1u << 0)
#define VIRTIO_RDMA_WC_GRH (1u << 1)
#define VIRTIO_RDMA_WC_SOLICITED (1u << 2)  /* the message asked for a solicited event */
#define VIRTIO_RDMA_WC_WITH_INV (1u << 3)   /* a SEND with Invalidate ended the region imm_data names */
/*
 * CQE opcodes are ibv_wc_opcode's, and for fast registration's own work requests: LOCAL_INV 6
 * (IBV_WC_LOCAL_INV) and REG_MR 10 (the value Linux gives IB_WC_REG_MR since IB_WC_ATOMIC_WRITE
 * came; a kernel driver maps it onto its own kernel's IB_WC_REG_MR).
 */
#define VIRTIO_RDMA_WC_LOCAL_INV 6u
#define VIRTIO_RDMA_WC_REG_MR 10u
/* The first CQE follows the control block. */
#define VIRTIO_RDMA_CQE_OFFSET 64u
#define VIRTIO_RDMA_CQE_SIZE 32u
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_cq_control) == VIRTIO_RDMA_CQE_OFFSET, "CQEs follow the control block");
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_cqe) == VIRTIO_RDMA_CQE_SIZE, "VIRTIO_RDMA_CQE_SIZE");

/* The phase (owner byte) a valid CQE at free-running index `index` carries: 1, 0, 1, ... per pass. */
VIRTIO_RDMA_INLINE __u32 virtio_rdma_cqe_phase(__u32 index, __u32 depth)
{
	return ((index / depth) & 1u) ^ 1u;
}

/*
 * Queue pair. The send ring holds sq_depth WQEs of sq_stride bytes, the receive ring rq_depth
 * WQEs of rq_stride bytes (strides from the response); both contiguous in guest-physical memory.
 * status_gpa: a virtio_rdma_qp_status block the device keeps up to date. No RQ with an SRQ.
 */
#define VIRTIO_RDMA_QPT_GSI 1u  /* QP1 (IB_QPT_GSI): a datagram QP, QPN 1, one per device (FEATURE_GSI) */
#define VIRTIO_RDMA_QPT_RC 2u
#define VIRTIO_RDMA_QPT_UD 4u
struct virtio_rdma_create_qp_req {
	__le32 pd, send_cq, recv_cq, srq;  /* srq may be VIRTIO_RDMA_NO_HANDLE */
	__u8 qp_type;                      /* VIRTIO_RDMA_QPT_*: 2 RC, 4 UD (ibv_qp_type), 1 GSI */
	__u8 sq_sig_all;
	__le16 db_ring;                    /* 0, or the doorbell ring whose SQ / RQ records may name this QP */
	__le32 sq_depth, rq_depth;         /* powers of two */
	__le32 max_send_sge, max_recv_sge, max_inline;
	__le64 sq_gpa, rq_gpa, status_gpa;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_create_qp_req) == 64, "virtio_rdma_create_qp_req is 64 bytes");
struct virtio_rdma_create_qp_resp {
	__le32 qp, qp_num, sq_stride, rq_stride;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_create_qp_resp) == 16, "virtio_rdma_create_qp_resp is 16 bytes");
struct virtio_rdma_qp_status {
	__le32 sq_consumed;  /* device writes: send WQEs taken from the ring (free-running) */
	__le32 rq_consumed;  /* device writes: receive WQEs taken from the ring */
	__le32 state;        /* device writes: ibv_qp_state as the device last saw it */
	__le32 reserved[13];
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_qp_status) == 64, "virtio_rdma_qp_status is 64 bytes");

/* The AH attributes (ibv_ah_attr's RoCE subset). */
struct virtio_rdma_ah {
	__u8 dgid[16];
	__le32 flow_label;
	__u8 sgid_index, hop_limit, traffic_class, sl;
	__u8 port_num, reserved[3];
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_ah) == 28, "virtio_rdma_ah is 28 bytes");
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_ah) <= 32, "an inline address vector fits its 32 bytes");

/* ibv_qp_attr on the wire: MODIFY_QP's body, QUERY_QP's response. */
struct virtio_rdma_qp_attr {
	__u8 qp_state, cur_qp_state, path_mtu, qp_access_flags_pad;
	__le32 qp_access_flags;
	__le32 qkey, rq_psn, sq_psn, dest_qp_num;
	__le32 max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data;
	__le16 pkey_index;
	__u8 sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout;
	__u8 retry_cnt, rnr_retry, reserved[2];
	struct virtio_rdma_ah ah;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_qp_attr) == 84, "virtio_rdma_qp_attr is 84 bytes");

struct virtio_rdma_modify_qp_req {
	__le32 qp;
	__le32 mask;  /* ibv_qp_attr_mask */
	struct virtio_rdma_qp_attr attr;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_modify_qp_req) == 92, "virtio_rdma_modify_qp_req is 92 bytes");

struct virtio_rdma_create_ah_req {
	__le32 pd;
	__le32 reserved;
	struct virtio_rdma_ah ah;
	__le32 reserved2;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_create_ah_req) == 40, "virtio_rdma_create_ah_req is 40 bytes");

struct virtio_rdma_create_srq_req {
	__le32 pd, depth, max_sge;
	__le32 db_ring;     /* 0, or the doorbell ring whose SRQ records may name this SRQ */
	__le64 ring_gpa;    /* ring of depth WQEs (stride from the response) */
	__le64 status_gpa;  /* virtio_rdma_qp_status */
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_create_srq_req) == 32, "virtio_rdma_create_srq_req is 32 bytes");
struct virtio_rdma_create_srq_resp {
	__le32 srq, stride;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_create_srq_resp) == 8, "virtio_rdma_create_srq_resp is 8 bytes");

/* CREATE_DB_RING's body ("Doorbell rings" below); the response is virtio_rdma_handle_resp. */
struct virtio_rdma_create_db_ring_req {
	__le64 gpa;    /* the header, then depth records; 64-byte aligned */
	__le32 depth;  /* records: a power of two, VIRTIO_RDMA_DB_RING_MIN_DEPTH..MAX_DEPTH */
	__le32 reserved;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_create_db_ring_req) == 16, "virtio_rdma_create_db_ring_req is 16 bytes");

/*
 * The request body of each command: its bytes after virtio_rdma_cmd_hdr (0: none). A device
 * refuses a shorter body (VIRTIO_RDMA_S_INVALID) and reads no byte past this length;
 * VIRTIO_RDMA_CMD_NONE for a number that names no command.
 */
#define VIRTIO_RDMA_CMD_NONE 0xffffffffu
VIRTIO_RDMA_INLINE __u32 virtio_rdma_cmd_req_len(__u32 cmd)
{
	switch (cmd) {
	case VIRTIO_RDMA_CMD_QUERY_DEVICE: case VIRTIO_RDMA_CMD_QUERY_PORT: case VIRTIO_RDMA_CMD_CREATE_PD:
	case VIRTIO_RDMA_CMD_QUERY_CONFIG:
		return 0;
	case VIRTIO_RDMA_CMD_QUERY_GID: return sizeof(struct virtio_rdma_query_gid_req);
	case VIRTIO_RDMA_CMD_DESTROY_PD: case VIRTIO_RDMA_CMD_DEREG_MR: case VIRTIO_RDMA_CMD_DESTROY_CQ:
	case VIRTIO_RDMA_CMD_QUERY_QP: case VIRTIO_RDMA_CMD_DESTROY_QP: case VIRTIO_RDMA_CMD_DESTROY_AH:
	case VIRTIO_RDMA_CMD_DESTROY_SRQ: case VIRTIO_RDMA_CMD_DESTROY_DB_RING:
		return sizeof(struct virtio_rdma_handle_req);
	case VIRTIO_RDMA_CMD_REG_MR: return sizeof(struct virtio_rdma_reg_mr_req);
	case VIRTIO_RDMA_CMD_REG_DMA_MR: return sizeof(struct virtio_rdma_reg_dma_mr_req);
	case VIRTIO_RDMA_CMD_ALLOC_MR: return sizeof(struct virtio_rdma_alloc_mr_req);
	case VIRTIO_RDMA_CMD_CREATE_CQ: return sizeof(struct virtio_rdma_create_cq_req);
	case VIRTIO_RDMA_CMD_CREATE_QP: return sizeof(struct virtio_rdma_create_qp_req);
	case VIRTIO_RDMA_CMD_MODIFY_QP: return sizeof(struct virtio_rdma_modify_qp_req);
	case VIRTIO_RDMA_CMD_CREATE_AH: return sizeof(struct virtio_rdma_create_ah_req);
	case VIRTIO_RDMA_CMD_CREATE_SRQ: return sizeof(struct virtio_rdma_create_srq_req);
	case VIRTIO_RDMA_CMD_CREATE_DB_RING: return sizeof(struct virtio_rdma_create_db_ring_req);
	default: return VIRTIO_RDMA_CMD_NONE;
	}
}

/* ---- Work-request rings ("Rings in guest memory") ------------------------------------------ */
/* A send WQE: this header, then num_sge SGEs, or (VIRTIO_RDMA_SEND_INLINE) inline_len bytes. */
struct virtio_rdma_send_wqe {
	__le64 wr_id;
	__u8 opcode;   /* ibv_wr_opcode: 0 WRITE, 1 WRITE_IMM, 2 SEND, 3 SEND_IMM, 4 READ, 5 CAS, 6 FAA;
			  with FEATURE_FAST_REG also VIRTIO_RDMA_WR_LOCAL_INV, _SEND_WITH_INV, _REG_MR */
	__u8 flags;    /* VIRTIO_RDMA_SEND_* */
	__u8 num_sge;
	__u8 reserved;
	__le32 imm_data;
	__le64 remote_addr;
	__le32 rkey;
	__le32 inline_len;
	__le64 compare_add;
	__le64 swap;
	__le32 ah;           /* UD: AH handle */
	__le32 remote_qpn;   /* UD */
	__le32 remote_qkey;  /* UD */
	__le32 reserved2;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_send_wqe) == 64, "virtio_rdma_send_wqe is 64 bytes");
#define VIRTIO_RDMA_SEND_FENCE (1u << 0)
#define VIRTIO_RDMA_SEND_SIGNALED (1u << 1)
#define VIRTIO_RDMA_SEND_SOLICITED (1u << 2)
#define VIRTIO_RDMA_SEND_INLINE (1u << 3)
/*
 * UD and GSI sends: the address vector is in the WQE (a virtio_rdma_ah in the 32 bytes after the
 * header; the SGEs or inline bytes follow it) instead of an AH handle, as a kernel driver needs
 * for AHs made where it cannot wait for a command. The ring's stride must hold the 32 bytes too.
 */
#define VIRTIO_RDMA_SEND_INLINE_AV (1u << 4)
#define VIRTIO_RDMA_INLINE_AV_SIZE 32u

/*
 * Fast registration's send WQEs (VIRTIO_RDMA_FEATURE_FAST_REG; RC QPs). LOCAL_INV: imm_data is
 * the key of a region of the QP's PD to make invalid (the WQE completes with IBV_WC_LOCAL_INV).
 * SEND_WITH_INV: a SEND whose imm_data is the peer's rkey to invalidate (the receiver's CQE has
 * VIRTIO_RDMA_WC_WITH_INV and the key in imm_data). REG_MR: the 64 bytes are a
 * virtio_rdma_reg_mr_wqe, no SGEs; it completes with IB_WC_REG_MR (10). The device reads the
 * page list when the driver rings the doorbell: the driver keeps it until then.
 */
#define VIRTIO_RDMA_WR_LOCAL_INV 7u      /* IBV_WR_LOCAL_INV */
#define VIRTIO_RDMA_WR_SEND_WITH_INV 9u  /* IBV_WR_SEND_WITH_INV */
#define VIRTIO_RDMA_WR_REG_MR 0x20u      /* Linux IB_WR_REG_MR */
/*
 * The region `mr` (an ALLOC_MR handle) gets `length` bytes that start `iova % page size` into
 * pages[0] (as virtio_rdma_reg_mr_req): npages (1..the region's max_pages) little-endian u64
 * guest-physical page addresses at pages_gpa, each aligned to 1 << page_shift (12..21); the
 * rights `access` (ibv_access_flags) and the key `key`.
 */
struct virtio_rdma_reg_mr_wqe {
	__le64 wr_id;
	__u8 opcode;  /* VIRTIO_RDMA_WR_REG_MR */
	__u8 flags;   /* VIRTIO_RDMA_SEND_FENCE, _SIGNALED */
	__u8 num_sge; /* 0 */
	__u8 reserved;
	__le32 key;
	__le64 iova;
	__le32 mr;
	__le32 access;
	__le64 length;
	__le64 pages_gpa;
	__le32 npages;
	__le32 page_shift;
	__le64 reserved2;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_reg_mr_wqe) == 64, "virtio_rdma_reg_mr_wqe is 64 bytes");
#define VIRTIO_RDMA_FAST_REG_MAX_PAGE_SHIFT 21u

struct virtio_rdma_sge {
	__le64 addr;
	__le32 length;
	__le32 lkey;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_sge) == 16, "virtio_rdma_sge is 16 bytes");

struct virtio_rdma_recv_wqe {
	__le64 wr_id;
	__le32 num_sge;
	__le32 reserved;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_recv_wqe) == 16, "virtio_rdma_recv_wqe is 16 bytes");

#define VIRTIO_RDMA_SEND_WQE_SIZE 64u
#define VIRTIO_RDMA_RECV_WQE_SIZE 16u
#define VIRTIO_RDMA_SGE_SIZE 16u
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_send_wqe) == VIRTIO_RDMA_SEND_WQE_SIZE, "VIRTIO_RDMA_SEND_WQE_SIZE");
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_recv_wqe) == VIRTIO_RDMA_RECV_WQE_SIZE, "VIRTIO_RDMA_RECV_WQE_SIZE");
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_sge) == VIRTIO_RDMA_SGE_SIZE, "VIRTIO_RDMA_SGE_SIZE");

/* The smallest power of two >= v (1 for 0 and 1); 0 when that does not fit in 32 bits. */
VIRTIO_RDMA_INLINE __u32 virtio_rdma_pow2_at_least(__u32 v)
{
	if (v <= 1u)
		return 1u;
	v -= 1u;
	v |= v >> 1;
	v |= v >> 2;
	v |= v >> 4;
	v |= v >> 8;
	v |= v >> 16;
	return v + 1u;
}

/*
 * Strides both sides compute the same way: header + SGEs (or inline bytes), rounded up to a
 * power of two. The device returns them in CREATE_QP / CREATE_SRQ and the driver checks they
 * agree. Arguments are within the device's limits (max_sge, max_inline of the config).
 */
VIRTIO_RDMA_INLINE __u32 virtio_rdma_send_stride(__u32 max_sge, __u32 max_inline)
{
	__u32 sges = max_sge * VIRTIO_RDMA_SGE_SIZE;

	return virtio_rdma_pow2_at_least(VIRTIO_RDMA_SEND_WQE_SIZE + (sges > max_inline ? sges : max_inline));
}

VIRTIO_RDMA_INLINE __u32 virtio_rdma_recv_stride(__u32 max_sge)
{
	return virtio_rdma_pow2_at_least(VIRTIO_RDMA_RECV_WQE_SIZE + max_sge * VIRTIO_RDMA_SGE_SIZE);
}

/* ---- Doorbell queue: a chain of readable doorbell records ("Doorbell queue (2)") ----------- */
#define VIRTIO_RDMA_DB_SQ 1u      /* handle = QP, value = send producer index (free-running) */
#define VIRTIO_RDMA_DB_RQ 2u      /* handle = QP, value = receive producer index */
#define VIRTIO_RDMA_DB_SRQ 3u     /* handle = SRQ, value = producer index */
#define VIRTIO_RDMA_DB_CQ_ARM 4u  /* handle = CQ, value = 0 next completion, 1 solicited only */
struct virtio_rdma_doorbell {
	__le32 handle;
	__le16 kind;  /* VIRTIO_RDMA_DB_* */
	__le16 reserved;
	__le32 value;
	__le32 reserved2;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_doorbell) == 16, "virtio_rdma_doorbell is 16 bytes");

/*
 * Doorbell rings ("Doorbell rings", VIRTIO_RDMA_FEATURE_DB_RING): doorbells a process writes
 * itself, with no system call. A driver gives each process a ring in guest memory (CREATE_DB_RING:
 * the ring's number, 1..65535, in virtio_rdma_handle_resp) and names it when it creates that
 * process's CQs, QPs and SRQs (their db_ring field). The process appends virtio_rdma_doorbell
 * records at its free-running producer index (slot producer mod depth), stores the producer
 * (release), then notifies the doorbell queue (2) through its virtio notify address unless the
 * header's flags hold VIRTIO_RDMA_DB_RING_NO_KICK (the device is polling; read after the store
 * with a full barrier). On every doorbell-queue notification, and while it polls, the device
 * reads each ring's producer, takes the records between what it consumed and the producer (a
 * producer more than depth ahead is refused, the ring left as it was) and writes `consumed`. A
 * record acts as one on the doorbell queue, but only on an object created with that ring: any
 * other handle is a refused doorbell. Rings start empty at the producer they hold when created;
 * DESTROY_DB_RING is refused (EBUSY) while an object names the ring. A ring's header and records
 * lie in one guest memory region.
 */
struct virtio_rdma_db_ring_hdr {
	__le32 producer;  /* the process writes: records appended (free-running) */
	__le32 consumed;  /* the device writes: records taken (free-running) */
	__le32 flags;     /* the device writes: VIRTIO_RDMA_DB_RING_* */
	__le32 reserved[13];
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_db_ring_hdr) == 64, "virtio_rdma_db_ring_hdr is 64 bytes");
#define VIRTIO_RDMA_DB_RING_NO_KICK (1u << 0)  /* the device polls the ring: no notification needed */
#define VIRTIO_RDMA_DB_RING_RECORDS_OFFSET 64u
#define VIRTIO_RDMA_DB_RING_MIN_DEPTH 8u
#define VIRTIO_RDMA_DB_RING_MAX_DEPTH 4096u
#define VIRTIO_RDMA_MAX_DB_RINGS 4096u  /* per guest, at once */
VIRTIO_RDMA_INLINE __u64 virtio_rdma_db_ring_bytes(__u32 depth)
{
	__u64 records = depth;

	return VIRTIO_RDMA_DB_RING_RECORDS_OFFSET + records * sizeof(struct virtio_rdma_doorbell);
}

/* ---- Event queue: the driver posts writable buffers; one event each ("Event queue (1)") ---- */
#define VIRTIO_RDMA_EV_CQ_COMPLETION 1u  /* handle = CQ (an armed CQ got a completion) */
#define VIRTIO_RDMA_EV_CQ_ERROR 2u       /* handle = CQ */
#define VIRTIO_RDMA_EV_QP_FATAL 3u       /* handle = QP (the QP went to the error state) */
#define VIRTIO_RDMA_EV_PORT_ACTIVE 4u
#define VIRTIO_RDMA_EV_PORT_ERROR 5u
#define VIRTIO_RDMA_EV_DEVICE_FATAL 6u   /* info = VIRTIO_RDMA_FATAL_* */
/*
 * The device's state may outgrow the posted state area: info = KiB the area must have; the
 * driver posts a larger area on the state queue (the device then returns the old one).
 */
#define VIRTIO_RDMA_EV_STATE_AREA_SMALL 7u
struct virtio_rdma_event {
	__le32 type;  /* VIRTIO_RDMA_EV_* */
	__le32 handle;
	__le32 info;
	__le32 reserved;
};
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_event) == 16, "virtio_rdma_event is 16 bytes");

/* VIRTIO_RDMA_EV_DEVICE_FATAL info: why the device lost the guest's objects. */
#define VIRTIO_RDMA_FATAL_OBJECTS_LOST 1u  /* a migration could not bring them (the state did not come) */
/*
 * The backend restarted (killed or crashed) with no state to take the guest's objects from: a
 * driver that had objects has lost them; a driver with none has lost nothing and carries on.
 */
#define VIRTIO_RDMA_FATAL_BACKEND_RESTARTED 2u

/* ---- State area (the state queue; "State in guest memory") --------------------------------- */
/*
 * The one chain the driver keeps posted on the state queue (writable buffers only, at least
 * VIRTIO_RDMA_MIN_STATE_AREA bytes). When every ring has stopped while the frontend dirty-logs
 * (a live migration), the device writes a virtio_rdma_state_area_hdr and its state blob there,
 * through the dirty log, so the frontend's last memory pass carries it to the destination. A
 * destination device reads it from the chain the driver made available last on the state queue
 * (split ring: avail.ring[(base - 1) mod size]), checks it, loads it and zeroes the magic. The
 * driver zeroes a new area before posting it. The device returns the previous chain (used
 * length 0) when a newer one arrives.
 */
#define VIRTIO_RDMA_STATE_AREA_MAGIC 0x41535256u  /* "VRSA" */
#define VIRTIO_RDMA_MIN_STATE_AREA (64u << 10)
#define VIRTIO_RDMA_MAX_STATE_AREA (64u << 20)

#define VIRTIO_RDMA_STATE_AREA_STATE 1u      /* `length` bytes of device state follow the header */
#define VIRTIO_RDMA_STATE_AREA_TOO_SMALL 2u  /* the state (`need` bytes with the header) did not fit */
/*
 * The source could not save the state (a NIC's QPs, SRQs): `length` bytes of reason (UTF-8, at
 * most VIRTIO_RDMA_MAX_LOST_REASON) follow, no CRC.
 */
#define VIRTIO_RDMA_STATE_AREA_NOT_SAVED 3u
#define VIRTIO_RDMA_MAX_LOST_REASON 1024u

struct virtio_rdma_state_area_hdr {
	__le32 magic;          /* VIRTIO_RDMA_STATE_AREA_MAGIC */
	__le32 status;         /* VIRTIO_RDMA_STATE_AREA_* */
	__le64 length;         /* bytes of state after the header */
	__le64 need;           /* bytes the area needs (header included) */
	__le32 crc32;          /* CRC-32 (zlib) of the state bytes */
	__le32 state_version;  /* the device-state format (vrdmad's RdmaDevice::kStateVersion) */
	__u8 gid[16];          /* the engine's GID 0 at the source: the guest's RDMA address */
	__u8 mac[6];           /* the device's MAC */
	__u8 reserved[26];
};
#define VIRTIO_RDMA_STATE_AREA_HDR_SIZE 80u
VIRTIO_RDMA_STATIC_ASSERT(sizeof(struct virtio_rdma_state_area_hdr) == VIRTIO_RDMA_STATE_AREA_HDR_SIZE,
			  "virtio_rdma_state_area_hdr is 80 bytes");

/*
 * The objects a device holds (not a wire struct): the input of virtio_rdma_state_area_bound().
 * Work requests and inline bytes are summed over QPs (the inline bound is per WR); receive work
 * requests also over SRQs (their depths).
 */
struct virtio_rdma_state_census {
	__u64 pds, ahs, srqs, mrs, mr_pages, cqs, cqes, qps;
	__u64 send_wrs, recv_wrs, inline_bytes;
	__u64 remote_rkeys;  /* rkey translations kept for peers that moved onto a NIC */
	__u64 db_rings;      /* doorbell rings */
};

/*
 * An upper bound of the state's size for a device with these objects: what the device checks the
 * posted area against, and what a driver may size its area by.
 */
VIRTIO_RDMA_INLINE __u64 virtio_rdma_state_area_bound(const struct virtio_rdma_state_census *c)
{
	return VIRTIO_RDMA_STATE_AREA_HDR_SIZE + 4096u + 64u * (c->pds + c->ahs + c->srqs) + 128u * c->mrs +
	       8u * c->mr_pages + 128u * c->cqs + 64u * c->cqes + 2048u * c->qps + 64u * c->db_rings +
	       512u * (c->send_wrs + c->recv_wrs) + c->inline_bytes + 8u * c->remote_rkeys;
}

#endif /* VRDMA_VIRTIO_RDMA_H */
