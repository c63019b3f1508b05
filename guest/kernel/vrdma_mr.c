// SPDX-License-Identifier: GPL-2.0
/*
 * Memory regions of user memory (docs/virtio-rdma.md "Memory registration"): ib_umem pins the
 * pages; the device is given their guest-physical addresses in a page list (REG_MR) at the
 * largest page size the region's layout allows (4 KiB .. 1 GiB, ib_umem_find_best_pgsz), and
 * registers them with its engine in place. The DMA addresses ib_umem gives are used as
 * guest-physical addresses, which they are while no IOMMU in the guest translates for the
 * function (with one, REG_MR is refused). The page list is read by the device during REG_MR
 * only, so it lives for the command. A PD's DMA MR (get_dma_mr, which ib_alloc_pd asks for a
 * kernel PD's local_dma_lkey) is the device's REG_DMA_MR ("The DMA memory region"): one key over
 * all guest memory, addressed by guest-physical (= DMA) address, local access only. Fast
 * registration ("Fast registration": ib_alloc_mr, ib_map_mr_sg, IB_WR_REG_MR, what NVMe over
 * Fabrics registers every I/O with) is ALLOC_MR and a page list per region the REG_MR WQE names.
 */
#include <linux/gfp.h>
#include <rdma/ib_umem.h>
#include <rdma/iter.h>

#include "vrdma.h"

/* The access bits the contract carries (ibv_access_flags' first four, the same in the kernel). */
#define VRDMA_MR_ACCESS (IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE | IB_ACCESS_REMOTE_READ | IB_ACCESS_REMOTE_ATOMIC)

struct ib_mr *vrdma_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length, u64 iova, int access,
				struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_pd *pd = to_vpd(ibpd);
	struct virtio_rdma_reg_mr_req req = {};
	struct virtio_rdma_reg_mr_resp resp;
	struct ib_block_iter biter;
	unsigned long pgsz;
	size_t npages, list_bytes, i = 0;
	__le64 *list;
	struct vrdma_mr *mr;
	int ret;

	if (!udata)
		return ERR_PTR(-EOPNOTSUPP);
	if (udata->inlen || udata->outlen)
		return ERR_PTR(-EINVAL);
	/* Optional bits (relaxed ordering) may be dropped; any other unknown bit is refused. */
	access &= ~IB_ACCESS_OPTIONAL;
	if (access & ~VRDMA_MR_ACCESS) {
		dev_dbg(&dev->vdev->dev, "reg_user_mr: access %#x has bits the device does not know\n", access);
		return ERR_PTR(-EOPNOTSUPP);
	}
	if (!length || length > le64_to_cpu(dev->dattr.max_mr_size) ||
	    length > le64_to_cpu(dev->cfg.max_registered_bytes))
		return ERR_PTR(-EINVAL);
	if (!vrdma_live(dev, pd->epoch))
		return ERR_PTR(-EIO);
	/*
	 * The page list must name guest-physical pages; ib_umem hands out DMA addresses of the
	 * function's PCI device, which are the same only while no IOMMU translates for it.
	 */
	if (device_iommu_mapped(ibpd->device->dma_device)) {
		dev_warn_ratelimited(&dev->vdev->dev,
				     "reg_user_mr: an IOMMU translates for this function; the device takes guest-physical page lists only\n");
		return ERR_PTR(-EOPNOTSUPP);
	}

	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr)
		return ERR_PTR(-ENOMEM);
	mr->umem = ib_umem_get(ibpd->device, start, length, access);
	if (IS_ERR(mr->umem)) {
		ret = PTR_ERR(mr->umem);
		goto err_mr;
	}
	pgsz = ib_umem_find_best_pgsz(mr->umem, GENMASK_ULL(30, 12), iova);
	if (!pgsz) {
		ret = -EINVAL;
		goto err_umem;
	}
	npages = ib_umem_num_dma_blocks(mr->umem, pgsz);
	if (npages == 0 || npages > le32_to_cpu(dev->cfg.max_mr_pages)) {
		dev_dbg(&dev->vdev->dev, "reg_user_mr: %zu pages of %lu bytes; the device takes %u\n", npages, pgsz,
			le32_to_cpu(dev->cfg.max_mr_pages));
		ret = -EINVAL;
		goto err_umem;
	}
	/* The device reads the list as one range of guest memory: one physically contiguous buffer. */
	list_bytes = npages * sizeof(*list);
	if (get_order(list_bytes) >= VRDMA_ALLOC_ORDERS) {
		ret = -EINVAL;
		goto err_umem;
	}
	list = alloc_pages_exact(list_bytes, GFP_KERNEL);
	if (!list) {
		ret = -ENOMEM;
		goto err_umem;
	}
	rdma_umem_for_each_dma_block(mr->umem, &biter, pgsz)
		list[i++] = cpu_to_le64(rdma_block_iter_dma_address(&biter));

	req.pd = cpu_to_le32(pd->handle);
	req.access = cpu_to_le32(access);
	req.iova = cpu_to_le64(iova);
	req.length = cpu_to_le64(length);
	req.pages_gpa = cpu_to_le64(virt_to_phys(list));
	req.npages = cpu_to_le32(npages);
	req.page_shift = cpu_to_le32(__ffs(pgsz));
	mr->epoch = atomic_read(&dev->epoch);
	ret = vrdma_cmd_create(dev, VIRTIO_RDMA_CMD_REG_MR, &req, sizeof(req), &resp, sizeof(resp), &mr->handle);
	/* A device that never answered may still read the list: it is not given back then. */
	if (!vrdma_cmd_lost(dev))
		free_pages_exact(list, list_bytes);
	if (ret)
		goto err_umem;
	mr->ibmr.lkey = le32_to_cpu(resp.lkey);
	mr->ibmr.rkey = le32_to_cpu(resp.rkey);
	mr->ibmr.page_size = pgsz;
	if (vrdma_live(dev, mr->epoch))
		atomic_inc(&dev->objs);
	return &mr->ibmr;

