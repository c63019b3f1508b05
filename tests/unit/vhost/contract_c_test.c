/*
 * The virtio RDMA device contract (include/vrdma/virtio_rdma.h) compiled as C11 with -pedantic
 * and warnings as errors, as a C driver compiles it. Every struct's size and every field's
 * offset and width are checked against literal numbers (docs/virtio-rdma.md gives the same):
 * the wire layout the C++ code was built on must not move by one byte. Also the values of the
 * wire constants and the helpers a C driver calls. Exits non-zero on any mismatch.
 */
#include <vrdma/virtio_rdma.h>

#include "c_layout_check.h"

static void check_identity(void)
{
	VALUE(VIRTIO_RDMA_DEVICE_ID, 42);
	VALUE(VIRTIO_RDMA_SIGNATURE, 0x4d445256);
	VALUE(VIRTIO_RDMA_VERSION, 1);
	VALUE(VIRTIO_RDMA_CONTROL_QUEUE, 0);
	VALUE(VIRTIO_RDMA_EVENT_QUEUE, 1);
	VALUE(VIRTIO_RDMA_DOORBELL_QUEUE, 2);
	VALUE(VIRTIO_RDMA_STATE_QUEUE, 3);
	VALUE(VIRTIO_RDMA_NUM_QUEUES, 4);
	VALUE(VIRTIO_RDMA_REQUIRED_QUEUES, 3);

	SIZE(virtio_rdma_config, 112);
	FIELD(virtio_rdma_config, signature, 0, 4);
	FIELD(virtio_rdma_config, version, 4, 2);
	FIELD(virtio_rdma_config, num_queues, 6, 2);
	FIELD(virtio_rdma_config, features, 8, 8);
	FIELD(virtio_rdma_config, max_qp, 16, 4);
	FIELD(virtio_rdma_config, max_cq, 20, 4);
	FIELD(virtio_rdma_config, max_mr, 24, 4);
	FIELD(virtio_rdma_config, max_pd, 28, 4);
	FIELD(virtio_rdma_config, max_ah, 32, 4);
	FIELD(virtio_rdma_config, max_srq, 36, 4);
	FIELD(virtio_rdma_config, max_qp_wr, 40, 4);
	FIELD(virtio_rdma_config, max_cqe, 44, 4);
	FIELD(virtio_rdma_config, max_sge, 48, 4);
	FIELD(virtio_rdma_config, max_inline, 52, 4);
	FIELD(virtio_rdma_config, max_mr_pages, 56, 4);
	FIELD(virtio_rdma_config, max_qp_rd_atom, 60, 4);
	FIELD(virtio_rdma_config, max_registered_bytes, 64, 8);
	FIELD(virtio_rdma_config, mac, 72, 6);
	FIELD(virtio_rdma_config, port_state, 78, 1);
	FIELD(virtio_rdma_config, active_mtu, 79, 1);
	FIELD(virtio_rdma_config, gid, 80, 16);
	FIELD(virtio_rdma_config, transport, 96, 4);
	FIELD(virtio_rdma_config, max_fast_reg_pages, 100, 4);
	FIELD(virtio_rdma_config, reserved, 104, 8);
	VALUE(VIRTIO_RDMA_FEATURE_UD, 1);
	VALUE(VIRTIO_RDMA_FEATURE_SRQ, 2);
	VALUE(VIRTIO_RDMA_FEATURE_ATOMIC, 4);
	VALUE(VIRTIO_RDMA_FEATURE_MIGRATION, 8);
	VALUE(VIRTIO_RDMA_FEATURE_DMA_MR, 16);
	VALUE(VIRTIO_RDMA_FEATURE_GSI, 32);
	VALUE(VIRTIO_RDMA_FEATURE_FAST_REG, 64);
	VALUE(VIRTIO_RDMA_FEATURE_DB_RING, 128);
	VALUE(VIRTIO_RDMA_QPT_GSI, 1);
	VALUE(VIRTIO_RDMA_SEND_INLINE_AV, 16);
	VALUE(VIRTIO_RDMA_INLINE_AV_SIZE, 32);
	VALUE(VIRTIO_RDMA_QPT_RC, 2);
	VALUE(VIRTIO_RDMA_QPT_UD, 4);

	SIZE(virtio_rdma_carrier_config, 32);
	FIELD(virtio_rdma_carrier_config, blk_capacity, 0, 8);
	FIELD(virtio_rdma_carrier_config, signature, 8, 4);
	FIELD(virtio_rdma_carrier_config, version, 12, 2);
	FIELD(virtio_rdma_carrier_config, num_queues, 14, 2);
	FIELD(virtio_rdma_carrier_config, features, 16, 8);
	FIELD(virtio_rdma_carrier_config, config_size, 24, 4);
	FIELD(virtio_rdma_carrier_config, reserved, 28, 4);
	VALUE(VIRTIO_RDMA_CARRIER_SIGNATURE_OFFSET, 8);
	VALUE(VIRTIO_RDMA_CARRIER_BLK_NUM_QUEUES_OFFSET, 34);
	VALUE(VIRTIO_RDMA_CARRIER_MIN_WINDOW, 36);
}

