// SPDX-License-Identifier: GPL-2.0
/*
 * The state area (docs/virtio-rdma.md "State in guest memory"): one writable chain kept posted on
 * the state queue (3), into which the device writes the guest's RDMA objects when a live
 * migration stops it; QEMU carries it to the destination with the rest of guest memory, where
 * the next device takes the objects from it. Without an area a moved guest's objects are lost.
 *
 * The area is zeroed memory, the size asked rounded to pages, in power-of-two chunks of up to
 * 4 MiB (smaller when memory is fragmented), one descriptor each, at most VRDMA_STATE_MAX_CHUNKS.
 * The driver posts VRDMA_STATE_AREA_FIRST at probe and a larger area when the device asks (the
 * state_area_small event, from the event work); the device then hands the previous one back
 * (used length 0), which is freed when the next area is posted or at remove. The driver never
 * reads an area: what the device writes there is for the device on the other side.
 */
#include <linux/gfp.h>
#include <linux/log2.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/virtio.h>

#include "vrdma.h"

#define VRDMA_STATE_AREA_FIRST (1u << 20)  /* ib_mad's QP1 alone takes ~790 KiB of the device's bound */
#define VRDMA_STATE_MAX_CHUNKS 256u
/* 4 MiB chunks at most (VRDMA_ALLOC_ORDERS: vrdma.h). */
#define VRDMA_STATE_MAX_ORDER min_t(unsigned int, VRDMA_ALLOC_ORDERS - 1, 10)

struct vrdma_state_area {
	size_t bytes;
	unsigned int n;
	struct {
		struct page *page;
		unsigned int order;
	} chunk[VRDMA_STATE_MAX_CHUNKS];
};

static void area_free(struct vrdma_state_area *a)
{
	unsigned int i;

	for (i = 0; i < a->n; i++)
		__free_pages(a->chunk[i].page, a->chunk[i].order);
	kfree(a);
}

/* At least `bytes` (page-rounded) of zeroed memory; NULL when it cannot be had. */
static struct vrdma_state_area *area_alloc(size_t bytes)
{
	struct vrdma_state_area *a = kzalloc(sizeof(*a), GFP_KERNEL);
	size_t left = PAGE_ALIGN(bytes);
	unsigned int order = VRDMA_STATE_MAX_ORDER;

	if (!a)
		return NULL;
	while (left) {
		struct page *p;

		/* The largest power of two of pages not above what is left: no rounding up. */
		order = min_t(unsigned int, order, ilog2(left >> PAGE_SHIFT));
		if (a->n == VRDMA_STATE_MAX_CHUNKS)
			goto fail;
		p = alloc_pages(GFP_KERNEL | __GFP_ZERO | __GFP_NOWARN | (order ? __GFP_NORETRY : 0), order);
		if (!p) {
			if (!order)
				goto fail;
			order--;
			continue;
		}
		a->chunk[a->n].page = p;
		a->chunk[a->n].order = order;
		a->n++;
		a->bytes += PAGE_SIZE << order;
		left -= min_t(size_t, left, PAGE_SIZE << order);
	}
	return a;
fail:
	area_free(a);
	return NULL;
}

/* Areas the device handed back. Under state_lock. */
static void reap(struct vrdma_dev *dev)
{
	struct vrdma_state_area *a;
	unsigned int len;

	while ((a = virtqueue_get_buf(dev->state_vq, &len)))
		area_free(a);
}

/* Posts an area of at least `bytes`; the device keeps the newest and returns the one before. */
static int post_area(struct vrdma_dev *dev, size_t bytes)
{
	struct device *d = &dev->vdev->dev;
	struct vrdma_state_area *a;
	struct scatterlist *sg;
	unsigned int i;
	int ret;

	bytes = clamp_t(size_t, bytes, VIRTIO_RDMA_MIN_STATE_AREA, VIRTIO_RDMA_MAX_STATE_AREA);
	a = area_alloc(bytes);
	if (!a) {
		dev_err(d, "state area: cannot allocate %zu KiB; a live migration of this guest will lose its RDMA objects\n",
			bytes >> 10);
		return -ENOMEM;
	}
	if (a->bytes > VIRTIO_RDMA_MAX_STATE_AREA) {  /* page rounding past the contract's bound */
		area_free(a);
		return -EINVAL;
	}
	sg = kmalloc_array(a->n, sizeof(*sg), GFP_KERNEL);
	if (!sg) {
		area_free(a);
		return -ENOMEM;
	}
	sg_init_table(sg, a->n);
	for (i = 0; i < a->n; i++)
		sg_set_page(&sg[i], a->chunk[i].page, PAGE_SIZE << a->chunk[i].order, 0);
	mutex_lock(&dev->state_lock);
	reap(dev);
	ret = dev->state_stopped ? -ESHUTDOWN : virtqueue_add_inbuf(dev->state_vq, sg, a->n, a, GFP_KERNEL);
	if (!ret) {
		virtqueue_kick(dev->state_vq);
		dev->state_bytes = a->bytes;
	}
	mutex_unlock(&dev->state_lock);
	kfree(sg);
	if (ret) {
		dev_err(d, "state area: cannot post %zu KiB in %u pieces (%d)\n", a->bytes >> 10, a->n, ret);
		area_free(a);
		return ret;
	}
	dev_dbg(d, "state area: %zu KiB posted in %u pieces\n", a->bytes >> 10, a->n);
	return 0;
}

int vrdma_state_start(struct vrdma_dev *dev)
{
	if (!dev->state_vq)
		return 0;
	return post_area(dev, VRDMA_STATE_AREA_FIRST);
}

/* The device's state_area_small event: it wants `kib` KiB (from the event work). */
void vrdma_state_grow(struct vrdma_dev *dev, u32 kib)
{
	struct device *d = &dev->vdev->dev;
	u64 want = (u64)kib << 10;

	if (!dev->state_vq) {
		dev_warn_ratelimited(d, "event: the device asks for a state area of %u KiB, but it gave no state queue\n", kib);
		return;
	}
	if (want > VIRTIO_RDMA_MAX_STATE_AREA) {
		dev_err_ratelimited(d, "event: the device asks for a state area of %u KiB, more than the contract's %u MiB; a live migration of this guest will lose its RDMA objects\n",
				    kib, VIRTIO_RDMA_MAX_STATE_AREA >> 20);
		return;
	}
	if (want <= READ_ONCE(dev->state_bytes))
		return;
	if (!post_area(dev, want))
		dev_info(d, "state area: %zu KiB posted at the device's request (%u KiB)\n", READ_ONCE(dev->state_bytes) >> 10,
			 kib);
}

/* After the device was reset: every area, posted or handed back, is ours again. */
void vrdma_state_free(struct vrdma_dev *dev)
{
	struct vrdma_state_area *a;

	if (!dev->state_vq)
		return;
	mutex_lock(&dev->state_lock);
	dev->state_stopped = true;
	reap(dev);
	while ((a = virtqueue_detach_unused_buf(dev->state_vq)))
		area_free(a);
	mutex_unlock(&dev->state_lock);
}
