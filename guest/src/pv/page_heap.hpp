// First-fit page allocator over one contiguous guest-physical range: the DMA heap of a pv
// transport (memfd RAM for vhost-user, each physically contiguous run of hugepages for pci).
// Thread-safe.
#pragma once

#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>

namespace vrdma::pv {

class PageHeap {
 public:
  void init(std::uint8_t* host, std::uint64_t gpa, std::uint64_t len) {
    host_ = host;
    gpa_ = gpa;
    len_ = len;
    free_[0] = len;
  }
  std::optional<std::uint64_t> alloc(std::uint64_t len) {
    std::lock_guard lk(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < len) continue;
      const std::uint64_t off = it->first;
      const std::uint64_t rest = it->second - len;
      free_.erase(it);
      if (rest > 0) free_[off + len] = rest;
      return off;
    }
    return std::nullopt;
  }
  void free(std::uint64_t off, std::uint64_t len) {
    std::lock_guard lk(mu_);
    auto [it, ok] = free_.emplace(off, len);
    if (!ok) return;
    if (auto next = std::next(it); next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }
  [[nodiscard]] std::uint8_t* host() const { return host_; }
  [[nodiscard]] std::uint64_t gpa() const { return gpa_; }
  [[nodiscard]] std::uint64_t size() const { return len_; }

 private:
  std::mutex mu_;
  std::uint8_t* host_ = nullptr;
  std::uint64_t gpa_ = 0, len_ = 0;
  std::map<std::uint64_t, std::uint64_t> free_;
};

}  // namespace vrdma::pv
