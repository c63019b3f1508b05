// Move-only owners for file descriptors and mappings (STYLE.md: RAII for every fd and mmap).
#pragma once

#include <cstddef>
#include <utility>

namespace vrdma {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }
  explicit operator bool() const noexcept { return valid(); }
  int release() noexcept { return std::exchange(fd_, -1); }
  void reset(int fd = -1) noexcept;

 private:
  int fd_ = -1;
};

class MmapArea {
 public:
  MmapArea() = default;
  MmapArea(void* addr, std::size_t len) noexcept : addr_(addr), len_(len) {}
  MmapArea(MmapArea&& o) noexcept : addr_(std::exchange(o.addr_, nullptr)), len_(std::exchange(o.len_, 0)) {}
  MmapArea& operator=(MmapArea&& o) noexcept {
    if (this != &o) {
      reset();
      addr_ = std::exchange(o.addr_, nullptr);
      len_ = std::exchange(o.len_, 0);
    }
    return *this;
  }
  MmapArea(const MmapArea&) = delete;
  MmapArea& operator=(const MmapArea&) = delete;
  ~MmapArea() { reset(); }

  [[nodiscard]] void* data() const noexcept { return addr_; }
  [[nodiscard]] std::size_t size() const noexcept { return len_; }
  void reset() noexcept;

 private:
  void* addr_ = nullptr;
  std::size_t len_ = 0;
};

}  // namespace vrdma
