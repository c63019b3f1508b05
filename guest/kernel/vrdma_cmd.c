// SPDX-License-Identifier: GPL-2.0
/*
 * The control queue (docs/virtio-rdma.md "Control queue (0)"): one chain per command, a readable
 * request (cmd_hdr + body) and a writable response (resp_hdr + body). The device is trusted less
 * than the kernel: the used length, the status and the message length of every answer are
 * checked before anything in it is used, and a device that does not answer cannot make the
 * driver free memory it may still write.
 */
#include <linux/errno.h>
#include <linux/jiffies.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/string.h>

#include "vrdma.h"

/* vrdmad answers within milliseconds; a TCG guest under load within a second or two. */
#define VRDMA_CMD_TIMEOUT (10 * HZ)

static const char *const cmd_names[VIRTIO_RDMA_CMD_COUNT] = {
	[VIRTIO_RDMA_CMD_QUERY_DEVICE] = "QUERY_DEVICE", [VIRTIO_RDMA_CMD_QUERY_PORT] = "QUERY_PORT",
	[VIRTIO_RDMA_CMD_QUERY_GID] = "QUERY_GID",       [VIRTIO_RDMA_CMD_CREATE_PD] = "CREATE_PD",
	[VIRTIO_RDMA_CMD_DESTROY_PD] = "DESTROY_PD",     [VIRTIO_RDMA_CMD_REG_MR] = "REG_MR",
	[VIRTIO_RDMA_CMD_DEREG_MR] = "DEREG_MR",         [VIRTIO_RDMA_CMD_CREATE_CQ] = "CREATE_CQ",
	[VIRTIO_RDMA_CMD_DESTROY_CQ] = "DESTROY_CQ",     [VIRTIO_RDMA_CMD_CREATE_QP] = "CREATE_QP",
	[VIRTIO_RDMA_CMD_MODIFY_QP] = "MODIFY_QP",       [VIRTIO_RDMA_CMD_QUERY_QP] = "QUERY_QP",
	[VIRTIO_RDMA_CMD_DESTROY_QP] = "DESTROY_QP",     [VIRTIO_RDMA_CMD_CREATE_AH] = "CREATE_AH",
	[VIRTIO_RDMA_CMD_DESTROY_AH] = "DESTROY_AH",     [VIRTIO_RDMA_CMD_CREATE_SRQ] = "CREATE_SRQ",
	[VIRTIO_RDMA_CMD_DESTROY_SRQ] = "DESTROY_SRQ",   [VIRTIO_RDMA_CMD_QUERY_CONFIG] = "QUERY_CONFIG",
	[VIRTIO_RDMA_CMD_REG_DMA_MR] = "REG_DMA_MR",     [VIRTIO_RDMA_CMD_ALLOC_MR] = "ALLOC_MR",
	[VIRTIO_RDMA_CMD_CREATE_DB_RING] = "CREATE_DB_RING", [VIRTIO_RDMA_CMD_DESTROY_DB_RING] = "DESTROY_DB_RING",
};

static const char *cmd_name(u32 cmd)
{
	return cmd < VIRTIO_RDMA_CMD_COUNT && cmd_names[cmd] ? cmd_names[cmd] : "?";
}

/* The statuses the contract defines are errno numbers; any other value is a broken answer. */
static int status_errno(u32 status)
{
	switch (status) {
	case VIRTIO_RDMA_S_PERM:
	case VIRTIO_RDMA_S_NOT_FOUND:
	case VIRTIO_RDMA_S_IO:
	case VIRTIO_RDMA_S_NO_MEMORY:
	case VIRTIO_RDMA_S_FAULT:
	case VIRTIO_RDMA_S_BUSY:
	case VIRTIO_RDMA_S_INVALID:
	case VIRTIO_RDMA_S_NO_SPACE:
	case VIRTIO_RDMA_S_NOT_SUPPORTED:
		return -(int)status;
	default:
		return -EPROTO;
	}
}

int vrdma_cmd_init(struct vrdma_dev *dev)
{
	mutex_init(&dev->cmd_lock);
	init_completion(&dev->cmd_done);
	dev->cmd = kzalloc(sizeof(*dev->cmd), GFP_KERNEL);
	return dev->cmd ? 0 : -ENOMEM;
}

