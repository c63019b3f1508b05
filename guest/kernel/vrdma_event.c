// SPDX-License-Identifier: GPL-2.0
/*
 * The event queue (docs/virtio-rdma.md "Event queue (1)"): the driver keeps VRDMA_EVENT_BUFS
 * writable 16-byte buffers posted; the device fills one virtio_rdma_event per buffer. Events are
 * read in a work item, checked (length, type, handle), turned into ib_core events and the buffer
 * posted again. CQ and QP events go to the object's handlers (vrdma_cq_event, vrdma_qp_event);
 * one naming a handle the driver does not hold is logged.
 */
#include <linux/scatterlist.h>
#include <linux/slab.h>

#include "vrdma.h"

/* Under event_lock. */
static int post_event(struct vrdma_dev *dev, struct virtio_rdma_event *ev)
{
	struct scatterlist sg;

	memset(ev, 0, sizeof(*ev));
	sg_init_one(&sg, ev, sizeof(*ev));
	return virtqueue_add_inbuf(dev->event_vq, &sg, 1, ev, GFP_KERNEL);
}

static void dispatch(struct vrdma_dev *dev, enum ib_event_type type)
{
	struct ib_event e = { .device = dev->ib, .event = type, .element.port_num = 1 };

	if (dev->registered)
		ib_dispatch_event(&e);
}

/*
 * After a device-fatal event the device's handles start over: the CQs and QPs of the lost epoch
 * no longer answer to their handles (their destroy sends nothing: vrdma_live).
 */
static void forget_handles(struct vrdma_dev *dev)
{
	unsigned long i;
	void *obj;

	xa_for_each(&dev->cqs, i, obj)
		xa_erase(&dev->cqs, i);
	xa_for_each(&dev->qps, i, obj)
		xa_erase(&dev->qps, i);
}

static void handle(struct vrdma_dev *dev, const struct virtio_rdma_event *ev)
{
	u32 type = le32_to_cpu(ev->type), handle = le32_to_cpu(ev->handle), info = le32_to_cpu(ev->info);
	struct device *d = &dev->vdev->dev;
	int pds, objs;

	dev->events_seen++;
	switch (type) {
	case VIRTIO_RDMA_EV_PORT_ACTIVE:
		dev_info(d, "event: port 1 active\n");
		dispatch(dev, IB_EVENT_PORT_ACTIVE);
		break;
	case VIRTIO_RDMA_EV_PORT_ERROR:
		dev_warn(d, "event: port 1 error\n");
		dispatch(dev, IB_EVENT_PORT_ERR);
		break;
	case VIRTIO_RDMA_EV_DEVICE_FATAL:
		/*
		 * The device lost the guest's objects (info 1: a migration did not bring them; info 2:
		 * the backend restarted). Fatal to a driver that had objects, nothing to one that had
		 * none (the contract). ib_core's users hear IB_EVENT_DEVICE_FATAL and fail; a lost PD
		 * freed afterwards is freed in the kernel only (vrdma_dealloc_pd: the epoch).
		 */
		atomic_inc(&dev->epoch);  /* before anything is told: no lost handle is named again */
		pds = atomic_xchg(&dev->pds, 0);
		objs = atomic_xchg(&dev->objs, 0);
		forget_handles(dev);
		if (info != VIRTIO_RDMA_FATAL_OBJECTS_LOST && info != VIRTIO_RDMA_FATAL_BACKEND_RESTARTED)
			dev_warn(d, "event: device fatal with an unknown reason %u\n", info);
		if (pds == 0 && objs == 0) {
			dev_info(d, "event: device fatal (%s), and the driver held no objects: nothing was lost\n",
				 info == VIRTIO_RDMA_FATAL_OBJECTS_LOST ? "objects lost in a migration" : "backend restarted");
			break;
		}
		dev_err(d, "event: device fatal (%s): the device lost the guest's %d PDs and %d MRs, CQs, QPs, SRQs and AHs; their users are told (IB_EVENT_DEVICE_FATAL)\n",
			info == VIRTIO_RDMA_FATAL_OBJECTS_LOST ? "objects lost in a migration" : "backend restarted", pds,
			objs);
		dispatch(dev, IB_EVENT_DEVICE_FATAL);
		vrdma_ib_reregister(dev);
		break;
	case VIRTIO_RDMA_EV_CQ_COMPLETION:
		vrdma_cq_event(dev, handle, false);
		break;
	case VIRTIO_RDMA_EV_CQ_ERROR:
		dev_warn_ratelimited(d, "event: CQ %u error\n", handle);
		vrdma_cq_event(dev, handle, true);
		break;
	case VIRTIO_RDMA_EV_QP_FATAL:
		vrdma_qp_event(dev, handle, info);
		break;
	case VIRTIO_RDMA_EV_STATE_AREA_SMALL:
		vrdma_state_grow(dev, info);
		break;
	default:
		dev_warn_ratelimited(d, "event of unknown type %u (handle %u, info %u) ignored\n", type, handle, info);
		break;
	}
}