err_umem:
	ib_umem_release(mr->umem);
err_mr:
	kfree(mr);
	return ERR_PTR(ret);
}

/*
 * A region whose pages the device is told by guest-physical address (a DMA MR, a fast one):
 * refused while an IOMMU translates for the function (the DMA addresses are not guest-physical
 * then) and on a PD the device lost.
 */
static struct vrdma_mr *new_gpa_mr(struct vrdma_dev *dev, struct ib_pd *ibpd)
{
	struct vrdma_mr *mr;

	if (device_iommu_mapped(ibpd->device->dma_device))
		return ERR_PTR(-EOPNOTSUPP);
	if (!vrdma_live(dev, to_vpd(ibpd)->epoch))
		return ERR_PTR(-EIO);
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	return mr ? mr : ERR_PTR(-ENOMEM);
}

struct ib_mr *vrdma_get_dma_mr(struct ib_pd *ibpd, int access)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_pd *pd = to_vpd(ibpd);
	struct virtio_rdma_reg_dma_mr_req req = {};
	struct virtio_rdma_reg_mr_resp resp;
	struct vrdma_mr *mr;
	int ret;

	if (!(le64_to_cpu(dev->cfg.features) & VIRTIO_RDMA_FEATURE_DMA_MR))
		return ERR_PTR(-EOPNOTSUPP);
	access &= ~IB_ACCESS_OPTIONAL;
	/* Remote access to all guest memory (IB_PD_UNSAFE_GLOBAL_RKEY) is never granted. */
	if (access & ~IB_ACCESS_LOCAL_WRITE) {
		dev_warn_ratelimited(&dev->vdev->dev, "get_dma_mr: access %#x; a DMA MR is local only\n", access);
		return ERR_PTR(-EOPNOTSUPP);
	}
	mr = new_gpa_mr(dev, ibpd);
	if (IS_ERR(mr))
		return ERR_CAST(mr);
	req.pd = cpu_to_le32(pd->handle);
	req.access = cpu_to_le32(access);
	mr->epoch = atomic_read(&dev->epoch);
	ret = vrdma_cmd_create(dev, VIRTIO_RDMA_CMD_REG_DMA_MR, &req, sizeof(req), &resp, sizeof(resp), &mr->handle);
	if (ret)
		goto err;
	mr->ibmr.lkey = le32_to_cpu(resp.lkey);
	mr->ibmr.rkey = 0;
	if (vrdma_live(dev, mr->epoch))
		atomic_inc(&dev->objs);
	return &mr->ibmr;