/* Only after the device was reset (or never ran): it holds no buffer of ours then. */
void vrdma_cmd_free(struct vrdma_dev *dev)
{
	kfree(dev->cmd);
	dev->cmd = NULL;
}

void vrdma_ctrl_done(struct virtqueue *vq)
{
	struct vrdma_dev *dev = vq->vdev->priv;

	complete(&dev->cmd_done);
}

/*
 * Runs one command: `req_len` body bytes out, exactly `resp_len` body bytes back on success.
 * Returns 0, the device's refusal as -errno (its sentence logged), -EPROTO for an answer that
 * breaks the contract, -EIO when the device is gone or did not answer. Sleeps.
 */
int vrdma_cmd(struct vrdma_dev *dev, u32 cmd, const void *req, size_t req_len, void *resp, size_t resp_len)
{
	struct virtio_rdma_cmd_hdr *ch;
	struct virtio_rdma_resp_hdr *rh;
	struct scatterlist out, in, *sgs[2] = { &out, &in };
	unsigned int used = 0;
	void *token;
	u32 status, msg_len;
	int ret;

	if (WARN_ON(req_len > VRDMA_MAX_REQUEST - sizeof(*ch) || resp_len > VRDMA_MAX_RESPONSE - sizeof(*rh)))
		return -EINVAL;

	mutex_lock(&dev->cmd_lock);
	if (dev->cmd_dead) {
		ret = -EIO;
		goto out;
	}
	ch = (struct virtio_rdma_cmd_hdr *)dev->cmd->req;
	rh = (struct virtio_rdma_resp_hdr *)dev->cmd->resp;
	memset(dev->cmd, 0, sizeof(*dev->cmd));
	ch->cmd = cpu_to_le32(cmd);
	if (req_len)
		memcpy(dev->cmd->req + sizeof(*ch), req, req_len);
	sg_init_one(&out, dev->cmd->req, sizeof(*ch) + req_len);
	/* Room for the whole answer and for a refusal's sentence, whichever is longer. */
	sg_init_one(&in, dev->cmd->resp, VRDMA_MAX_RESPONSE);

	reinit_completion(&dev->cmd_done);
	ret = virtqueue_add_sgs(dev->ctrl_vq, sgs, 1, 1, dev->cmd, GFP_KERNEL);
	if (ret) {
		dev_err(&dev->vdev->dev, "%s: cannot post it on the control queue (%d)\n", cmd_name(cmd), ret);
		goto out;
	}
	dev->cmds_sent++;
	virtqueue_kick(dev->ctrl_vq);

	for (;;) {
		token = virtqueue_get_buf(dev->ctrl_vq, &used);
		if (token)
			break;
		if (virtqueue_is_broken(dev->ctrl_vq)) {
			dev_err(&dev->vdev->dev, "%s: the device broke the control queue\n", cmd_name(cmd));
			dev->cmd_dead = true;
			ret = -EIO;
			goto out;
		}
		if (!wait_for_completion_timeout(&dev->cmd_done, VRDMA_CMD_TIMEOUT)) {
			/* Only a stopped backend gets here (vrdmad answers in ms): the buffer stays posted. */
			token = virtqueue_get_buf(dev->ctrl_vq, &used);
			if (token)
				break;
			dev_err(&dev->vdev->dev, "%s: no answer from the device in %u s; the control queue is given up\n",
				cmd_name(cmd), VRDMA_CMD_TIMEOUT / HZ);
			dev->cmd_dead = true;
			ret = -EIO;
			goto out;
		}
	}
	if (token != dev->cmd) {  /* virtio_ring checks the id; one command is ever in flight */
		dev_err(&dev->vdev->dev, "%s: the device returned a buffer that is not the command's\n", cmd_name(cmd));
		dev->cmd_dead = true;
		ret = -EIO;
		goto out;
	}
	if (used < sizeof(*rh) || used > VRDMA_MAX_RESPONSE) {
		dev_err(&dev->vdev->dev, "%s: the device wrote %u response bytes (want %zu..%zu)\n", cmd_name(cmd),
			used, sizeof(*rh), (size_t)VRDMA_MAX_RESPONSE);
		ret = -EPROTO;
		goto out;
	}
	status = le32_to_cpu(rh->status);
	msg_len = le32_to_cpu(rh->msg_len);
	if (status != VIRTIO_RDMA_S_OK) {
		dev->cmds_refused++;
		ret = status_errno(status);
		if (msg_len > used - sizeof(*rh) || msg_len > VIRTIO_RDMA_MAX_ERROR_MESSAGE)
			msg_len = 0;  /* a sentence longer than what was written is not printed */
		/* The device's sentence, escaped: it is the device's text, not ours. */
		dev_warn_ratelimited(&dev->vdev->dev, "%s refused by the device (status %u%s): %*pE\n", cmd_name(cmd),
				     status, ret == -EPROTO ? ", not a status of the contract" : "", (int)msg_len,
				     dev->cmd->resp + sizeof(*rh));
		goto out;
	}
	if (used - sizeof(*rh) < resp_len) {
		dev_err(&dev->vdev->dev, "%s: the device answered %zu body bytes; the contract's answer has %zu\n",
			cmd_name(cmd), used - sizeof(*rh), resp_len);
		ret = -EPROTO;
		goto out;
	}
	if (resp_len)
		memcpy(resp, dev->cmd->resp + sizeof(*rh), resp_len);
	ret = 0;
out:
	mutex_unlock(&dev->cmd_lock);
	return ret;
}

