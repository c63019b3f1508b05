// Descriptor chains: the split-layout walker and sequential reader/writer over a chain.
#include <fmt/format.h>

#include <algorithm>

#include "ring_layout.hpp"
#include "vrdma/vhost/virtqueue.hpp"

namespace vrdma::vhost {

Status ChainReader::read(void* dst, std::uint64_t len) {
  if (len > remaining())
    return make_error(Errc::invalid_argument,
                      fmt::format("request needs {} more readable bytes than the chain holds", len - remaining()));
  auto* out = static_cast<std::uint8_t*>(dst);
  while (len > 0) {
    const DescBuf& b = c_.bufs[buf_];
    const std::uint64_t n = std::min<std::uint64_t>(b.len - off_, len);
    VRDMA_TRY(g_.read(b.gpa + off_, out, n));
    out += n;
    len -= n;
    off_ += n;
    consumed_ += n;
    if (off_ == b.len) {
      ++buf_;
      off_ = 0;
    }
  }
  return {};
}

ChainWriter::ChainWriter(const GuestView& g, const DescChain& c) : g_(g), c_(c), buf_(c.bufs.size()) {
  for (std::size_t i = 0; i < c.bufs.size(); ++i) {
    if (c.bufs[i].writable) {
      buf_ = i;
      break;
    }
  }
}

Status ChainWriter::write(const void* src, std::uint64_t len) {
  if (len > remaining())
    return make_error(Errc::invalid_argument,
                      fmt::format("reply needs {} more writable bytes than the chain holds", len - remaining()));
  const auto* in = static_cast<const std::uint8_t*>(src);
  while (len > 0) {
    const DescBuf& b = c_.bufs[buf_];
    const std::uint64_t n = std::min<std::uint64_t>(b.len - off_, len);
    VRDMA_TRY(g_.write(b.gpa + off_, in, n));
    in += n;
    len -= n;
    off_ += n;
    written_ += n;
    if (off_ == b.len) {
      ++buf_;
      off_ = 0;
    }
  }
  return {};
}

Status append_buf(DescChain& c, std::uint64_t addr, std::uint32_t len, bool writable) {
  if (c.bufs.size() >= kMaxChain)
    return make_error(Errc::protocol_error, fmt::format("descriptor chain is longer than {} descriptors", kMaxChain));
  if (!writable && c.writable > 0)
    return make_error(Errc::protocol_error, "descriptor chain has a readable descriptor after a writable one");
  std::uint64_t end = 0;
  if (__builtin_add_overflow(addr, std::uint64_t{len}, &end))
    return make_error(Errc::protocol_error, fmt::format("descriptor {:#x}+{:#x} wraps the address space", addr, len));
  std::uint64_t& sum = writable ? c.writable : c.readable;
  if (__builtin_add_overflow(sum, std::uint64_t{len}, &sum))
    return make_error(Errc::protocol_error, "descriptor chain lengths overflow");
  if (len > 0) c.bufs.push_back({addr, len, writable});
  return {};
}

Result<IndirectTable> indirect_table(const GuestView& g, std::uint64_t addr, std::uint32_t len) {
  static_assert(sizeof(SplitDesc) == sizeof(PackedDesc));
  if (len == 0 || len % sizeof(SplitDesc) != 0)
    return make_error(Errc::protocol_error, fmt::format("indirect table length {} is not a multiple of 16", len));
  const std::uint64_t n = len / sizeof(SplitDesc);
  if (n > kMaxChain)
    return make_error(Errc::protocol_error, fmt::format("indirect table holds {} descriptors; at most {}", n, kMaxChain));
  auto table = g.memory().range(addr, len);
  if (!table) return make_error(Errc::protocol_error, "indirect table: " + table.error().message);
  return IndirectTable{*table, n};
}

namespace {

// An indirect table: len/16 descriptors at addr, chained by `next` inside the table.
Status walk_split_indirect(const GuestView& g, const SplitDesc& d, DescChain& c) {
  auto t = indirect_table(g, d.addr, d.len);
  if (!t) return std::move(t).error();
  const std::uint64_t n = t->count;
  const std::uint8_t* table = t->bytes;
  std::uint64_t i = 0;
  for (std::uint64_t steps = 0;; ++steps) {
    if (steps >= n) return make_error(Errc::protocol_error, "indirect descriptor chain loops");
    SplitDesc e;
    std::memcpy(&e, table + i * sizeof(SplitDesc), sizeof e);
    if ((e.flags & kDescIndirect) != 0)
      return make_error(Errc::protocol_error, "indirect table holds an indirect descriptor");
    VRDMA_TRY(append_buf(c, e.addr, e.len, (e.flags & kDescWrite) != 0));
    if ((e.flags & kDescNext) == 0) return {};
    if (e.next >= n)
      return make_error(Errc::protocol_error, fmt::format("indirect descriptor next {} is outside its table of {}", e.next, n));
    i = e.next;
  }
}

}  // namespace

Result<DescChain> walk_split_chain(const GuestView& g, std::uint64_t table_gpa, std::uint16_t size,
                                   std::uint16_t head, bool indirect_ok) {
  if (head >= size)
    return make_error(Errc::protocol_error, fmt::format("descriptor head {} is outside a queue of {}", head, size));
  auto table = g.memory().range(table_gpa, std::uint64_t{size} * sizeof(SplitDesc));
  if (!table) return make_error(Errc::protocol_error, "descriptor table: " + table.error().message);
  DescChain c;
  c.id = head;
  c.slots = 1;
  std::uint16_t i = head;
  for (std::uint32_t steps = 0;; ++steps) {
    if (steps >= size) return make_error(Errc::protocol_error, fmt::format("descriptor chain from head {} loops", head));
    SplitDesc d;
    std::memcpy(&d, *table + std::uint64_t{i} * sizeof(SplitDesc), sizeof d);
    if ((d.flags & kDescIndirect) != 0) {
      if (!indirect_ok) return make_error(Errc::protocol_error, "indirect descriptor used but not negotiated");
      if ((d.flags & kDescNext) != 0 || !c.bufs.empty() || c.readable + c.writable > 0)
        return make_error(Errc::protocol_error, "indirect descriptor must be the only descriptor of its chain");
      VRDMA_TRY(walk_split_indirect(g, d, c));
      break;
    }
    VRDMA_TRY(append_buf(c, d.addr, d.len, (d.flags & kDescWrite) != 0));
    if ((d.flags & kDescNext) == 0) break;
    if (d.next >= size)
      return make_error(Errc::protocol_error, fmt::format("descriptor next {} is outside a queue of {}", d.next, size));
    i = d.next;
  }
  VRDMA_TRY(check_buffers_in_memory(g, c));
  return c;
}

Status check_buffers_in_memory(const GuestView& g, const DescChain& c) {
  for (const auto& b : c.bufs) {
    std::uint64_t off = 0;
    while (off < b.len) {
      auto s = g.memory().at(b.gpa + off);
      if (!s)
        return make_error(Errc::protocol_error,
                          fmt::format("descriptor buffer {:#x}+{:#x} is outside guest memory", b.gpa, b.len));
      off += std::min<std::uint64_t>(s->len, b.len - off);
    }
  }
  return {};
}

}  // namespace vrdma::vhost
