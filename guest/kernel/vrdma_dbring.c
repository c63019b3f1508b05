// SPDX-License-Identifier: GPL-2.0
/*
 * Doorbells without a system call (docs/virtio-rdma.md "Doorbell rings"): each process's
 * context gets a doorbell ring in kernel memory the process maps, made known to the device with
 * CREATE_DB_RING, and the doorbell queue's virtio notify address mapped into the process. The
 * process's CQs, QPs and SRQs are created naming that ring; the device acts on a record of the
 * ring only for them, so one process cannot ring another's objects. Offered when the device has
 * VIRTIO_RDMA_FEATURE_DB_RING and its transport is virtio-pci with a memory notify BAR.
 */
#include <linux/io.h>
#include <linux/mm.h>
#include <linux/pci.h>
#include <linux/virtio_pci.h>

#include "vrdma.h"

/* Records in a process's ring: one page with its header. */
#define VRDMA_DB_RING_DEPTH 128u

/*
 * The doorbell queue's notify address, read from the function's virtio capabilities as the
 * virtio-pci transport does (the first common and notify capabilities on a valid BAR): common
 * config says the queue's notify offset, the notify capability where that lands. Called right
 * after the queues were found, while nothing else selects queues.
 */
void vrdma_find_notify(struct vrdma_dev *dev)
{
	struct device *parent = dev->vdev->dev.parent;
	struct virtio_pci_common_cfg __iomem *common;
	u8 cbar = PCI_STD_NUM_BARS, nbar = PCI_STD_NUM_BARS;
	u32 coff = 0, clen = 0, noff = 0, nlen = 0, mult = 0;
	struct pci_dev *pdev;
	resource_size_t pa;
	u16 qoff;
	int pos;

	dev->notify_pa = 0;
	if (!(le64_to_cpu(dev->cfg.features) & VIRTIO_RDMA_FEATURE_DB_RING) || !parent || !dev_is_pci(parent))
		return;
	pdev = to_pci_dev(parent);
	for (pos = pci_find_capability(pdev, PCI_CAP_ID_VNDR); pos > 0;
	     pos = pci_find_next_capability(pdev, pos, PCI_CAP_ID_VNDR)) {
		u8 type, bar;
		u32 off, len;

		pci_read_config_byte(pdev, pos + offsetof(struct virtio_pci_cap, cfg_type), &type);
		pci_read_config_byte(pdev, pos + offsetof(struct virtio_pci_cap, bar), &bar);
		pci_read_config_dword(pdev, pos + offsetof(struct virtio_pci_cap, offset), &off);
		pci_read_config_dword(pdev, pos + offsetof(struct virtio_pci_cap, length), &len);
		if (bar >= PCI_STD_NUM_BARS || !(pci_resource_flags(pdev, bar) & IORESOURCE_MEM))
			continue;
		if (type == VIRTIO_PCI_CAP_COMMON_CFG && cbar == PCI_STD_NUM_BARS) {
			cbar = bar;
			coff = off;
			clen = len;
		} else if (type == VIRTIO_PCI_CAP_NOTIFY_CFG && nbar == PCI_STD_NUM_BARS) {
			nbar = bar;
			noff = off;
			nlen = len;
			pci_read_config_dword(pdev, pos + offsetof(struct virtio_pci_notify_cap, notify_off_multiplier),
					      &mult);
		}
	}
	if (cbar == PCI_STD_NUM_BARS || nbar == PCI_STD_NUM_BARS || clen < sizeof(*common)) {
		dev_info(&dev->vdev->dev, "no memory-mapped virtio notify area: processes ring through the kernel\n");
		return;
	}
	common = pci_iomap_range(pdev, cbar, coff, sizeof(*common));
	if (!common)
		return;
	iowrite16(VIRTIO_RDMA_DOORBELL_QUEUE, &common->queue_select);
	qoff = ioread16(&common->queue_notify_off);
	pci_iounmap(pdev, common);
	if ((u64)qoff * mult + sizeof(u16) > nlen ||
	    (u64)noff + (u64)qoff * mult + sizeof(u16) > pci_resource_len(pdev, nbar)) {
		dev_warn(&dev->vdev->dev, "the doorbell queue's notify offset %u x %u lies outside its %u-byte area\n", qoff,
			 mult, nlen);
		return;
	}
	pa = pci_resource_start(pdev, nbar) + noff + (resource_size_t)qoff * mult;
	dev->notify_pa = pa;
	dev_info(&dev->vdev->dev,
		 "doorbell rings: processes notify the doorbell queue at %pa (%s page), without a system call\n", &pa,
		 mult >= PAGE_SIZE ? "its own" : "a shared notify");
}