static void check_control(void)
{
	VALUE(VIRTIO_RDMA_CMD_QUERY_DEVICE, 1);
	VALUE(VIRTIO_RDMA_CMD_QUERY_PORT, 2);
	VALUE(VIRTIO_RDMA_CMD_QUERY_GID, 3);
	VALUE(VIRTIO_RDMA_CMD_CREATE_PD, 4);
	VALUE(VIRTIO_RDMA_CMD_DESTROY_PD, 5);
	VALUE(VIRTIO_RDMA_CMD_REG_MR, 6);
	VALUE(VIRTIO_RDMA_CMD_DEREG_MR, 7);
	VALUE(VIRTIO_RDMA_CMD_CREATE_CQ, 8);
	VALUE(VIRTIO_RDMA_CMD_DESTROY_CQ, 9);
	VALUE(VIRTIO_RDMA_CMD_CREATE_QP, 10);
	VALUE(VIRTIO_RDMA_CMD_MODIFY_QP, 11);
	VALUE(VIRTIO_RDMA_CMD_QUERY_QP, 12);
	VALUE(VIRTIO_RDMA_CMD_DESTROY_QP, 13);
	VALUE(VIRTIO_RDMA_CMD_CREATE_AH, 14);
	VALUE(VIRTIO_RDMA_CMD_DESTROY_AH, 15);
	VALUE(VIRTIO_RDMA_CMD_CREATE_SRQ, 16);
	VALUE(VIRTIO_RDMA_CMD_DESTROY_SRQ, 17);
	VALUE(VIRTIO_RDMA_CMD_QUERY_CONFIG, 18);
	VALUE(VIRTIO_RDMA_CMD_REG_DMA_MR, 19);
	VALUE(VIRTIO_RDMA_CMD_ALLOC_MR, 20);
	VALUE(VIRTIO_RDMA_CMD_CREATE_DB_RING, 21);
	VALUE(VIRTIO_RDMA_CMD_DESTROY_DB_RING, 22);
	VALUE(VIRTIO_RDMA_CMD_COUNT, 23);
	/* Each command's request body (docs/virtio-rdma.md "Commands"). */
	{
		static const unsigned req_len[23] = {0xffffffffu, 0, 0, 8, 0, 8, 40, 8, 16, 8, 64, 92, 8, 8, 40, 8, 32, 8, 0, 8, 8,
						     16, 8};
		char what[64];
		for (unsigned c = 0; c <= VIRTIO_RDMA_CMD_COUNT; ++c) {
			snprintf(what, sizeof what, "virtio_rdma_cmd_req_len(%u)", c);
			check(what, virtio_rdma_cmd_req_len(c), c < 23 ? req_len[c] : VIRTIO_RDMA_CMD_NONE);
		}
		VALUE(VIRTIO_RDMA_CMD_NONE, 0xffffffffu);
	}
	VALUE(VIRTIO_RDMA_ACCESS_LOCAL_WRITE, 1);
	SIZE(virtio_rdma_reg_dma_mr_req, 8);
	FIELD(virtio_rdma_reg_dma_mr_req, pd, 0, 4);
	FIELD(virtio_rdma_reg_dma_mr_req, access, 4, 4);
	SIZE(virtio_rdma_alloc_mr_req, 8);
	FIELD(virtio_rdma_alloc_mr_req, pd, 0, 4);
	FIELD(virtio_rdma_alloc_mr_req, max_pages, 4, 4);
	/* Linux errno numbers. */
	VALUE(VIRTIO_RDMA_S_OK, 0);
	VALUE(VIRTIO_RDMA_S_PERM, 1);
	VALUE(VIRTIO_RDMA_S_NOT_FOUND, 2);
	VALUE(VIRTIO_RDMA_S_IO, 5);
	VALUE(VIRTIO_RDMA_S_NO_MEMORY, 12);
	VALUE(VIRTIO_RDMA_S_FAULT, 14);
	VALUE(VIRTIO_RDMA_S_BUSY, 16);
	VALUE(VIRTIO_RDMA_S_INVALID, 22);
	VALUE(VIRTIO_RDMA_S_NO_SPACE, 28);
	VALUE(VIRTIO_RDMA_S_NOT_SUPPORTED, 95);
	VALUE(VIRTIO_RDMA_MAX_ERROR_MESSAGE, 480);
	VALUE(VIRTIO_RDMA_NO_HANDLE, 0);

	SIZE(virtio_rdma_cmd_hdr, 8);
	FIELD(virtio_rdma_cmd_hdr, cmd, 0, 4);
	FIELD(virtio_rdma_cmd_hdr, reserved, 4, 4);
	SIZE(virtio_rdma_resp_hdr, 8);
	FIELD(virtio_rdma_resp_hdr, status, 0, 4);
	FIELD(virtio_rdma_resp_hdr, msg_len, 4, 4);

	SIZE(virtio_rdma_device_attr_resp, 112);
	FIELD(virtio_rdma_device_attr_resp, node_guid, 0, 8);
	FIELD(virtio_rdma_device_attr_resp, max_mr_size, 8, 8);
	FIELD(virtio_rdma_device_attr_resp, vendor_id, 16, 4);
	FIELD(virtio_rdma_device_attr_resp, vendor_part_id, 20, 4);
	FIELD(virtio_rdma_device_attr_resp, max_qp, 24, 4);
	FIELD(virtio_rdma_device_attr_resp, max_qp_wr, 28, 4);
	FIELD(virtio_rdma_device_attr_resp, max_sge, 32, 4);
	FIELD(virtio_rdma_device_attr_resp, max_cq, 36, 4);
	FIELD(virtio_rdma_device_attr_resp, max_cqe, 40, 4);
	FIELD(virtio_rdma_device_attr_resp, max_mr, 44, 4);
	FIELD(virtio_rdma_device_attr_resp, max_pd, 48, 4);
	FIELD(virtio_rdma_device_attr_resp, max_ah, 52, 4);
	FIELD(virtio_rdma_device_attr_resp, max_srq, 56, 4);
	FIELD(virtio_rdma_device_attr_resp, max_srq_wr, 60, 4);
	FIELD(virtio_rdma_device_attr_resp, max_qp_rd_atom, 64, 4);
	FIELD(virtio_rdma_device_attr_resp, max_qp_init_rd_atom, 68, 4);
	FIELD(virtio_rdma_device_attr_resp, max_inline_data, 72, 4);
	FIELD(virtio_rdma_device_attr_resp, atomic_cap, 76, 1);
	FIELD(virtio_rdma_device_attr_resp, phys_port_cnt, 77, 1);
	FIELD(virtio_rdma_device_attr_resp, transport, 78, 1);
	FIELD(virtio_rdma_device_attr_resp, reserved, 79, 1);
	FIELD(virtio_rdma_device_attr_resp, fw_ver, 80, 32);

	SIZE(virtio_rdma_port_attr_resp, 16);
	FIELD(virtio_rdma_port_attr_resp, state, 0, 1);
	FIELD(virtio_rdma_port_attr_resp, max_mtu, 1, 1);
	FIELD(virtio_rdma_port_attr_resp, active_mtu, 2, 1);
	FIELD(virtio_rdma_port_attr_resp, link_layer, 3, 1);
	FIELD(virtio_rdma_port_attr_resp, gid_tbl_len, 4, 4);
	FIELD(virtio_rdma_port_attr_resp, max_msg_sz, 8, 4);
	FIELD(virtio_rdma_port_attr_resp, active_speed_mbps, 12, 4);

	SIZE(virtio_rdma_query_gid_req, 8);
	FIELD(virtio_rdma_query_gid_req, index, 0, 4);
	FIELD(virtio_rdma_query_gid_req, reserved, 4, 4);
	SIZE(virtio_rdma_gid_resp, 24);
	FIELD(virtio_rdma_gid_resp, gid, 0, 16);
	FIELD(virtio_rdma_gid_resp, type, 16, 4);
	FIELD(virtio_rdma_gid_resp, reserved, 20, 4);

	SIZE(virtio_rdma_handle_req, 8);
	FIELD(virtio_rdma_handle_req, handle, 0, 4);
	FIELD(virtio_rdma_handle_req, reserved, 4, 4);
	SIZE(virtio_rdma_handle_resp, 8);
	FIELD(virtio_rdma_handle_resp, handle, 0, 4);
	FIELD(virtio_rdma_handle_resp, reserved, 4, 4);

	SIZE(virtio_rdma_reg_mr_req, 40);
	FIELD(virtio_rdma_reg_mr_req, pd, 0, 4);
	FIELD(virtio_rdma_reg_mr_req, access, 4, 4);
	FIELD(virtio_rdma_reg_mr_req, iova, 8, 8);
	FIELD(virtio_rdma_reg_mr_req, length, 16, 8);
	FIELD(virtio_rdma_reg_mr_req, pages_gpa, 24, 8);
	FIELD(virtio_rdma_reg_mr_req, npages, 32, 4);
	FIELD(virtio_rdma_reg_mr_req, page_shift, 36, 4);
	SIZE(virtio_rdma_reg_mr_resp, 16);
	FIELD(virtio_rdma_reg_mr_resp, mr, 0, 4);
	FIELD(virtio_rdma_reg_mr_resp, lkey, 4, 4);
	FIELD(virtio_rdma_reg_mr_resp, rkey, 8, 4);
	FIELD(virtio_rdma_reg_mr_resp, reserved, 12, 4);
}

