// The file descriptors a vhost-user message carried (SCM_RIGHTS), taken into owners at once so
// that every error path after the recvmsg() closes them. Used by the channel (the frontend's and
// tests' blocking side) and by the backend's non-blocking connection.
#pragma once

#include <sys/socket.h>

#include <cstring>
#include <vector>

#include "vrdma/common/fd.hpp"

namespace vrdma::vhost {

inline void take_passed_fds(msghdr& mh, std::vector<UniqueFd>& into) {
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < n; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      into.emplace_back(fd);
    }
  }
}

}  // namespace vrdma::vhost
