/* SPDX-License-Identifier: GPL-2.0 */
/*
 * virtio_rdma.ko's private header: the device (one per virtio function), the control-queue call
 * and the RDMA objects made so far. The wire formats are the device contract,
 * include/vrdma/virtio_rdma.h (docs/virtio-rdma.md); nothing here is seen by user space.
 */
#ifndef VRDMA_KMOD_H
#define VRDMA_KMOD_H

#include <linux/completion.h>
#include <linux/mutex.h>
#include <linux/netdevice.h>
#include <linux/notifier.h>
#include <linux/virtio.h>
#include <linux/workqueue.h>
#include <rdma/ib_verbs.h>

#include <vrdma/virtio_rdma.h>

/*
 * QUERY_PORT's link_layer as vrdmad writes it today: the engine's own enumeration
 * (nicdrv::LinkLayer: 0 InfiniBand, 1 Ethernet), not ibv_link_layer (1, 2). The contract header
 * does not name these values yet (docs/virtio-rdma.md "The guest kernel driver").
 */
#define VRDMA_WIRE_LINK_LAYER_ETHERNET 1u
/* Config.transport / DeviceAttrResp.transport values the driver serves (RoCE). */
#define VRDMA_WIRE_TRANSPORT_ROCE 1u
#define VRDMA_WIRE_TRANSPORT_SOFT_ROCE_V2 3u
/* QUERY_GID's type for RoCEv2. */
#define VRDMA_WIRE_GID_ROCE_V2 2u

/*
 * The guest's GID table (ib_core's, filled from the netdev carrying the RDMA address, as rxe's):
 * the default GID, the netdev's IPv4 and IPv6 addresses. The device itself speaks from one
 * address, its GID 0.
 */
#define VRDMA_GID_TABLE_LEN 16
/* Event buffers kept posted on the event queue. */
#define VRDMA_EVENT_BUFS 64
#define VRDMA_UVERBS_ABI_VERSION 1

/* Slots of the control command buffer (DMA-able, one command at a time). */
#define VRDMA_MAX_REQUEST 256u
#define VRDMA_MAX_RESPONSE (sizeof(struct virtio_rdma_resp_hdr) + 512u)

struct vrdma_cmd_buf {
	u8 req[VRDMA_MAX_REQUEST];
	u8 resp[VRDMA_MAX_RESPONSE];
};

struct vrdma_dev {
	struct ib_device ib;  /* first: ib_alloc_device() */
	struct virtio_device *vdev;
	bool carrier;  /* found behind vhost-user-blk-pci (VIRTIO_ID_BLOCK) rather than ID 42 */

	struct virtqueue *ctrl_vq;
	struct virtqueue *event_vq;
	struct virtqueue *db_vq;     /* doorbells come with CQs and QPs */

	/* The control queue: one command in flight, under cmd_lock. */
	struct mutex cmd_lock;
	struct completion cmd_done;
	struct vrdma_cmd_buf *cmd;
	/*
	 * Set when the device did not answer in time or broke the ring: the buffer may still be
	 * the device's, so it is kept until the device is reset, and every later command fails.
	 */
	bool cmd_dead;
	u64 cmds_sent, cmds_refused;

	/* The event queue (vrdma_event.c): buffers, read in event_work under event_lock. */
	struct virtio_rdma_event *events;  /* VRDMA_EVENT_BUFS, DMA-able */
	struct mutex event_lock;
	struct work_struct event_work;
	bool events_stopped;
	u64 events_seen;
	atomic_t pds;  /* PDs the device holds for the guest: what a device-fatal event loses */
	/*
	 * Bumped by a device-fatal event. The device's handles start over after it lost the
	 * guest's objects, so a PD from an earlier epoch must never be named again: its handle may
	 * now be another PD's.
	 */
	atomic_t epoch;

	/* What the device said at probe (little-endian as on the wire). */
	struct virtio_rdma_config cfg;
	struct virtio_rdma_device_attr_resp dattr;
	struct virtio_rdma_port_attr_resp pattr;
	struct virtio_rdma_gid_resp gid0;

	/* The guest netdev carrying the RDMA address (GID 0's IPv4), under RTNL. */
	__be32 rdma_ip;
	struct net_device *ndev;
	struct notifier_block netdev_nb;
	struct notifier_block inetaddr_nb;
	struct work_struct bind_work;
	bool watching_address;
	bool registered;
};

struct vrdma_ucontext {
	struct ib_ucontext ibuc;
};

struct vrdma_pd {
	struct ib_pd ibpd;
	u32 handle;  /* the device's, non-zero */
	int epoch;   /* dev->epoch before CREATE_PD was sent */
};

/* CQs and QPs are not made yet; ib_core allocates these for its mandatory verbs. */
struct vrdma_cq {
	struct ib_cq ibcq;
};

struct vrdma_qp {
	struct ib_qp ibqp;
};

static inline struct vrdma_dev *to_vdev(struct ib_device *ib)
{
	return container_of(ib, struct vrdma_dev, ib);
}

/* vrdma_cmd.c */
int vrdma_cmd_init(struct vrdma_dev *dev);
void vrdma_cmd_free(struct vrdma_dev *dev);
void vrdma_ctrl_done(struct virtqueue *vq);
int vrdma_cmd(struct vrdma_dev *dev, u32 cmd, const void *req, size_t req_len, void *resp, size_t resp_len);

/* vrdma_event.c */
void vrdma_event_done(struct virtqueue *vq);
int vrdma_events_start(struct vrdma_dev *dev);
void vrdma_events_stop(struct vrdma_dev *dev);
void vrdma_events_free(struct vrdma_dev *dev);

/* vrdma_ib.c */
int vrdma_ib_register(struct vrdma_dev *dev);
void vrdma_ib_unregister(struct vrdma_dev *dev);

/* vrdma_netdev.c */
void vrdma_netdev_bind_now(struct vrdma_dev *dev);
int vrdma_netdev_watch_unregister(struct vrdma_dev *dev);
int vrdma_netdev_watch_address(struct vrdma_dev *dev);
void vrdma_netdev_unwatch(struct vrdma_dev *dev);

#endif /* VRDMA_KMOD_H */
