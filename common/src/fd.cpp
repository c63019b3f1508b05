#include "vrdma/common/fd.hpp"

#include <sys/mman.h>
#include <unistd.h>

namespace vrdma {

void UniqueFd::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void MmapArea::reset() noexcept {
  if (addr_ != nullptr) ::munmap(addr_, len_);
  addr_ = nullptr;
  len_ = 0;
}

}  // namespace vrdma
