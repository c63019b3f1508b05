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
#include <linux/version.h>
#include <linux/virtio.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>
#include <rdma/ib_umem.h>
#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>

#include <vrdma/virtio_rdma.h>
#include <vrdma/virtio_rdma_abi.h>

/*
 * Kernels the module builds for: Debian 12's 6.1 (tested) and Debian 13's 6.12 (it builds).
 * VRDMA_ALLOC_ORDERS: page orders below it can be allocated at once (MAX_ORDER, one past the
 * largest, until 6.4; the largest itself from 6.4, named MAX_PAGE_ORDER from 6.8).
 * create_cq takes the uverbs attribute bundle from 6.11 (its driver_udata is the udata);
 * virtio_find_vqs takes one virtqueue_info array for names and callbacks from 6.11.
 */
#ifdef MAX_PAGE_ORDER
#define VRDMA_ALLOC_ORDERS (MAX_PAGE_ORDER + 1)
#elif LINUX_VERSION_CODE >= KERNEL_VERSION(6, 4, 0)
#define VRDMA_ALLOC_ORDERS (MAX_ORDER + 1)
#else
#define VRDMA_ALLOC_ORDERS MAX_ORDER
#endif
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 11, 0)
#define VRDMA_CREATE_CQ_CTX struct uverbs_attr_bundle *ctx
#define VRDMA_CREATE_CQ_UDATA (ctx ? &ctx->driver_udata : NULL)
#else
#define VRDMA_CREATE_CQ_CTX struct ib_udata *ctx
#define VRDMA_CREATE_CQ_UDATA ctx
#endif

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
#define VRDMA_UVERBS_ABI_VERSION VIRTIO_RDMA_ABI_VERSION

/* Slots of the control command buffer (DMA-able, one command at a time). */
#define VRDMA_MAX_REQUEST 256u
#define VRDMA_MAX_RESPONSE (sizeof(struct virtio_rdma_resp_hdr) + 512u)

struct vrdma_cmd_buf {
	u8 req[VRDMA_MAX_REQUEST];
	u8 resp[VRDMA_MAX_RESPONSE];
};

/*
 * The ib_device ib_core knows the device by. A device-fatal event that lost the guest's objects
 * replaces it with a new one (vrdma_ib_reregister), so it is not part of struct vrdma_dev.
 */
struct vrdma_ibdev {
	struct ib_device ib;  /* first: ib_alloc_device() */
	struct vrdma_dev *dev;
};

struct vrdma_dev {
	struct ib_device *ib;  /* the current registration (struct vrdma_ibdev) */
	struct virtio_device *vdev;
	bool carrier;  /* found behind vhost-user-blk-pci (VIRTIO_ID_BLOCK) rather than ID 42 */

	struct virtqueue *ctrl_vq;
	struct virtqueue *event_vq;
	struct virtqueue *db_vq;
	/* The doorbell queue's notify address (physical), for processes' doorbell rings; 0: none. */
	phys_addr_t notify_pa;

	/* The doorbell queue (vrdma_ring.c): one record per chain, reclaimed as the device uses them. */
	spinlock_t db_lock;
	bool db_stopped;
	u64 doorbells;

	/*
	 * The state queue (vrdma_state.c), NULL when the device has none: the posted state area's
	 * size; areas are posted and reaped under state_lock.
	 */
	struct virtqueue *state_vq;
	struct mutex state_lock;
	bool state_stopped;
	size_t state_bytes;

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
	atomic_t objs; /* and MRs, CQs, QPs, SRQs, AHs */
	/* The device's CQ and QP handles -> objects, for events (under xa_lock). */
	struct xarray cqs;
	struct xarray qps;
	/* Kernel QPs by QP number, for the ib_wc's qp of a kernel CQ's completion (under xa_lock). */
	struct xarray kqps;
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
	/* Its doorbell ring (vrdma_dbring.c) and the notify page, or NULL: rung through the kernel. */
	struct vrdma_ring *dbr;
	struct vrdma_ring *notify;
	struct mutex dbr_lock;
	u32 dbr_number;  /* the device's, made in dbr_epoch (-1: not yet) */
	int dbr_epoch;
};

