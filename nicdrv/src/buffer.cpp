#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "vrdma/common/fd.hpp"
#include "vrdma/nicdrv/device.hpp"

namespace vrdma::nicdrv {
namespace {

class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(MmapArea area) : area_(std::move(area)) {}
  std::uint8_t* data() const noexcept override { return static_cast<std::uint8_t*>(area_.data()); }
  std::size_t size() const noexcept override { return area_.size(); }

 private:
  MmapArea area_;
};

}  // namespace

Result<std::shared_ptr<Buffer>> make_host_buffer(std::size_t length) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  if (length == 0) length = 1;
  if (length > (std::size_t{1} << 40))
    return make_error(Errc::invalid_argument, "buffer of " + std::to_string(length) + " bytes is larger than 1 TiB");
  const std::size_t len = (length + page - 1) / page * page;
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return errno_error(errno, "mapping a " + std::to_string(len) + "-byte buffer");
  return std::shared_ptr<Buffer>(std::make_shared<HostBuffer>(MmapArea(p, len)));
}

}  // namespace vrdma::nicdrv
