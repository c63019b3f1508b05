/* SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause) */
/*
 * The user/kernel ABI of virtio_rdma.ko (guest/kernel/, docs/virtio-rdma.md "The guest kernel
 * driver"): the driver-specific udata that follows the uverbs core structs of GET_CONTEXT,
 * CREATE_CQ, CREATE_QP, CREATE_SRQ and CREATE_AH, and the doorbell record a process shares with the driver. Shared by
 * the module and the rdma-core provider (the next slice), in the manner of Linux's
 * include/uapi/rdma/ (vmw_pvrdma-abi.h and its kin): fixed-size __u32/__u64 fields in host order (the guest's: the
 * rings themselves are the device contract's, little-endian, include/vrdma/virtio_rdma.h), no
 * implicit padding, sizes asserted, no libc.
 *
 * The rings are allocated by the kernel, physically contiguous and page-aligned, handed to the
 * device by guest-physical address, and mapped into the process with mmap(uverbs fd, offset):
 * the offsets below are mmap offsets, valid for the process that created the object. A CQ maps
 * as one range: the 64-byte virtio_rdma_cq_control, then depth CQEs. A QP maps as one range
 * laid out by the sq/rq/status/db offsets (offsets into that range): the send ring, the receive
 * ring, the device's virtio_rdma_qp_status, and a virtio_rdma_abi_qp_db the process writes.
 */
#ifndef VRDMA_VIRTIO_RDMA_ABI_H
#define VRDMA_VIRTIO_RDMA_ABI_H

#include <linux/types.h>

#ifdef __cplusplus
#define VIRTIO_RDMA_ABI_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define VIRTIO_RDMA_ABI_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

/* ib_device_ops.uverbs_abi_ver: a provider refuses a kernel with another. */
#define VIRTIO_RDMA_ABI_VERSION 1u

/*
 * GET_CONTEXT's driver response: the limits the provider sizes rings against and, with
 * VIRTIO_RDMA_ABI_UCTX_DB_RING in flags, the process's doorbell ring (the contract's "Doorbell
 * rings": a virtio_rdma_db_ring_hdr then db_ring_depth virtio_rdma_doorbell records, mapped at
 * db_ring_mmap_offset) and the doorbell queue's notify address (the page mapped at
 * notify_mmap_offset; a 16-bit write of notify_value at notify_offset in it notifies the device).
 * Every CQ, QP and SRQ of the context is then rung through the ring: the process writes its
 * producer index into the object's doorbell record as before, appends a record naming the
 * object's handle (the *_handle of its create response) and notifies, with no system call.
 * A provider that asks for the first 24 bytes only gets no ring (and rings through the kernel).
 */
#define VIRTIO_RDMA_ABI_UCTX_DB_RING (1u << 0)
/*
 * The device's RoCEv2 packets are IPv4 ones (its GID 0 is IPv4-mapped): a UD receive's 40-byte
 * GRH area holds the IPv4 header in its last 20 bytes. The provider then reports a UD receive
 * with a GRH with sl 2, the IPv4 code ConnectX puts in the SL of such a completion (bits 2:0, the
 * L3 header type), which UCX 1.13-1.18's ud_verbs reads to find the destination GID it filters on.
 */
#define VIRTIO_RDMA_ABI_UCTX_IPV4 (1u << 1)
struct virtio_rdma_abi_ucontext_resp {
	__u32 abi_version;  /* VIRTIO_RDMA_ABI_VERSION */
	__u32 max_qp_wr;    /* ring depths are powers of two up to these */
	__u32 max_cqe;
	__u32 max_sge;
	__u32 max_inline;
	__u32 flags;        /* VIRTIO_RDMA_ABI_UCTX_* */
	__u64 db_ring_mmap_offset;
	__u32 db_ring_mmap_size;
	__u32 db_ring_depth;
	__u64 notify_mmap_offset;  /* one page, write-only use */
	__u32 notify_offset;
	__u16 notify_value;
	__u16 reserved;
};
VIRTIO_RDMA_ABI_STATIC_ASSERT(sizeof(struct virtio_rdma_abi_ucontext_resp) == 56, "ucontext_resp is 56 bytes");
#define VIRTIO_RDMA_ABI_UCTX_RESP_V1_SIZE 24u  /* before doorbell rings */

