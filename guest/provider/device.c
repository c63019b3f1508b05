// SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
/*
 * libvrdma: the rdma-core (libibverbs) provider of virtio_rdma.ko's devices (docs/virtio-rdma.md
 * "The rdma-core provider"). Control verbs are the uverbs write() commands (ibv_cmd_*) with the
 * driver's udata (guest/include/vrdma/virtio_rdma_abi.h); the data path is the device's rings
 * (include/vrdma/virtio_rdma.h), which the kernel allocates and this library maps (objects.c,
 * post.c, cq.c, wr.c; vrdma.h says which file does what). Every value the kernel answers in
 * udata is checked before use.
 *
 * This file: the device (matched by name, "vrdma*": the module registers RDMA_DRIVER_UNKNOWN),
 * the context, device and port queries, PD, MR, AH, and the ops table.
 */
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

#include "vrdma.h"

struct vrdma_device {
	struct verbs_device ibv_dev;
};

/* The uverbs core responses followed by the driver's (no padding between: asserted). */
struct vrdma_get_context_resp {
	struct ib_uverbs_get_context_resp ibv_resp;
	struct virtio_rdma_abi_ucontext_resp drv;
};
struct vrdma_create_ah_resp {
	struct ib_uverbs_create_ah_resp ibv_resp;
	struct virtio_rdma_abi_create_ah_resp drv;
};
_Static_assert(offsetof(struct vrdma_get_context_resp, drv) == sizeof(struct ib_uverbs_get_context_resp),
	       "vrdma_get_context_resp has no padding");
_Static_assert(offsetof(struct vrdma_create_ah_resp, drv) == sizeof(struct ib_uverbs_create_ah_resp),
	       "vrdma_create_ah_resp has no padding");

void vrdma_warn(struct ibv_context *ctx, const char *what)
{
	verbs_err(verbs_get_ctx(ctx), "vrdma: %s\n", what);
}

/* ---- Device and port ----------------------------------------------------------------------- */

static int vrdma_query_device(struct ibv_context *ctx, const struct ibv_query_device_ex_input *input,
			      struct ibv_device_attr_ex *attr, size_t attr_size)
{
	struct ib_uverbs_ex_query_device_resp resp;
	size_t resp_size = sizeof(resp);

	return ibv_cmd_query_device_any(ctx, input, attr, attr_size, &resp, &resp_size);
}

static int vrdma_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	struct ibv_query_port cmd;

	return ibv_cmd_query_port(ctx, port, attr, &cmd, sizeof(cmd));
}

/* ---- PD, MR --------------------------------------------------------------------------------- */

static struct ibv_pd *vrdma_alloc_pd(struct ibv_context *ctx)
{
	struct ibv_alloc_pd cmd;
	struct ib_uverbs_alloc_pd_resp resp;
	struct ibv_pd *pd = calloc(1, sizeof(*pd));

	if (!pd)
		return NULL;
	if (ibv_cmd_alloc_pd(ctx, pd, &cmd, sizeof(cmd), &resp, sizeof(resp))) {
		free(pd);
		return NULL;
	}
	return pd;
}

static int vrdma_dealloc_pd(struct ibv_pd *pd)
{
	int ret = ibv_cmd_dealloc_pd(pd);

	if (!ret)
		free(pd);
	return ret;
}

static struct ibv_mr *vrdma_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t hca_va, int access)
{
	struct ibv_reg_mr cmd;
	struct ib_uverbs_reg_mr_resp resp;
	struct verbs_mr *vmr = calloc(1, sizeof(*vmr));

	if (!vmr)
		return NULL;
	if (ibv_cmd_reg_mr(pd, addr, length, hca_va, access, vmr, &cmd, sizeof(cmd), &resp, sizeof(resp))) {
		free(vmr);
		return NULL;
	}
	return &vmr->ibv_mr;
}

static int vrdma_dereg_mr(struct verbs_mr *vmr)
{
	int ret = ibv_cmd_dereg_mr(vmr);

	if (!ret)
		free(vmr);
	return ret;
}