struct vrdma_pd {
	struct ib_pd ibpd;
	u32 handle;  /* the device's, non-zero */
	int epoch;   /* dev->epoch before CREATE_PD was sent */
};

/*
 * Kernel memory the device reads or writes by guest-physical address and a process maps
 * (vrdma_ring.c): physically contiguous, zeroed, page-aligned. Owned by its mmap entry: freed
 * when both the object (rdma_user_mmap_entry_remove) and every mapping have let it go, unless
 * the device may still write it (leak: a device that never answered the DESTROY).
 */
struct vrdma_ring {
	struct rdma_user_mmap_entry rdma;
	void *cpu;
	size_t size;
	u64 gpa;
	bool leak;
	bool kernel;  /* a kernel object's: no mmap entry, freed at release */
	bool io;      /* not memory: the device's notify page at gpa (vrdma_ring_io) */
};

struct vrdma_mr {
	struct ib_mr ibmr;
	struct ib_umem *umem;
	u32 handle;
	int epoch;
	/*
	 * A fast-registration region (vrdma_alloc_mr): its page list, which map_mr_sg fills and
	 * the device reads when a REG_MR WQE naming the region is rung in (physically contiguous).
	 */
	__le64 *pages;
	size_t pages_bytes;
	u32 max_pages, npages;
};

struct vrdma_cq {
	struct ib_cq ibcq;
	struct vrdma_ring *ring;
	u32 handle;
	u32 depth;
	int epoch;
	/* A kernel CQ (vrdma_kverbs.c): polled here, under lock; cons = CQEs consumed. */
	bool kernel;
	spinlock_t lock;
	u32 cons;
};

struct vrdma_srq {
	struct ib_srq ibsrq;
	struct vrdma_ring *ring;  /* ring, status block, doorbell record */
	u32 handle;
	int epoch;
	u32 depth, stride, max_sge;
	u32 status_off, db_off;
	u32 rung;
	struct mutex db_mutex;
};

struct vrdma_ah {
	struct ib_ah ibah;
	u32 handle;
	int epoch;
	/* A kernel AH (vrdma_kverbs.c): no device object; its address vector goes in each WQE. */
	bool kernel;
	struct virtio_rdma_ah av;
};

struct vrdma_qp {
	struct ib_qp ibqp;
	struct vrdma_ring *ring;  /* SQ, RQ, status block, doorbell record */
	u32 handle;
	int epoch;
	u32 sq_depth, rq_depth, sq_stride, rq_stride;
	u32 max_send_sge, max_recv_sge, max_inline;
	u32 sq_off, rq_off, status_off, db_off;
	u32 sq_rung, rq_rung;  /* the producer indexes last sent to the device */
	bool sq_sig_all;
	u8 sgid_index;         /* the guest's GID index the QP was given (the device's GID 0) */
	struct mutex db_mutex; /* one doorbell reader at a time per QP */
	/* A kernel QP (vrdma_kverbs.c): WQEs written here, producers under the ring's lock. */
	bool kernel;
	spinlock_t sq_lock, rq_lock;
	u32 sq_prod, rq_prod;
};

static inline struct vrdma_dev *to_vdev(struct ib_device *ib)
{
	return container_of(ib, struct vrdma_ibdev, ib)->dev;
}

static inline struct vrdma_pd *to_vpd(struct ib_pd *pd)
{
	return container_of(pd, struct vrdma_pd, ibpd);
}

static inline struct vrdma_cq *to_vcq(struct ib_cq *cq)
{
	return container_of(cq, struct vrdma_cq, ibcq);
}

static inline struct vrdma_qp *to_vqp(struct ib_qp *qp)
{
	return container_of(qp, struct vrdma_qp, ibqp);
}

/*
 * True when an object made in `epoch` is still the device's: after a device-fatal event its
 * handle may name another object, so it is never sent again.
 */
