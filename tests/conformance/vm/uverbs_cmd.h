/*
 * One uverbs write() command (<rdma/ib_user_verbs.h>), as libibverbs issues them below its
 * provider: the header, then the request; the response (core, then driver) lands where the
 * request's `response` field points. Returns 0, or the errno the kernel answered with.
 * Shared by the kernel-driver guest's programs (uverbs_probe.c, uverbs_data.c).
 */
#ifndef VRDMA_TEST_UVERBS_CMD_H
#define VRDMA_TEST_UVERBS_CMD_H

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include <rdma/ib_user_verbs.h>

static int uverbs_command(int fd, __u32 cmd, const void *req, size_t req_len, size_t resp_len)
{
	char buf[512];
	struct ib_uverbs_cmd_hdr hdr = {
		.command = cmd,
		.in_words = (__u16)((sizeof(hdr) + req_len) / 4),
		.out_words = (__u16)(resp_len / 4),
	};

	if (req_len > sizeof(buf) - sizeof(hdr))
		return EINVAL;
	memcpy(buf, &hdr, sizeof(hdr));
	memcpy(buf + sizeof(hdr), req, req_len);
	if (write(fd, buf, sizeof(hdr) + req_len) != (ssize_t)(sizeof(hdr) + req_len))
		return errno ? errno : EIO;
	return 0;
}

#endif