/* ---- AH ------------------------------------------------------------------------------------- */

static struct ibv_ah *vrdma_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	struct vrdma_create_ah_resp resp;
	struct vrdma_ah *ah = calloc(1, sizeof(*ah));

	if (!ah)
		return NULL;
	memset(&resp, 0, sizeof(resp));
	if (ibv_cmd_create_ah(pd, &ah->ibv_ah, attr, &resp.ibv_resp, sizeof(resp))) {
		free(ah);
		return NULL;
	}
	if (resp.drv.ah_handle == 0) {
		vrdma_warn(pd->context, "CREATE_AH answered device handle 0");
		ibv_cmd_destroy_ah(&ah->ibv_ah);
		free(ah);
		errno = EPROTO;
		return NULL;
	}
	ah->handle = resp.drv.ah_handle;
	return &ah->ibv_ah;
}

static int vrdma_destroy_ah(struct ibv_ah *ibah)
{
	int ret = ibv_cmd_destroy_ah(ibah);

	if (!ret)
		free(to_vah(ibah));
	return ret;
}

/* ---- Context and device --------------------------------------------------------------------- */

static void unmap_doorbell_ring(struct vrdma_context *ctx)
{
	if (ctx->dbr)
		munmap(ctx->dbr, ctx->lim.db_ring_mmap_size);
	if (ctx->notify_page)
		munmap(ctx->notify_page, (size_t)ctx->page_size);
	ctx->dbr = NULL;
	ctx->notify_page = NULL;
}

/*
 * The doorbell ring and notify page the kernel offered (virtio_rdma_abi.h), checked and mapped.
 * A context that cannot map them rings through the kernel: the device takes both.
 */
static void map_doorbell_ring(struct vrdma_context *ctx, const struct virtio_rdma_abi_ucontext_resp *r)
{
	uint32_t depth = r->db_ring_depth;
	void *p;

	if (depth < VIRTIO_RDMA_DB_RING_MIN_DEPTH || depth > VIRTIO_RDMA_DB_RING_MAX_DEPTH || (depth & (depth - 1)) ||
	    r->db_ring_mmap_size % ctx->page_size || r->db_ring_mmap_size < virtio_rdma_db_ring_bytes(depth) ||
	    (uint64_t)r->notify_offset + sizeof(uint16_t) > (uint64_t)ctx->page_size || r->notify_offset % 2) {
		vrdma_warn(&ctx->ibv_ctx.context, "GET_CONTEXT answered a doorbell ring that does not fit; ringing through the kernel");
		return;
	}
	p = mmap(NULL, r->db_ring_mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED, ctx->ibv_ctx.context.cmd_fd,
		 (off_t)r->db_ring_mmap_offset);
	if (p == MAP_FAILED)
		goto fail;
	ctx->dbr = p;
	p = mmap(NULL, (size_t)ctx->page_size, PROT_WRITE, MAP_SHARED, ctx->ibv_ctx.context.cmd_fd,
		 (off_t)r->notify_mmap_offset);
	if (p == MAP_FAILED)
		goto fail;
	ctx->notify_page = p;
	/* The device started the ring at the producer the header holds. */
	ctx->dbr_prod = le32toh(((struct virtio_rdma_db_ring_hdr *)(void *)ctx->dbr)->producer);
	return;
fail:
	vrdma_warn(&ctx->ibv_ctx.context, "mmap of the doorbell ring or notify page failed; ringing through the kernel");
	unmap_doorbell_ring(ctx);
}

static void vrdma_free_context(struct ibv_context *ibctx)
{
	struct vrdma_context *ctx = to_vctx(ibctx);

	unmap_doorbell_ring(ctx);

	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
}

