// Bounds-checked binary blobs for every binary format of the project: put()/get() move trivially
// copyable fields in host byte order (state that crosses a process boundary on one host: device
// state, re-creation records, QP export, switchover frames), be()/raw() unsigned integers in
// network byte order and plain bytes (what crosses the network to other hosts: peer notices).
// The reader never reads past its input: every get() says whether the field was there.
#pragma once

#include <concepts>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

namespace vrdma {

class ByteWriter {
 public:
  // Each field in turn, as its bytes.
  template <class... T>
  void put(const T&... v) {
    static_assert((std::is_trivially_copyable_v<T> && ...));
    (out.insert(out.end(), reinterpret_cast<const std::uint8_t*>(&v), reinterpret_cast<const std::uint8_t*>(&v) + sizeof(T)),
     ...);
  }
  // A u32 length, then the bytes.
  void bytes(std::span<const std::uint8_t> b) {
    put(static_cast<std::uint32_t>(b.size()));
    out.insert(out.end(), b.begin(), b.end());
  }
  // An unsigned integer in network byte order (big-endian).
  template <std::unsigned_integral... T>
  void be(T... v) {
    (be_one(v), ...);
  }
  // The bytes as they are, no length.
  void raw(std::span<const std::uint8_t> b) { out.insert(out.end(), b.begin(), b.end()); }
  std::vector<std::uint8_t> out;

 private:
  template <std::unsigned_integral T>
  void be_one(T v) {
    for (std::size_t i = sizeof(T); i-- > 0;) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  }
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const std::uint8_t> in) : in_(in) {}
  // Each field in turn; false (and the rest left alone) at the first that is not there.
  template <class... T>
  bool get(T&... v) {
    return (get_one(v) && ...);
  }
  // What ByteWriter::bytes wrote, if its length is at most `max`.
  bool bytes(std::vector<std::uint8_t>& b, std::size_t max) {
    std::uint32_t n = 0;
    if (!get(n) || n > max || in_.size() - pos_ < n) return false;
    b.assign(in_.data() + pos_, in_.data() + pos_ + n);
    pos_ += n;
    return true;
  }
  // An unsigned integer in network byte order (big-endian).
  template <std::unsigned_integral... T>
  bool be(T&... v) {
    return (be_one(v) && ...);
  }
  // Exactly n bytes as they are (a view into the input), if that many are left.
  bool raw(std::size_t n, std::span<const std::uint8_t>& out) {
    if (in_.size() - pos_ < n) return false;
    out = in_.subspan(pos_, n);
    pos_ += n;
    return true;
  }
  [[nodiscard]] std::size_t remaining() const { return in_.size() - pos_; }
  [[nodiscard]] bool at_end() const { return pos_ == in_.size(); }

 private:
  template <class T>
  bool get_one(T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (in_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  template <std::unsigned_integral T>
  bool be_one(T& v) {
    if (in_.size() - pos_ < sizeof(T)) return false;
    T x = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) x = static_cast<T>((x << 8) | in_[pos_ + i]);
    v = x;
    pos_ += sizeof(T);
    return true;
  }
  std::span<const std::uint8_t> in_;
  std::size_t pos_ = 0;
};

}  // namespace vrdma
