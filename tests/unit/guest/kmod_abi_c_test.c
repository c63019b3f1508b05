/*
 * The guest kernel driver's user/kernel ABI (guest/include/vrdma/virtio_rdma_abi.h) compiled as
 * C11 with -pedantic and warnings as errors, as the rdma-core provider will compile it, next to
 * the device contract it refers to. Every struct's size and every field's offset and width are
 * checked against literal numbers: the module and the provider must agree byte for byte.
 * Exits non-zero on any mismatch.
 */
#include <vrdma/virtio_rdma.h>
#include <vrdma/virtio_rdma_abi.h>

#include "c_layout_check.h"

int main(void)
{
	check("VIRTIO_RDMA_ABI_VERSION", VIRTIO_RDMA_ABI_VERSION, 1);

	SIZE(virtio_rdma_abi_ucontext_resp, 56);
	check("VIRTIO_RDMA_ABI_UCTX_RESP_V1_SIZE", VIRTIO_RDMA_ABI_UCTX_RESP_V1_SIZE, 24);
	check("VIRTIO_RDMA_ABI_UCTX_DB_RING", VIRTIO_RDMA_ABI_UCTX_DB_RING, 1);
	check("VIRTIO_RDMA_ABI_UCTX_IPV4", VIRTIO_RDMA_ABI_UCTX_IPV4, 2);
	FIELD(virtio_rdma_abi_ucontext_resp, abi_version, 0, 4);
	FIELD(virtio_rdma_abi_ucontext_resp, max_qp_wr, 4, 4);
	FIELD(virtio_rdma_abi_ucontext_resp, max_cqe, 8, 4);
	FIELD(virtio_rdma_abi_ucontext_resp, max_sge, 12, 4);
	FIELD(virtio_rdma_abi_ucontext_resp, max_inline, 16, 4);
	FIELD(virtio_rdma_abi_ucontext_resp, flags, 20, 4);
	FIELD(virtio_rdma_abi_ucontext_resp, db_ring_mmap_offset, 24, 8);
	FIELD(virtio_rdma_abi_ucontext_resp, db_ring_mmap_size, 32, 4);
	FIELD(virtio_rdma_abi_ucontext_resp, db_ring_depth, 36, 4);
	FIELD(virtio_rdma_abi_ucontext_resp, notify_mmap_offset, 40, 8);
	FIELD(virtio_rdma_abi_ucontext_resp, notify_offset, 48, 4);
	FIELD(virtio_rdma_abi_ucontext_resp, notify_value, 52, 2);
	FIELD(virtio_rdma_abi_ucontext_resp, reserved, 54, 2);

	SIZE(virtio_rdma_abi_create_cq_resp, 24);
	FIELD(virtio_rdma_abi_create_cq_resp, mmap_offset, 0, 8);
	FIELD(virtio_rdma_abi_create_cq_resp, mmap_size, 8, 4);
	FIELD(virtio_rdma_abi_create_cq_resp, depth, 12, 4);
	FIELD(virtio_rdma_abi_create_cq_resp, cq_handle, 16, 4);

	SIZE(virtio_rdma_abi_qp_db, 64);
	FIELD(virtio_rdma_abi_qp_db, sq_producer, 0, 4);
	FIELD(virtio_rdma_abi_qp_db, rq_producer, 4, 4);

	SIZE(virtio_rdma_abi_create_qp_resp, 64);
	FIELD(virtio_rdma_abi_create_qp_resp, mmap_offset, 0, 8);
	FIELD(virtio_rdma_abi_create_qp_resp, mmap_size, 8, 4);
	FIELD(virtio_rdma_abi_create_qp_resp, sq_offset, 12, 4);
	FIELD(virtio_rdma_abi_create_qp_resp, rq_offset, 16, 4);
	FIELD(virtio_rdma_abi_create_qp_resp, status_offset, 20, 4);
	FIELD(virtio_rdma_abi_create_qp_resp, db_offset, 24, 4);
	FIELD(virtio_rdma_abi_create_qp_resp, sq_depth, 28, 4);
	FIELD(virtio_rdma_abi_create_qp_resp, rq_depth, 32, 4);
	FIELD(virtio_rdma_abi_create_qp_resp, sq_stride, 36, 4);
	FIELD(virtio_rdma_abi_create_qp_resp, rq_stride, 40, 4);
	FIELD(virtio_rdma_abi_create_qp_resp, max_send_sge, 44, 4);
	FIELD(virtio_rdma_abi_create_qp_resp, max_recv_sge, 48, 4);
	FIELD(virtio_rdma_abi_create_qp_resp, max_inline, 52, 4);
	FIELD(virtio_rdma_abi_create_qp_resp, qp_handle, 56, 4);
	FIELD(virtio_rdma_abi_create_qp_resp, qp_num, 60, 4);

	SIZE(virtio_rdma_abi_create_srq_resp, 40);
	FIELD(virtio_rdma_abi_create_srq_resp, mmap_offset, 0, 8);
	FIELD(virtio_rdma_abi_create_srq_resp, mmap_size, 8, 4);
	FIELD(virtio_rdma_abi_create_srq_resp, ring_offset, 12, 4);
	FIELD(virtio_rdma_abi_create_srq_resp, status_offset, 16, 4);
	FIELD(virtio_rdma_abi_create_srq_resp, db_offset, 20, 4);
	FIELD(virtio_rdma_abi_create_srq_resp, depth, 24, 4);
	FIELD(virtio_rdma_abi_create_srq_resp, stride, 28, 4);
	FIELD(virtio_rdma_abi_create_srq_resp, max_sge, 32, 4);
	FIELD(virtio_rdma_abi_create_srq_resp, srq_handle, 36, 4);

	SIZE(virtio_rdma_abi_create_ah_resp, 8);
	FIELD(virtio_rdma_abi_create_ah_resp, ah_handle, 0, 4);

	/* The doorbell record shares the status block's page: both fit after it, 64-byte aligned. */
	check("qp_db after qp_status", sizeof(struct virtio_rdma_qp_status) + sizeof(struct virtio_rdma_abi_qp_db), 128);

	if (layout_failures)
		fprintf(stderr, "%d mismatches\n", layout_failures);
	else
		printf("virtio_rdma_abi.h: every size and offset as built on\n");
	return layout_failures ? 1 : 0;
}