err:
	kfree(mr);
	return ERR_PTR(ret);
}

struct ib_mr *vrdma_alloc_mr(struct ib_pd *ibpd, enum ib_mr_type type, u32 max_num_sg)
{
	struct vrdma_dev *dev = to_vdev(ibpd->device);
	struct vrdma_pd *pd = to_vpd(ibpd);
	struct virtio_rdma_alloc_mr_req req = {};
	struct virtio_rdma_reg_mr_resp resp;
	struct vrdma_mr *mr;
	int ret;

	if (type != IB_MR_TYPE_MEM_REG || !(le64_to_cpu(dev->cfg.features) & VIRTIO_RDMA_FEATURE_FAST_REG))
		return ERR_PTR(-EOPNOTSUPP);
	if (!max_num_sg || max_num_sg > le32_to_cpu(dev->cfg.max_fast_reg_pages))
		return ERR_PTR(-EINVAL);
	mr = new_gpa_mr(dev, ibpd);
	if (IS_ERR(mr))
		return ERR_CAST(mr);
	mr->max_pages = max_num_sg;
	mr->pages_bytes = max_num_sg * sizeof(*mr->pages);
	mr->pages = alloc_pages_exact(mr->pages_bytes, GFP_KERNEL | __GFP_ZERO);
	if (!mr->pages) {
		ret = -ENOMEM;
		goto err;
	}
	req.pd = cpu_to_le32(pd->handle);
	req.max_pages = cpu_to_le32(max_num_sg);
	mr->epoch = atomic_read(&dev->epoch);
	ret = vrdma_cmd_create(dev, VIRTIO_RDMA_CMD_ALLOC_MR, &req, sizeof(req), &resp, sizeof(resp), &mr->handle);
	if (ret)
		goto err_pages;
	mr->ibmr.lkey = le32_to_cpu(resp.lkey);
	mr->ibmr.rkey = le32_to_cpu(resp.rkey);
	if (vrdma_live(dev, mr->epoch))
		atomic_inc(&dev->objs);
	return &mr->ibmr;

err_pages:
	free_pages_exact(mr->pages, mr->pages_bytes);
err:
	kfree(mr);
	return ERR_PTR(ret);
}

static int vrdma_set_page(struct ib_mr *ibmr, u64 addr)
{
	struct vrdma_mr *mr = container_of(ibmr, struct vrdma_mr, ibmr);

	if (mr->npages == mr->max_pages)
		return -ENOMEM;
	mr->pages[mr->npages++] = cpu_to_le64(addr);
	return 0;
}

/* The region's next pages (ib_sg_to_pages sets iova, length and checks the page size). */
int vrdma_map_mr_sg(struct ib_mr *ibmr, struct scatterlist *sg, int sg_nents, unsigned int *sg_offset)
{
	struct vrdma_mr *mr = container_of(ibmr, struct vrdma_mr, ibmr);

	if (!mr->pages)
		return -EINVAL;
	mr->npages = 0;
	return ib_sg_to_pages(ibmr, sg, sg_nents, sg_offset, vrdma_set_page);
}

int vrdma_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata)
{
	struct vrdma_dev *dev = to_vdev(ibmr->device);
	struct vrdma_mr *mr = container_of(ibmr, struct vrdma_mr, ibmr);
	struct virtio_rdma_handle_req r = { .handle = cpu_to_le32(mr->handle) };
	if (vrdma_live(dev, mr->epoch)) {
		vrdma_cmd(dev, VIRTIO_RDMA_CMD_DEREG_MR, &r, sizeof(r), NULL, 0);
		atomic_dec(&dev->objs);
	}
	/*
	 * A device that did not answer may still move data into the pages: they stay pinned (the
	 * umem is leaked) rather than be given back to the process's allocator.
	 */
	if (!vrdma_cmd_lost(dev)) {
		ib_umem_release(mr->umem);  /* none for a DMA MR or a fast one */
		if (mr->pages)
			free_pages_exact(mr->pages, mr->pages_bytes);
	}
	kfree(mr);
	return 0;
}