static inline bool vrdma_live(struct vrdma_dev *dev, int epoch)
{
	return epoch == atomic_read(&dev->epoch);
}

/* vrdma_cmd.c */
int vrdma_cmd_init(struct vrdma_dev *dev);
void vrdma_cmd_free(struct vrdma_dev *dev);
void vrdma_ctrl_done(struct virtqueue *vq);
int vrdma_cmd(struct vrdma_dev *dev, u32 cmd, const void *req, size_t req_len, void *resp, size_t resp_len);
int vrdma_cmd_create(struct vrdma_dev *dev, u32 cmd, const void *req, size_t req_len, void *resp, size_t resp_len,
		     u32 *handle);
int vrdma_file(struct vrdma_dev *dev, struct xarray *table, u32 cmd, u32 handle, void *obj, int epoch);
void vrdma_undo_create(struct vrdma_dev *dev, struct xarray *table, void *obj, u32 destroy_cmd, u32 handle, int epoch,
		       struct vrdma_ring **ring);

/* The control queue was given up: the device may still hold (and use) what it was last given. */
static inline bool vrdma_cmd_lost(struct vrdma_dev *dev)
{
	return READ_ONCE(dev->cmd_dead);
}

/* vrdma_event.c */
void vrdma_event_done(struct virtqueue *vq);
int vrdma_state_start(struct vrdma_dev *dev);
void vrdma_state_grow(struct vrdma_dev *dev, u32 kib);
void vrdma_state_free(struct vrdma_dev *dev);
int vrdma_events_start(struct vrdma_dev *dev);
void vrdma_events_stop(struct vrdma_dev *dev);
void vrdma_events_free(struct vrdma_dev *dev);

/* vrdma_ib.c */
struct ib_device *vrdma_ib_alloc(struct vrdma_dev *dev);
int vrdma_ib_register(struct vrdma_dev *dev);
void vrdma_ib_unregister(struct vrdma_dev *dev);
void vrdma_ib_reregister(struct vrdma_dev *dev);

/* vrdma_ring.c: ring memory and its mmap, the doorbell queue */
/* uc NULL: a kernel object's ring (no mmap entry). */
struct vrdma_ring *vrdma_ring_alloc(struct ib_ucontext *uc, size_t size);
void vrdma_ring_release(struct vrdma_ring *ring, bool device_may_write);
/* The device's notify page at `pa` mapped into a process (uncached, one page). */
struct vrdma_ring *vrdma_ring_io(struct ib_ucontext *uc, phys_addr_t pa);
int vrdma_mmap(struct ib_ucontext *uc, struct vm_area_struct *vma);
void vrdma_mmap_free(struct rdma_user_mmap_entry *entry);
int vrdma_doorbell(struct vrdma_dev *dev, u32 handle, u16 kind, u32 value, gfp_t gfp);
int vrdma_ring_producer(struct vrdma_dev *dev, u32 handle, u16 kind, u32 prod, u32 consumed, u32 depth, u32 *rung);
void vrdma_doorbells_init(struct vrdma_dev *dev);
void vrdma_doorbells_reclaim(struct vrdma_dev *dev, bool device_reset);

/* vrdma_dbring.c: processes' doorbell rings */
void vrdma_find_notify(struct vrdma_dev *dev);
int vrdma_uctx_db_ring(struct vrdma_dev *dev, struct vrdma_ucontext *uc, int epoch, u32 *number);
void vrdma_uctx_db_ring_init(struct vrdma_dev *dev, struct vrdma_ucontext *uc, struct virtio_rdma_abi_ucontext_resp *r);
void vrdma_uctx_db_ring_free(struct vrdma_dev *dev, struct vrdma_ucontext *uc);