static const struct verbs_context_ops vrdma_ctx_ops = {
	.free_context = vrdma_free_context,
	.query_device_ex = vrdma_query_device,
	.query_port = vrdma_query_port,
	.alloc_pd = vrdma_alloc_pd,
	.dealloc_pd = vrdma_dealloc_pd,
	.reg_mr = vrdma_reg_mr,
	.dereg_mr = vrdma_dereg_mr,
	.create_cq = vrdma_create_cq,
	.create_cq_ex = vrdma_create_cq_ex,
	.poll_cq = vrdma_poll_cq,
	.req_notify_cq = vrdma_req_notify_cq,
	.destroy_cq = vrdma_destroy_cq,
	.create_qp = vrdma_create_qp,
	.create_qp_ex = vrdma_create_qp_ex,
	.query_qp = vrdma_query_qp,
	.modify_qp = vrdma_modify_qp,
	.destroy_qp = vrdma_destroy_qp,
	.post_send = vrdma_post_send,
	.post_recv = vrdma_post_recv,
	.create_srq = vrdma_create_srq,
	.modify_srq = vrdma_modify_srq,
	.query_srq = vrdma_query_srq,
	.destroy_srq = vrdma_destroy_srq,
	.post_srq_recv = vrdma_post_srq_recv,
	.create_ah = vrdma_create_ah,
	.destroy_ah = vrdma_destroy_ah,
};

static struct verbs_context *vrdma_alloc_context(struct ibv_device *ibdev, int cmd_fd, void *private_data)
{
	struct vrdma_context *ctx;
	struct ibv_get_context cmd;
	struct vrdma_get_context_resp resp;

	(void)private_data;
	ctx = verbs_init_and_alloc_context(ibdev, cmd_fd, ctx, ibv_ctx, RDMA_DRIVER_UNKNOWN);
	if (!ctx)
		return NULL;
	memset(&resp, 0, sizeof(resp));
	if (ibv_cmd_get_context(&ctx->ibv_ctx, &cmd, sizeof(cmd), &resp.ibv_resp, sizeof(resp)))
		goto err;
	if (resp.drv.abi_version != VIRTIO_RDMA_ABI_VERSION) {
		verbs_err(&ctx->ibv_ctx, "vrdma: the kernel driver speaks ABI %u, this provider %u\n",
			  resp.drv.abi_version, VIRTIO_RDMA_ABI_VERSION);
		errno = EPROTO;
		goto err;
	}
	if (!resp.drv.max_qp_wr || !resp.drv.max_cqe || !resp.drv.max_sge || resp.drv.max_sge > 255) {
		verbs_err(&ctx->ibv_ctx, "vrdma: GET_CONTEXT answered limits no ring can have\n");
		errno = EPROTO;
		goto err;
	}
	ctx->lim = resp.drv;
	ctx->page_size = sysconf(_SC_PAGESIZE);
	pthread_spin_init(&ctx->dbr_lock, PTHREAD_PROCESS_PRIVATE);
	if (resp.drv.flags & VIRTIO_RDMA_ABI_UCTX_DB_RING)
		map_doorbell_ring(ctx, &resp.drv);
	verbs_set_ops(&ctx->ibv_ctx, &vrdma_ctx_ops);
	return &ctx->ibv_ctx;

err:
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
	return NULL;
}

static struct verbs_device *vrdma_device_alloc(struct verbs_sysfs_dev *sysfs_dev)
{
	struct vrdma_device *dev = calloc(1, sizeof(*dev));

	(void)sysfs_dev;
	return dev ? &dev->ibv_dev : NULL;
}

static void vrdma_uninit_device(struct verbs_device *verbs_device)
{
	free(container_of(verbs_device, struct vrdma_device, ibv_dev));
}

static const struct verbs_match_ent vrdma_match[] = {
	VERBS_NAME_MATCH("vrdma", NULL),
	{},
};

static const struct verbs_device_ops vrdma_dev_ops = {
	.name = "vrdma",
	.match_min_abi_version = VIRTIO_RDMA_ABI_VERSION,
	.match_max_abi_version = VIRTIO_RDMA_ABI_VERSION,
	.match_table = vrdma_match,
	.alloc_device = vrdma_device_alloc,
	.uninit_device = vrdma_uninit_device,
	.alloc_context = vrdma_alloc_context,
};
PROVIDER_DRIVER(vrdma, vrdma_dev_ops);
