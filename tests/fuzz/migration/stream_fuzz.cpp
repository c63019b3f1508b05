// Fuzzes the switchover stream parser (migration/stream.hpp) the way a destination vrdmad meets
// it: bytes from the network in arbitrary chunks. Checks: chunking does not change the frames
// found; every frame respects its type's size limit; HELLO payloads decode or fail cleanly, and
// a decoded HELLO encodes back to one that decodes the same; so do HELLO_OK (with the
// destination's RDMA endpoint and buffer) and STATE_WRITTEN, within their limits.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "vrdma/migration/stream.hpp"

using namespace vrdma::migration;

namespace {
struct Seen {
  std::vector<std::pair<FrameType, std::size_t>> frames;
  bool error = false;
};

Seen parse(const std::uint8_t* data, std::size_t size, std::size_t chunk) {
  Seen out;
  FrameReader r;
  for (std::size_t off = 0; off < size && !out.error; off += chunk) {
    r.feed(std::span(data + off, std::min(chunk, size - off)));
    for (;;) {
      auto f = r.next();
      if (!f) {
        out.error = true;
        break;
      }
      if (!f->has_value()) break;
      const Frame& fr = **f;
      if (fr.payload.size() > ((fr.type == FrameType::state || fr.type == FrameType::prestate) ? kMaxStateBytes : kMaxTextBytes)) std::abort();
      out.frames.emplace_back(fr.type, fr.payload.size());
      if (fr.type == FrameType::hello_ok) {
        if (auto h = decode_hello_ok(fr.payload); h.ok()) {
          const auto text = encode_hello_ok(*h);
          auto again = decode_hello_ok(std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
          if (!again.ok() || again->prestate != h->prestate || again->rdma != h->rdma ||
              again->release != h->release || h->release.size() > 32) std::abort();
          if (h->rdma && (h->rdma->qpn > 0xffffff || h->rdma->psn > 0xffffff || h->rdma->bytes > kMaxStateBytes))
            std::abort();
        }
      }
      if (fr.type == FrameType::state_written) {
        if (auto w = decode_state_written(fr.payload); w.ok() && w->bytes > kMaxStateBytes) std::abort();
      }
      if (fr.type == FrameType::hello) {
        if (auto h = decode_hello(fr.payload); h.ok()) {
          const auto text = encode_hello(*h);
          auto again = decode_hello(std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
          if (!again.ok() || again->gid != h->gid || again->mac != h->mac || again->engine != h->engine ||
              again->state_version != h->state_version || again->source != h->source || again->rdma != h->rdma ||
              again->state_hint != h->state_hint || again->release != h->release || h->release.size() > 32)
            std::abort();
        }
      }
    }
  }
  return out;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const Seen whole = parse(data, size, size == 0 ? 1 : size);
  const std::size_t chunk = size == 0 ? 1 : 1 + data[0] % 7;
  const Seen bits = parse(data, size, chunk);
  if (whole.frames != bits.frames || whole.error != bits.error) std::abort();
  // Round trip: what encode() makes, the reader reads back.
  if (size >= 2) {
    const auto type = static_cast<FrameType>(1 + data[1] % 10);
    auto enc = encode(type, std::span(data, std::min<std::size_t>(size, kMaxTextBytes)));
    FrameReader r;
    r.feed(enc);
    auto f = r.next();
    if (!f || !f->has_value() || (*f)->type != type || (*f)->payload.size() != std::min<std::size_t>(size, kMaxTextBytes))
      std::abort();
  }
  return 0;
}