/* CREATE_CQ's driver response. The ring holds depth CQEs (depth >= the asked cqe, a power of two). */
struct virtio_rdma_abi_create_cq_resp {
	__u64 mmap_offset;  /* mmap(..., mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED, uverbs fd, mmap_offset) */
	__u32 mmap_size;    /* bytes, a whole number of pages */
	__u32 depth;
	__u32 cq_handle;    /* the device's handle (informative: events travel through the kernel) */
	__u32 reserved;
};
VIRTIO_RDMA_ABI_STATIC_ASSERT(sizeof(struct virtio_rdma_abi_create_cq_resp) == 24, "create_cq_resp is 24 bytes");

/*
 * The doorbell record in a QP's mapping (db_offset): the process writes its free-running
 * producer indexes here after writing WQEs, then issues the uverbs POST_SEND / POST_RECV write
 * command with no work requests (wr_count 0); the driver reads the index and rings the device
 * (a DB_SQ / DB_RQ record on the doorbell queue). The driver checks it: an index more than the
 * ring's depth ahead of what the device consumed, or behind what the driver last rang, is
 * refused with EINVAL.
 */
struct virtio_rdma_abi_qp_db {
	__u32 sq_producer;
	__u32 rq_producer;
	__u32 reserved[14];
};
VIRTIO_RDMA_ABI_STATIC_ASSERT(sizeof(struct virtio_rdma_abi_qp_db) == 64, "qp_db is 64 bytes");

/*
 * CREATE_QP's driver response: one mapping, the four parts at these offsets into it. A QP on an
 * SRQ has no receive ring (rq_depth and rq_stride 0): its receives are the SRQ's.
 */
struct virtio_rdma_abi_create_qp_resp {
	__u64 mmap_offset;
	__u32 mmap_size;
	__u32 sq_offset;      /* the send ring: sq_depth WQEs of sq_stride bytes */
	__u32 rq_offset;      /* the receive ring: rq_depth WQEs of rq_stride bytes */
	__u32 status_offset;  /* struct virtio_rdma_qp_status (device-written) */
	__u32 db_offset;      /* struct virtio_rdma_abi_qp_db (process-written) */
	__u32 sq_depth, rq_depth;
	__u32 sq_stride, rq_stride;
	__u32 max_send_sge, max_recv_sge, max_inline;
	__u32 qp_handle;      /* the device's handle (informative) */
	__u32 qp_num;
};
VIRTIO_RDMA_ABI_STATIC_ASSERT(sizeof(struct virtio_rdma_abi_create_qp_resp) == 64, "create_qp_resp is 64 bytes");

/*
 * CREATE_SRQ's driver response: one mapping holding the ring (depth WQEs of stride bytes, the
 * receive WQE layout), the device's virtio_rdma_qp_status (rq_consumed) and a
 * virtio_rdma_abi_qp_db whose rq_producer is the SRQ's producer index (rung with the uverbs
 * POST_SRQ_RECV command carrying no work request).
 */
struct virtio_rdma_abi_create_srq_resp {
	__u64 mmap_offset;
	__u32 mmap_size;
	__u32 ring_offset;
	__u32 status_offset;
	__u32 db_offset;
	__u32 depth;
	__u32 stride;
	__u32 max_sge;
	__u32 srq_handle;  /* the device's handle (informative) */
};
VIRTIO_RDMA_ABI_STATIC_ASSERT(sizeof(struct virtio_rdma_abi_create_srq_resp) == 40, "create_srq_resp is 40 bytes");

/* CREATE_AH's driver response: the handle a UD send WQE names (virtio_rdma_send_wqe.ah). */
struct virtio_rdma_abi_create_ah_resp {
	__u32 ah_handle;
	__u32 reserved;
};
VIRTIO_RDMA_ABI_STATIC_ASSERT(sizeof(struct virtio_rdma_abi_create_ah_resp) == 8, "create_ah_resp is 8 bytes");

#endif /* VRDMA_VIRTIO_RDMA_ABI_H */