static void event_work(struct work_struct *w)
{
	struct vrdma_dev *dev = container_of(w, struct vrdma_dev, event_work);
	struct virtio_rdma_event *ev, copy;
	unsigned int len;
	bool posted = false;

	mutex_lock(&dev->event_lock);
	while (!dev->events_stopped && (ev = virtqueue_get_buf(dev->event_vq, &len))) {
		/* virtio_ring returns only tokens we posted; the length is the device's word. */
		if (len < sizeof(*ev)) {
			dev_warn_ratelimited(&dev->vdev->dev, "an event of %u bytes (want %zu) ignored\n", len, sizeof(*ev));
		} else {
			copy = *ev;
			mutex_unlock(&dev->event_lock);
			handle(dev, &copy);
			mutex_lock(&dev->event_lock);
			if (dev->events_stopped)
				break;
		}
		if (post_event(dev, ev))
			dev_warn_ratelimited(&dev->vdev->dev, "an event buffer could not be posted again\n");
		else
			posted = true;
	}
	if (posted && !dev->events_stopped)
		virtqueue_kick(dev->event_vq);
	mutex_unlock(&dev->event_lock);
}

void vrdma_event_done(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;

	schedule_work(&dev->event_work);
}

/* After virtio_device_ready: every buffer posted, one kick. */
int vrdma_events_start(struct vrdma_dev *dev)
{
	int i, ret = 0;

	mutex_init(&dev->event_lock);
	INIT_WORK(&dev->event_work, event_work);
	dev->events = kcalloc(VRDMA_EVENT_BUFS, sizeof(*dev->events), GFP_KERNEL);
	if (!dev->events)
		return -ENOMEM;
	mutex_lock(&dev->event_lock);
	for (i = 0; i < VRDMA_EVENT_BUFS && !ret; i++)
		ret = post_event(dev, &dev->events[i]);
	virtqueue_kick(dev->event_vq);
	mutex_unlock(&dev->event_lock);
	if (ret)
		dev_err(&dev->vdev->dev, "cannot post the event buffers (%d)\n", ret);
	return ret;
}

/*
 * Before ib_unregister_device (no event is handled from here on), and again after the device
 * was reset (no callback can schedule the work any more) before the queues go.
 */
void vrdma_events_stop(struct vrdma_dev *dev)
{
	if (!dev->events)
		return;
	mutex_lock(&dev->event_lock);
	dev->events_stopped = true;
	mutex_unlock(&dev->event_lock);
	cancel_work_sync(&dev->event_work);
}

/* After the device was reset and vrdma_events_stop: it holds none of the buffers any more. */
void vrdma_events_free(struct vrdma_dev *dev)
{
	kfree(dev->events);
	dev->events = NULL;
}