/*
 * A command that creates an object: vrdma_cmd, then the new object's handle from the answer's
 * first field (every create answer starts with it), which must not be VIRTIO_RDMA_NO_HANDLE.
 * `*handle` is left alone unless the command succeeded.
 */
int vrdma_cmd_create(struct vrdma_dev *dev, u32 cmd, const void *req, size_t req_len, void *resp, size_t resp_len,
		     u32 *handle)
{
	__le32 h;
	int ret;

	if (WARN_ON(resp_len < sizeof(h)))
		return -EINVAL;
	ret = vrdma_cmd(dev, cmd, req, req_len, resp, resp_len);
	if (ret)
		return ret;
	memcpy(&h, resp, sizeof(h));
	*handle = le32_to_cpu(h);
	if (*handle == VIRTIO_RDMA_NO_HANDLE) {
		dev_err_ratelimited(&dev->vdev->dev, "%s answered handle 0 (handles are non-zero)\n", cmd_name(cmd));
		return -EPROTO;
	}
	return 0;
}

/*
 * Files a new object under its handle in one of the device's tables. A handle already there is
 * the device's mistake (handles are never reused in a session): -EPROTO. An object answered
 * around a device-fatal event, which empties the tables, is not filed: it is lost with the rest.
 */
int vrdma_file(struct vrdma_dev *dev, struct xarray *table, u32 cmd, u32 handle, void *obj, int epoch)
{
	int ret = vrdma_live(dev, epoch) ? xa_insert(table, handle, obj, GFP_KERNEL) : 0;

	/* A device-fatal event between the answer and here emptied the table: take it out again. */
	if (!ret && !vrdma_live(dev, epoch))
		xa_cmpxchg(table, handle, obj, NULL, GFP_KERNEL);
	if (ret) {
		dev_err_ratelimited(&dev->vdev->dev, "%s answered handle %u, which names another object\n", cmd_name(cmd),
				    handle);
		return -EPROTO;
	}
	return 0;
}

/*
 * Undoes a create that failed after the ring was made: the object out of `table` (when given and
 * filed there), the device's object destroyed (when it gave a handle and still holds the guest's
 * objects), then the ring let go (kept while a device that never answered may still write it).
 */
void vrdma_undo_create(struct vrdma_dev *dev, struct xarray *table, void *obj, u32 destroy_cmd, u32 handle, int epoch,
		       struct vrdma_ring **ring)
{
	struct virtio_rdma_handle_req d = { .handle = cpu_to_le32(handle) };

	if (table && handle)
		xa_cmpxchg(table, handle, obj, NULL, GFP_KERNEL);
	if (handle && vrdma_live(dev, epoch))
		vrdma_cmd(dev, destroy_cmd, &d, sizeof(d), NULL, 0);
	vrdma_ring_release(*ring, vrdma_cmd_lost(dev));
	*ring = NULL;
}