static void check_cq(void)
{
	SIZE(virtio_rdma_create_cq_req, 16);
	FIELD(virtio_rdma_create_cq_req, depth, 0, 4);
	FIELD(virtio_rdma_create_cq_req, db_ring, 4, 4);
	FIELD(virtio_rdma_create_cq_req, ring_gpa, 8, 8);

	SIZE(virtio_rdma_cq_control, 64);
	FIELD(virtio_rdma_cq_control, consumer, 0, 4);
	FIELD(virtio_rdma_cq_control, producer, 4, 4);
	FIELD(virtio_rdma_cq_control, overruns, 8, 4);
	FIELD(virtio_rdma_cq_control, reserved, 12, 52);

	SIZE(virtio_rdma_cqe, 32);
	FIELD(virtio_rdma_cqe, wr_id, 0, 8);
	FIELD(virtio_rdma_cqe, qp_num, 8, 4);
	FIELD(virtio_rdma_cqe, byte_len, 12, 4);
	FIELD(virtio_rdma_cqe, imm_data, 16, 4);
	FIELD(virtio_rdma_cqe, src_qp, 20, 4);
	FIELD(virtio_rdma_cqe, status, 24, 1);
	FIELD(virtio_rdma_cqe, opcode, 25, 1);
	FIELD(virtio_rdma_cqe, wc_flags, 26, 1);
	FIELD(virtio_rdma_cqe, owner, 27, 1);
	FIELD(virtio_rdma_cqe, vendor_err, 28, 4);
	VALUE(VIRTIO_RDMA_WC_WITH_IMM, 1);
	VALUE(VIRTIO_RDMA_WC_GRH, 2);
	VALUE(VIRTIO_RDMA_WC_SOLICITED, 4);
	VALUE(VIRTIO_RDMA_WC_WITH_INV, 8);
	VALUE(VIRTIO_RDMA_WC_LOCAL_INV, 6);
	VALUE(VIRTIO_RDMA_WC_REG_MR, 10);
	VALUE(VIRTIO_RDMA_CQE_OFFSET, 64);
	VALUE(VIRTIO_RDMA_CQE_SIZE, 32);

	/* Owner byte of a valid CQE: 1 on the first pass over the ring, 0 on the second, ... */
	check("virtio_rdma_cqe_phase(0, 8)", virtio_rdma_cqe_phase(0, 8), 1);
	check("virtio_rdma_cqe_phase(7, 8)", virtio_rdma_cqe_phase(7, 8), 1);
	check("virtio_rdma_cqe_phase(8, 8)", virtio_rdma_cqe_phase(8, 8), 0);
	check("virtio_rdma_cqe_phase(15, 8)", virtio_rdma_cqe_phase(15, 8), 0);
	check("virtio_rdma_cqe_phase(16, 8)", virtio_rdma_cqe_phase(16, 8), 1);
	check("virtio_rdma_cqe_phase(0xffffffff, 1)", virtio_rdma_cqe_phase(0xffffffffu, 1), 0);
}

