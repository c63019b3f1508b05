// SPDX-License-Identifier: GPL-2.0
/*
 * Memory shared by the device, the driver and a process (docs/virtio-rdma.md "Rings in guest
 * memory"), and the doorbell queue ("Doorbell queue (2)").
 *
 * A ring is kernel memory: physically contiguous (one allocation, so it lies in one guest memory
 * region as the device requires), zeroed, page-aligned (the CQ ring needs 4 KiB), named to the
 * device by its guest-physical address (the driver negotiates no VIRTIO_F_ACCESS_PLATFORM, so
 * the device sees guest-physical addresses) and mapped into the process that owns the object
 * through an rdma_user_mmap_entry. The entry owns the memory: it is freed in mmap_free, after the
 * object was destroyed (the device writes it no more) and every mapping of it is gone.
 */
#include <linux/gfp.h>
#include <linux/mm.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>

#include "vrdma.h"

struct vrdma_ring *vrdma_ring_alloc(struct ib_ucontext *uc, size_t size)
{
	struct vrdma_ring *ring;
	int ret;

	size = PAGE_ALIGN(size);
	if (!size || get_order(size) >= VRDMA_ALLOC_ORDERS)
		return ERR_PTR(-EINVAL);
	ring = kzalloc(sizeof(*ring), GFP_KERNEL);
	if (!ring)
		return ERR_PTR(-ENOMEM);
	ring->cpu = alloc_pages_exact(size, GFP_KERNEL | __GFP_ZERO);
	if (!ring->cpu) {
		kfree(ring);
		return ERR_PTR(-ENOMEM);
	}
	ring->size = size;
	ring->gpa = virt_to_phys(ring->cpu);
	if (!uc) {
		ring->kernel = true;
		return ring;
	}
	ret = rdma_user_mmap_entry_insert(uc, &ring->rdma, size);
	if (ret) {
		free_pages_exact(ring->cpu, size);
		kfree(ring);
		return ERR_PTR(ret);
	}
	return ring;
}

struct vrdma_ring *vrdma_ring_io(struct ib_ucontext *uc, phys_addr_t pa)
{
	struct vrdma_ring *ring = kzalloc(sizeof(*ring), GFP_KERNEL);
	int ret;

	if (!ring)
		return ERR_PTR(-ENOMEM);
	ring->io = true;
	ring->gpa = pa;
	ring->size = PAGE_SIZE;
	ret = rdma_user_mmap_entry_insert(uc, &ring->rdma, PAGE_SIZE);
	if (ret) {
		kfree(ring);
		return ERR_PTR(ret);
	}
	return ring;
}

/*
 * The object is gone (or never was): the mmap offset stops working, and the memory goes with
 * the last mapping. device_may_write: the device did not confirm the object's end (no answer),
 * so the memory is never given back to the kernel.
 */
void vrdma_ring_release(struct vrdma_ring *ring, bool device_may_write)
{
	if (!ring)
		return;
	ring->leak = device_may_write;
	if (ring->kernel) {
		if (!ring->leak)
			free_pages_exact(ring->cpu, ring->size);
		kfree(ring);
		return;
	}
	rdma_user_mmap_entry_remove(&ring->rdma);
}

void vrdma_mmap_free(struct rdma_user_mmap_entry *entry)
{
	struct vrdma_ring *ring = container_of(entry, struct vrdma_ring, rdma);

	if (!ring->leak && !ring->io)
		free_pages_exact(ring->cpu, ring->size);
	kfree(ring);
}

