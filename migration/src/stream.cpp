#include "vrdma/migration/stream.hpp"

#include <array>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "vrdma/common/bytes.hpp"

namespace vrdma::migration {
namespace {

struct Header {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t type;
  std::uint32_t length;
  std::uint32_t reserved;
};
static_assert(sizeof(Header) == kHeaderSize);

// The largest payload each frame type may carry; 0 for an unknown type.
std::uint32_t max_payload(std::uint16_t t) {
  switch (static_cast<FrameType>(t)) {
    case FrameType::state:
    case FrameType::prestate: return kMaxStateBytes;
    case FrameType::hello:
    case FrameType::hello_ok:
    case FrameType::refuse:
    case FrameType::loaded:
    case FrameType::reject:
    case FrameType::active:
    case FrameType::abort: return kMaxTextBytes;
  }
  return 0;
}

}  // namespace

const char* to_string(FrameType t) noexcept {
  switch (t) {
    case FrameType::hello: return "HELLO";
    case FrameType::hello_ok: return "HELLO_OK";
    case FrameType::refuse: return "REFUSE";
    case FrameType::state: return "STATE";
    case FrameType::loaded: return "LOADED";
    case FrameType::reject: return "REJECT";
    case FrameType::active: return "ACTIVE";
    case FrameType::abort: return "ABORT";
    case FrameType::prestate: return "PRESTATE";
  }
  return "UNKNOWN";
}

std::vector<std::uint8_t> encode(FrameType type, std::span<const std::uint8_t> payload) {
  Header h{kStreamMagic, kStreamVersion, static_cast<std::uint16_t>(type), static_cast<std::uint32_t>(payload.size()), 0};
  ByteWriter w;
  w.put(h);
  w.out.insert(w.out.end(), payload.begin(), payload.end());
  return std::move(w.out);
}

std::vector<std::uint8_t> encode(FrameType type, const std::string& text) {
  const auto n = std::min<std::size_t>(text.size(), kMaxTextBytes);
  return encode(type, std::span(reinterpret_cast<const std::uint8_t*>(text.data()), n));
}

void FrameReader::feed(std::span<const std::uint8_t> bytes) {
  if (pos_ > 0 && pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  }
  buf_.insert(buf_.end(), bytes.begin(), bytes.end());
}

Result<std::optional<Frame>> FrameReader::next() {
  if (buffered() < kHeaderSize) return std::optional<Frame>{};
  Header h;
  std::memcpy(&h, buf_.data() + pos_, sizeof h);
  if (h.magic != kStreamMagic)
    return make_error(Errc::protocol_error, "the peer is not a vrdmad migration stream (bad magic)");
  if (h.version != kStreamVersion)
    return make_error(Errc::not_supported, fmt::format("the peer speaks migration stream version {}; this vrdmad speaks {} "
                                                       "(run the same vrdma release on both hosts)", h.version, kStreamVersion));
  const std::uint32_t max = max_payload(h.type);
  if (max == 0) return make_error(Errc::protocol_error, fmt::format("unknown migration frame type {}", h.type));
  if (h.length > max)
    return make_error(Errc::protocol_error, fmt::format("{} frame of {} bytes exceeds its limit of {} bytes",
                                                        to_string(static_cast<FrameType>(h.type)), h.length, max));
  if (h.reserved != 0) return make_error(Errc::protocol_error, "migration frame header has non-zero reserved bits");
  if (buffered() - kHeaderSize < h.length) return std::optional<Frame>{};
  Frame f;
  f.type = static_cast<FrameType>(h.type);
  const auto* p = buf_.data() + pos_ + kHeaderSize;
  f.payload.assign(p, p + h.length);
  pos_ += kHeaderSize + h.length;
  if (pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  }
  return std::optional<Frame>(std::move(f));
}

std::string encode_hello(const Hello& h) {
  return nlohmann::json{{"gid", h.gid}, {"mac", h.mac}, {"engine", h.engine}, {"state_version", h.state_version},
                        {"source", h.source}}
      .dump();
}

Result<Hello> decode_hello(std::span<const std::uint8_t> payload) {
  auto j = nlohmann::json::parse(payload.begin(), payload.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(Errc::protocol_error, "HELLO is not a JSON object");
  Hello h;
  auto str = [&](const char* k, std::string& out, std::size_t max) -> bool {
    auto it = j.find(k);
    if (it == j.end() || !it->is_string()) return false;
    out = it->get<std::string>();
    return out.size() <= max;
  };
  if (!str("gid", h.gid, 64) || !str("mac", h.mac, 32) || !str("engine", h.engine, 32) || !str("source", h.source, 512))
    return make_error(Errc::protocol_error, "HELLO lacks gid, mac, engine or source strings (or one is too long)");
  auto v = j.find("state_version");
  if (v == j.end() || !v->is_number_unsigned() || v->get<std::uint64_t>() > 0xffffffffu)
    return make_error(Errc::protocol_error, "HELLO lacks a state_version number");
  h.state_version = v->get<std::uint32_t>();
  return h;
}

}  // namespace vrdma::migration