static void check_qp(void)
{
	SIZE(virtio_rdma_create_qp_req, 64);
	FIELD(virtio_rdma_create_qp_req, pd, 0, 4);
	FIELD(virtio_rdma_create_qp_req, send_cq, 4, 4);
	FIELD(virtio_rdma_create_qp_req, recv_cq, 8, 4);
	FIELD(virtio_rdma_create_qp_req, srq, 12, 4);
	FIELD(virtio_rdma_create_qp_req, qp_type, 16, 1);
	FIELD(virtio_rdma_create_qp_req, sq_sig_all, 17, 1);
	FIELD(virtio_rdma_create_qp_req, db_ring, 18, 2);
	FIELD(virtio_rdma_create_qp_req, sq_depth, 20, 4);
	FIELD(virtio_rdma_create_qp_req, rq_depth, 24, 4);
	FIELD(virtio_rdma_create_qp_req, max_send_sge, 28, 4);
	FIELD(virtio_rdma_create_qp_req, max_recv_sge, 32, 4);
	FIELD(virtio_rdma_create_qp_req, max_inline, 36, 4);
	FIELD(virtio_rdma_create_qp_req, sq_gpa, 40, 8);
	FIELD(virtio_rdma_create_qp_req, rq_gpa, 48, 8);
	FIELD(virtio_rdma_create_qp_req, status_gpa, 56, 8);

	SIZE(virtio_rdma_create_qp_resp, 16);
	FIELD(virtio_rdma_create_qp_resp, qp, 0, 4);
	FIELD(virtio_rdma_create_qp_resp, qp_num, 4, 4);
	FIELD(virtio_rdma_create_qp_resp, sq_stride, 8, 4);
	FIELD(virtio_rdma_create_qp_resp, rq_stride, 12, 4);

	SIZE(virtio_rdma_qp_status, 64);
	FIELD(virtio_rdma_qp_status, sq_consumed, 0, 4);
	FIELD(virtio_rdma_qp_status, rq_consumed, 4, 4);
	FIELD(virtio_rdma_qp_status, state, 8, 4);
	FIELD(virtio_rdma_qp_status, reserved, 12, 52);

	SIZE(virtio_rdma_ah, 28);
	FIELD(virtio_rdma_ah, dgid, 0, 16);
	FIELD(virtio_rdma_ah, flow_label, 16, 4);
	FIELD(virtio_rdma_ah, sgid_index, 20, 1);
	FIELD(virtio_rdma_ah, hop_limit, 21, 1);
	FIELD(virtio_rdma_ah, traffic_class, 22, 1);
	FIELD(virtio_rdma_ah, sl, 23, 1);
	FIELD(virtio_rdma_ah, port_num, 24, 1);
	FIELD(virtio_rdma_ah, reserved, 25, 3);

	SIZE(virtio_rdma_qp_attr, 84);
	FIELD(virtio_rdma_qp_attr, qp_state, 0, 1);
	FIELD(virtio_rdma_qp_attr, cur_qp_state, 1, 1);
	FIELD(virtio_rdma_qp_attr, path_mtu, 2, 1);
	FIELD(virtio_rdma_qp_attr, qp_access_flags_pad, 3, 1);
	FIELD(virtio_rdma_qp_attr, qp_access_flags, 4, 4);
	FIELD(virtio_rdma_qp_attr, qkey, 8, 4);
	FIELD(virtio_rdma_qp_attr, rq_psn, 12, 4);
	FIELD(virtio_rdma_qp_attr, sq_psn, 16, 4);
	FIELD(virtio_rdma_qp_attr, dest_qp_num, 20, 4);
	FIELD(virtio_rdma_qp_attr, max_send_wr, 24, 4);
	FIELD(virtio_rdma_qp_attr, max_recv_wr, 28, 4);
	FIELD(virtio_rdma_qp_attr, max_send_sge, 32, 4);
	FIELD(virtio_rdma_qp_attr, max_recv_sge, 36, 4);
	FIELD(virtio_rdma_qp_attr, max_inline_data, 40, 4);
	FIELD(virtio_rdma_qp_attr, pkey_index, 44, 2);
	FIELD(virtio_rdma_qp_attr, sq_draining, 46, 1);
	FIELD(virtio_rdma_qp_attr, max_rd_atomic, 47, 1);
	FIELD(virtio_rdma_qp_attr, max_dest_rd_atomic, 48, 1);
	FIELD(virtio_rdma_qp_attr, min_rnr_timer, 49, 1);
	FIELD(virtio_rdma_qp_attr, port_num, 50, 1);
	FIELD(virtio_rdma_qp_attr, timeout, 51, 1);
	FIELD(virtio_rdma_qp_attr, retry_cnt, 52, 1);
	FIELD(virtio_rdma_qp_attr, rnr_retry, 53, 1);
	FIELD(virtio_rdma_qp_attr, reserved, 54, 2);
	FIELD(virtio_rdma_qp_attr, ah, 56, 28);

	SIZE(virtio_rdma_modify_qp_req, 92);
	FIELD(virtio_rdma_modify_qp_req, qp, 0, 4);
	FIELD(virtio_rdma_modify_qp_req, mask, 4, 4);
	FIELD(virtio_rdma_modify_qp_req, attr, 8, 84);

	SIZE(virtio_rdma_create_ah_req, 40);
	FIELD(virtio_rdma_create_ah_req, pd, 0, 4);
	FIELD(virtio_rdma_create_ah_req, reserved, 4, 4);
	FIELD(virtio_rdma_create_ah_req, ah, 8, 28);
	FIELD(virtio_rdma_create_ah_req, reserved2, 36, 4);

	SIZE(virtio_rdma_create_srq_req, 32);
	FIELD(virtio_rdma_create_srq_req, pd, 0, 4);
	FIELD(virtio_rdma_create_srq_req, depth, 4, 4);
	FIELD(virtio_rdma_create_srq_req, max_sge, 8, 4);
	FIELD(virtio_rdma_create_srq_req, db_ring, 12, 4);
	FIELD(virtio_rdma_create_srq_req, ring_gpa, 16, 8);
	FIELD(virtio_rdma_create_srq_req, status_gpa, 24, 8);
	SIZE(virtio_rdma_create_srq_resp, 8);
	FIELD(virtio_rdma_create_srq_resp, srq, 0, 4);
	FIELD(virtio_rdma_create_srq_resp, stride, 4, 4);
}

