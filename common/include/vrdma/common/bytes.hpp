// Bounds-checked binary blobs of trivially copyable fields in host byte order, for versioned
// state that crosses a process boundary (QP state, virtio RDMA device state). The reader never
// reads past its input: every get() says whether the field was there.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

namespace vrdma {

class ByteWriter {
 public:
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  // A u32 length, then the bytes.
  void bytes(std::span<const std::uint8_t> b) {
    put(static_cast<std::uint32_t>(b.size()));
    out.insert(out.end(), b.begin(), b.end());
  }
  std::vector<std::uint8_t> out;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const std::uint8_t> in) : in_(in) {}
  template <class T>
  bool get(T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (in_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // What ByteWriter::bytes wrote, if its length is at most `max`.
  bool bytes(std::vector<std::uint8_t>& b, std::size_t max) {
    std::uint32_t n = 0;
    if (!get(n) || n > max || in_.size() - pos_ < n) return false;
    b.assign(in_.data() + pos_, in_.data() + pos_ + n);
    pos_ += n;
    return true;
  }
  [[nodiscard]] bool at_end() const { return pos_ == in_.size(); }

 private:
  std::span<const std::uint8_t> in_;
  std::size_t pos_ = 0;
};

}  // namespace vrdma