/*
 * The ring's device number for an object made in `epoch`: after a device-fatal event the device
 * holds no ring any more, so the context's is made again over the same memory (it starts where
 * the process's producer is). 0 (the object rings through the kernel only) when the context has
 * no ring; an error when it cannot be made again.
 */
int vrdma_uctx_db_ring(struct vrdma_dev *dev, struct vrdma_ucontext *uc, int epoch, u32 *number)
{
	struct virtio_rdma_create_db_ring_req req = {};
	struct virtio_rdma_handle_resp resp;
	int ret = 0;

	*number = 0;
	if (!uc || !uc->dbr)
		return 0;
	mutex_lock(&uc->dbr_lock);
	if (uc->dbr_epoch != epoch) {
		req.gpa = cpu_to_le64(uc->dbr->gpa);
		req.depth = cpu_to_le32(VRDMA_DB_RING_DEPTH);
		ret = vrdma_cmd_create(dev, VIRTIO_RDMA_CMD_CREATE_DB_RING, &req, sizeof(req), &resp, sizeof(resp),
				       &uc->dbr_number);
		if (!ret && uc->dbr_number > 0xffff) {
			/* CREATE_QP names a ring in 16 bits: the device broke its word. */
			dev_err_ratelimited(&dev->vdev->dev, "CREATE_DB_RING answered ring %u (at most 65535)\n",
					    uc->dbr_number);
			ret = -EPROTO;
		}
		if (!ret)
			uc->dbr_epoch = epoch;
	}
	if (!ret)
		*number = uc->dbr_number;
	mutex_unlock(&uc->dbr_lock);
	return ret;
}

/*
 * GET_CONTEXT: the ring and the notify page, when the device and the provider both have them. A
 * context that cannot have them (no memory, the device's 4,096 rings in use) rings through the
 * kernel: it is never refused for that.
 */
void vrdma_uctx_db_ring_init(struct vrdma_dev *dev, struct vrdma_ucontext *uc, struct virtio_rdma_abi_ucontext_resp *r)
{
	u32 number;
	int ret;

	if (!dev->notify_pa)
		return;
	uc->dbr = vrdma_ring_alloc(&uc->ibuc, virtio_rdma_db_ring_bytes(VRDMA_DB_RING_DEPTH));
	if (IS_ERR(uc->dbr)) {
		ret = PTR_ERR(uc->dbr);
		uc->dbr = NULL;
		goto err;
	}
	uc->notify = vrdma_ring_io(&uc->ibuc, dev->notify_pa & PAGE_MASK);
	if (IS_ERR(uc->notify)) {
		ret = PTR_ERR(uc->notify);
		uc->notify = NULL;
		goto err;
	}
	ret = vrdma_uctx_db_ring(dev, uc, atomic_read(&dev->epoch), &number);
	if (ret)
		goto err;
	r->flags |= VIRTIO_RDMA_ABI_UCTX_DB_RING;
	r->db_ring_mmap_offset = rdma_user_mmap_get_offset(&uc->dbr->rdma);
	r->db_ring_mmap_size = uc->dbr->size;
	r->db_ring_depth = VRDMA_DB_RING_DEPTH;
	r->notify_mmap_offset = rdma_user_mmap_get_offset(&uc->notify->rdma);
	r->notify_offset = offset_in_page(dev->notify_pa);
	r->notify_value = VIRTIO_RDMA_DOORBELL_QUEUE;
	return;
err:
	dev_warn_ratelimited(&dev->vdev->dev, "a process gets no doorbell ring (%d): it rings through the kernel\n", ret);
	vrdma_uctx_db_ring_free(dev, uc);
}

/* The context ends (its objects are gone): the device's ring destroyed, the memory let go. */
void vrdma_uctx_db_ring_free(struct vrdma_dev *dev, struct vrdma_ucontext *uc)
{
	struct virtio_rdma_handle_req d = { .handle = cpu_to_le32(uc->dbr_number) };
	bool may_write = false;

	if (uc->dbr && uc->dbr_epoch >= 0 && vrdma_live(dev, uc->dbr_epoch)) {
		/* The device writes the ring's header until it has answered. */
		may_write = vrdma_cmd(dev, VIRTIO_RDMA_CMD_DESTROY_DB_RING, &d, sizeof(d), NULL, 0) != 0 &&
			    vrdma_cmd_lost(dev);
	}
	vrdma_ring_release(uc->dbr, may_write);
	uc->dbr = NULL;
	vrdma_ring_release(uc->notify, false);
	uc->notify = NULL;
	uc->dbr_epoch = -1;
}