static void check_rings(void)
{
	SIZE(virtio_rdma_send_wqe, 64);
	FIELD(virtio_rdma_send_wqe, wr_id, 0, 8);
	FIELD(virtio_rdma_send_wqe, opcode, 8, 1);
	FIELD(virtio_rdma_send_wqe, flags, 9, 1);
	FIELD(virtio_rdma_send_wqe, num_sge, 10, 1);
	FIELD(virtio_rdma_send_wqe, reserved, 11, 1);
	FIELD(virtio_rdma_send_wqe, imm_data, 12, 4);
	FIELD(virtio_rdma_send_wqe, remote_addr, 16, 8);
	FIELD(virtio_rdma_send_wqe, rkey, 24, 4);
	FIELD(virtio_rdma_send_wqe, inline_len, 28, 4);
	FIELD(virtio_rdma_send_wqe, compare_add, 32, 8);
	FIELD(virtio_rdma_send_wqe, swap, 40, 8);
	FIELD(virtio_rdma_send_wqe, ah, 48, 4);
	FIELD(virtio_rdma_send_wqe, remote_qpn, 52, 4);
	FIELD(virtio_rdma_send_wqe, remote_qkey, 56, 4);
	FIELD(virtio_rdma_send_wqe, reserved2, 60, 4);
	VALUE(VIRTIO_RDMA_SEND_FENCE, 1);
	VALUE(VIRTIO_RDMA_SEND_SIGNALED, 2);
	VALUE(VIRTIO_RDMA_SEND_SOLICITED, 4);
	VALUE(VIRTIO_RDMA_SEND_INLINE, 8);
	/* Fast registration: the opcodes are ibv's and Linux's; REG_MR's overlay of the header. */
	VALUE(VIRTIO_RDMA_WR_LOCAL_INV, 7);
	VALUE(VIRTIO_RDMA_WR_SEND_WITH_INV, 9);
	VALUE(VIRTIO_RDMA_WR_REG_MR, 0x20);
	VALUE(VIRTIO_RDMA_FAST_REG_MAX_PAGE_SHIFT, 21);
	SIZE(virtio_rdma_reg_mr_wqe, 64);
	FIELD(virtio_rdma_reg_mr_wqe, wr_id, 0, 8);
	FIELD(virtio_rdma_reg_mr_wqe, opcode, 8, 1);
	FIELD(virtio_rdma_reg_mr_wqe, flags, 9, 1);
	FIELD(virtio_rdma_reg_mr_wqe, num_sge, 10, 1);
	FIELD(virtio_rdma_reg_mr_wqe, key, 12, 4);
	FIELD(virtio_rdma_reg_mr_wqe, iova, 16, 8);
	FIELD(virtio_rdma_reg_mr_wqe, mr, 24, 4);
	FIELD(virtio_rdma_reg_mr_wqe, access, 28, 4);
	FIELD(virtio_rdma_reg_mr_wqe, length, 32, 8);
	FIELD(virtio_rdma_reg_mr_wqe, pages_gpa, 40, 8);
	FIELD(virtio_rdma_reg_mr_wqe, npages, 48, 4);
	FIELD(virtio_rdma_reg_mr_wqe, page_shift, 52, 4);
	FIELD(virtio_rdma_reg_mr_wqe, reserved2, 56, 8);

	SIZE(virtio_rdma_sge, 16);
	FIELD(virtio_rdma_sge, addr, 0, 8);
	FIELD(virtio_rdma_sge, length, 8, 4);
	FIELD(virtio_rdma_sge, lkey, 12, 4);

	SIZE(virtio_rdma_recv_wqe, 16);
	FIELD(virtio_rdma_recv_wqe, wr_id, 0, 8);
	FIELD(virtio_rdma_recv_wqe, num_sge, 8, 4);
	FIELD(virtio_rdma_recv_wqe, reserved, 12, 4);
	VALUE(VIRTIO_RDMA_SEND_WQE_SIZE, 64);
	VALUE(VIRTIO_RDMA_RECV_WQE_SIZE, 16);
	VALUE(VIRTIO_RDMA_SGE_SIZE, 16);

	/* bit_ceil(64 + max(16 * max_sge, max_inline)) and bit_ceil(16 + 16 * max_sge). */
	check("virtio_rdma_send_stride(1, 0)", virtio_rdma_send_stride(1, 0), 128);
	check("virtio_rdma_send_stride(4, 0)", virtio_rdma_send_stride(4, 0), 128);
	check("virtio_rdma_send_stride(5, 0)", virtio_rdma_send_stride(5, 0), 256);
	check("virtio_rdma_send_stride(1, 64)", virtio_rdma_send_stride(1, 64), 128);
	check("virtio_rdma_send_stride(1, 65)", virtio_rdma_send_stride(1, 65), 256);
	check("virtio_rdma_send_stride(30, 400)", virtio_rdma_send_stride(30, 400), 1024);
	check("virtio_rdma_recv_stride(0)", virtio_rdma_recv_stride(0), 16);
	check("virtio_rdma_recv_stride(1)", virtio_rdma_recv_stride(1), 32);
	check("virtio_rdma_recv_stride(3)", virtio_rdma_recv_stride(3), 64);
	check("virtio_rdma_recv_stride(4)", virtio_rdma_recv_stride(4), 128);
	check("virtio_rdma_pow2_at_least(0)", virtio_rdma_pow2_at_least(0), 1);
	check("virtio_rdma_pow2_at_least(1)", virtio_rdma_pow2_at_least(1), 1);
	check("virtio_rdma_pow2_at_least(3)", virtio_rdma_pow2_at_least(3), 4);
	check("virtio_rdma_pow2_at_least(4096)", virtio_rdma_pow2_at_least(4096), 4096);
	check("virtio_rdma_pow2_at_least(4097)", virtio_rdma_pow2_at_least(4097), 8192);
	check("virtio_rdma_pow2_at_least(2^31)", virtio_rdma_pow2_at_least(0x80000000u), 0x80000000u);
	check("virtio_rdma_pow2_at_least(2^31 + 1)", virtio_rdma_pow2_at_least(0x80000001u), 0);
}