int vrdma_mmap(struct ib_ucontext *uc, struct vm_area_struct *vma)
{
	struct rdma_user_mmap_entry *entry;
	struct vrdma_ring *ring;
	int ret;

	/* Checks the offset and that the length is the entry's. */
	entry = rdma_user_mmap_entry_get(uc, vma);
	if (!entry)
		return -EINVAL;
	ring = container_of(entry, struct vrdma_ring, rdma);
	/* The notify page is written, never executed. */
	if (vma->vm_end - vma->vm_start != ring->size || (ring->io && (vma->vm_flags & VM_EXEC))) {
		rdma_user_mmap_entry_put(entry);
		return -EINVAL;
	}
	/* The vma holds its own reference to the entry until it is unmapped. */
	if (ring->io)
		ret = rdma_user_mmap_io(uc, vma, ring->gpa >> PAGE_SHIFT, PAGE_SIZE, pgprot_noncached(vma->vm_page_prot),
					entry);
	else
		ret = rdma_user_mmap_io(uc, vma, virt_to_phys(ring->cpu) >> PAGE_SHIFT, ring->size, vma->vm_page_prot,
					entry);
	rdma_user_mmap_entry_put(entry);
	return ret;
}

/* ---- The doorbell queue: one readable 16-byte record per chain --------------------------------- */

void vrdma_doorbells_init(struct vrdma_dev *dev)
{
	spin_lock_init(&dev->db_lock);
}

/* Under db_lock, or after the device was reset (device_reset: every record still posted too). */
static void reclaim_locked(struct vrdma_dev *dev, bool device_reset)
{
	unsigned int len;
	void *rec;

	while ((rec = virtqueue_get_buf(dev->db_vq, &len)))
		kfree(rec);
	if (device_reset)
		while ((rec = virtqueue_detach_unused_buf(dev->db_vq)))
			kfree(rec);
}

void vrdma_doorbells_reclaim(struct vrdma_dev *dev, bool device_reset)
{
	unsigned long flags;

	spin_lock_irqsave(&dev->db_lock, flags);
	if (device_reset)
		dev->db_stopped = true;
	reclaim_locked(dev, device_reset);
	spin_unlock_irqrestore(&dev->db_lock, flags);
}

/*
 * Sends one doorbell record. The device answers nothing: it checks the record (handle, kind,
 * the producer against the ring) and logs what it refuses. -EAGAIN when the queue is full of
 * records the device has not taken yet.
 */
int vrdma_doorbell(struct vrdma_dev *dev, u32 handle, u16 kind, u32 value, gfp_t gfp)
{
	struct virtio_rdma_doorbell *db;
	struct scatterlist sg;
	unsigned long flags;
	int ret;

	db = kzalloc(sizeof(*db), gfp);
	if (!db)
		return -ENOMEM;
	db->handle = cpu_to_le32(handle);
	db->kind = cpu_to_le16(kind);
	db->value = cpu_to_le32(value);
	sg_init_one(&sg, db, sizeof(*db));
	spin_lock_irqsave(&dev->db_lock, flags);
	if (dev->db_stopped) {
		ret = -EIO;
	} else {
		reclaim_locked(dev, false);
		ret = virtqueue_add_outbuf(dev->db_vq, &sg, 1, db, GFP_ATOMIC);
		if (ret == -ENOSPC)
			ret = -EAGAIN;
		if (!ret) {
			dev->doorbells++;
			virtqueue_kick(dev->db_vq);
		}
	}
	spin_unlock_irqrestore(&dev->db_lock, flags);
	if (ret)
		kfree(db);
	return ret;
}

/*
 * Rings a work ring from a process's producer index `prod` (its word: checked here). The index
 * must not be more than the ring's depth ahead of what the device consumed (`consumed`, from the
 * status block) nor of what was rung last (`*rung`); an index that did not move rings nothing.
 * Caller serialises per ring.
 */
int vrdma_ring_producer(struct vrdma_dev *dev, u32 handle, u16 kind, u32 prod, u32 consumed, u32 depth, u32 *rung)
{
	int ret;

	if (prod == *rung)
		return 0;
	if (prod - *rung > depth || prod - consumed > depth) {
		dev_dbg(&dev->vdev->dev, "handle %u: producer %u (rung %u, device consumed %u, depth %u) refused\n",
			handle, prod, *rung, consumed, depth);
		return -EINVAL;
	}
	ret = vrdma_doorbell(dev, handle, kind, prod, GFP_KERNEL);
	if (!ret)
		*rung = prod;
	return ret;
}