/* vrdma_mr.c */
struct ib_mr *vrdma_get_dma_mr(struct ib_pd *pd, int access);
struct ib_mr *vrdma_alloc_mr(struct ib_pd *pd, enum ib_mr_type type, u32 max_num_sg);
int vrdma_map_mr_sg(struct ib_mr *ibmr, struct scatterlist *sg, int sg_nents, unsigned int *sg_offset);
struct ib_mr *vrdma_reg_user_mr(struct ib_pd *pd, u64 start, u64 length, u64 iova, int access, struct ib_udata *udata);
int vrdma_dereg_mr(struct ib_mr *mr, struct ib_udata *udata);

/* vrdma_cq.c */
int vrdma_create_cq(struct ib_cq *cq, const struct ib_cq_init_attr *attr, VRDMA_CREATE_CQ_CTX);
int vrdma_destroy_cq(struct ib_cq *cq, struct ib_udata *udata);
int vrdma_poll_cq(struct ib_cq *cq, int n, struct ib_wc *wc);
int vrdma_req_notify_cq(struct ib_cq *cq, enum ib_cq_notify_flags flags);
void vrdma_cq_event(struct vrdma_dev *dev, u32 handle, bool error);

/* vrdma_kverbs.c: the kernel's own CQs, QPs and AHs (what ib_mad, ib_cm and kernel ULPs use) */
int vrdma_kernel_poll_cq(struct vrdma_dev *dev, struct vrdma_cq *cq, int n, struct ib_wc *wc);
bool vrdma_kernel_cq_has_cqe(struct vrdma_cq *cq);
int vrdma_kernel_post_send(struct vrdma_dev *dev, struct vrdma_qp *qp, const struct ib_send_wr *wr,
			   const struct ib_send_wr **bad);
int vrdma_kernel_post_recv(struct vrdma_dev *dev, struct vrdma_qp *qp, const struct ib_recv_wr *wr,
			   const struct ib_recv_wr **bad);
int vrdma_create_ah(struct ib_ah *ah, struct rdma_ah_init_attr *attr, struct ib_udata *udata);

/* vrdma_qp.c */
int vrdma_create_qp(struct ib_qp *qp, struct ib_qp_init_attr *attr, struct ib_udata *udata);
int vrdma_modify_qp(struct ib_qp *qp, struct ib_qp_attr *attr, int mask, struct ib_udata *udata);
int vrdma_query_qp(struct ib_qp *qp, struct ib_qp_attr *attr, int mask, struct ib_qp_init_attr *init);
int vrdma_destroy_qp(struct ib_qp *qp, struct ib_udata *udata);
int vrdma_post_send(struct ib_qp *qp, const struct ib_send_wr *wr, const struct ib_send_wr **bad);
int vrdma_post_recv(struct ib_qp *qp, const struct ib_recv_wr *wr, const struct ib_recv_wr **bad);
void vrdma_qp_event(struct vrdma_dev *dev, u32 handle, u32 info);
int vrdma_av_to_wire(struct vrdma_dev *dev, u32 qpn, const struct rdma_ah_attr *ah, struct virtio_rdma_ah *w);
int vrdma_create_user_ah(struct ib_ah *ah, struct rdma_ah_init_attr *attr, struct ib_udata *udata);
int vrdma_destroy_ah(struct ib_ah *ah, u32 flags);

/* vrdma_srq.c */
int vrdma_create_srq(struct ib_srq *srq, struct ib_srq_init_attr *init, struct ib_udata *udata);
int vrdma_destroy_srq(struct ib_srq *srq, struct ib_udata *udata);
int vrdma_query_srq(struct ib_srq *srq, struct ib_srq_attr *attr);
int vrdma_post_srq_recv(struct ib_srq *srq, const struct ib_recv_wr *wr, const struct ib_recv_wr **bad);

/* vrdma_netdev.c */
void vrdma_netdev_bind_now(struct vrdma_dev *dev);
int vrdma_netdev_watch_unregister(struct vrdma_dev *dev);
int vrdma_netdev_watch_address(struct vrdma_dev *dev);
void vrdma_netdev_unwatch(struct vrdma_dev *dev);

#endif /* VRDMA_KMOD_H */