static void check_doorbells_events_state(void)
{
	VALUE(VIRTIO_RDMA_DB_SQ, 1);
	VALUE(VIRTIO_RDMA_DB_RQ, 2);
	VALUE(VIRTIO_RDMA_DB_SRQ, 3);
	VALUE(VIRTIO_RDMA_DB_CQ_ARM, 4);
	SIZE(virtio_rdma_doorbell, 16);
	FIELD(virtio_rdma_doorbell, handle, 0, 4);
	FIELD(virtio_rdma_doorbell, kind, 4, 2);
	FIELD(virtio_rdma_doorbell, reserved, 6, 2);
	FIELD(virtio_rdma_doorbell, value, 8, 4);
	FIELD(virtio_rdma_doorbell, reserved2, 12, 4);
	SIZE(virtio_rdma_create_db_ring_req, 16);
	FIELD(virtio_rdma_create_db_ring_req, gpa, 0, 8);
	FIELD(virtio_rdma_create_db_ring_req, depth, 8, 4);
	FIELD(virtio_rdma_create_db_ring_req, reserved, 12, 4);
	SIZE(virtio_rdma_db_ring_hdr, 64);
	FIELD(virtio_rdma_db_ring_hdr, producer, 0, 4);
	FIELD(virtio_rdma_db_ring_hdr, consumed, 4, 4);
	FIELD(virtio_rdma_db_ring_hdr, flags, 8, 4);
	FIELD(virtio_rdma_db_ring_hdr, reserved, 12, 52);
	VALUE(VIRTIO_RDMA_DB_RING_NO_KICK, 1);
	VALUE(VIRTIO_RDMA_DB_RING_RECORDS_OFFSET, 64);
	VALUE(VIRTIO_RDMA_DB_RING_MIN_DEPTH, 8);
	VALUE(VIRTIO_RDMA_DB_RING_MAX_DEPTH, 4096);
	VALUE(VIRTIO_RDMA_MAX_DB_RINGS, 4096);
	check("virtio_rdma_db_ring_bytes(8)", virtio_rdma_db_ring_bytes(8), 192);
	check("virtio_rdma_db_ring_bytes(4096)", virtio_rdma_db_ring_bytes(4096), 65600);

	VALUE(VIRTIO_RDMA_EV_CQ_COMPLETION, 1);
	VALUE(VIRTIO_RDMA_EV_CQ_ERROR, 2);
	VALUE(VIRTIO_RDMA_EV_QP_FATAL, 3);
	VALUE(VIRTIO_RDMA_EV_PORT_ACTIVE, 4);
	VALUE(VIRTIO_RDMA_EV_PORT_ERROR, 5);
	VALUE(VIRTIO_RDMA_EV_DEVICE_FATAL, 6);
	VALUE(VIRTIO_RDMA_EV_STATE_AREA_SMALL, 7);
	VALUE(VIRTIO_RDMA_FATAL_OBJECTS_LOST, 1);
	VALUE(VIRTIO_RDMA_FATAL_BACKEND_RESTARTED, 2);
	SIZE(virtio_rdma_event, 16);
	FIELD(virtio_rdma_event, type, 0, 4);
	FIELD(virtio_rdma_event, handle, 4, 4);
	FIELD(virtio_rdma_event, info, 8, 4);
	FIELD(virtio_rdma_event, reserved, 12, 4);

	VALUE(VIRTIO_RDMA_STATE_AREA_MAGIC, 0x41535256);
	VALUE(VIRTIO_RDMA_MIN_STATE_AREA, 65536);
	VALUE(VIRTIO_RDMA_MAX_STATE_AREA, 67108864);
	VALUE(VIRTIO_RDMA_STATE_AREA_STATE, 1);
	VALUE(VIRTIO_RDMA_STATE_AREA_TOO_SMALL, 2);
	VALUE(VIRTIO_RDMA_STATE_AREA_NOT_SAVED, 3);
	VALUE(VIRTIO_RDMA_MAX_LOST_REASON, 1024);
	VALUE(VIRTIO_RDMA_STATE_AREA_HDR_SIZE, 80);
	SIZE(virtio_rdma_state_area_hdr, 80);
	FIELD(virtio_rdma_state_area_hdr, magic, 0, 4);
	FIELD(virtio_rdma_state_area_hdr, status, 4, 4);
	FIELD(virtio_rdma_state_area_hdr, length, 8, 8);
	FIELD(virtio_rdma_state_area_hdr, need, 16, 8);
	FIELD(virtio_rdma_state_area_hdr, crc32, 24, 4);
	FIELD(virtio_rdma_state_area_hdr, state_version, 28, 4);
	FIELD(virtio_rdma_state_area_hdr, gid, 32, 16);
	FIELD(virtio_rdma_state_area_hdr, mac, 48, 6);
	FIELD(virtio_rdma_state_area_hdr, reserved, 54, 26);

	{
		/* docs/virtio-rdma.md: 4 KiB + the header, 64 B per PD/AH/SRQ, 128 B + 8 B per page
		 * per MR, 128 B + 64 B per CQE per CQ, 2 KiB + 512 B per WR + inline per QP, 64 B per
		 * doorbell ring. */
		struct virtio_rdma_state_census c = { 0 };

		check("virtio_rdma_state_area_bound(nothing)", virtio_rdma_state_area_bound(&c), 80 + 4096);
		c.pds = 1;
		c.ahs = 2;
		c.srqs = 3;
		c.mrs = 1;
		c.mr_pages = 10;
		c.cqs = 1;
		c.cqes = 16;
		c.qps = 1;
		c.send_wrs = 4;
		c.recv_wrs = 4;
		c.inline_bytes = 100;
		c.remote_rkeys = 2;
		c.db_rings = 2;
		check("virtio_rdma_state_area_bound(one of each)", virtio_rdma_state_area_bound(&c),
		      80 + 4096 + 64 * 6 + 128 + 80 + 128 + 1024 + 2048 + 4096 + 100 + 16 + 128);
	}
}

int main(void)
{
	check_identity();
	check_control();
	check_cq();
	check_qp();
	check_rings();
	check_doorbells_events_state();
	if (layout_failures != 0) {
		fprintf(stderr, "%d mismatches: the wire layout of include/vrdma/virtio_rdma.h moved\n", layout_failures);
		return 1;
	}
	printf("virtio_rdma.h: layout, constants and helpers as the contract says\n");
	return 0;
}
