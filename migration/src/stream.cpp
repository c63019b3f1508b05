#include "vrdma/migration/stream.hpp"

#include <arpa/inet.h>

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
    case FrameType::abort:
    case FrameType::state_written: return kMaxTextBytes;
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
    case FrameType::state_written: return "STATE_WRITTEN";
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

namespace {
nlohmann::json rdma_json(const RdmaPeer& p) {
  nlohmann::json j{{"gid", p.gid}, {"qpn", p.qpn}, {"psn", p.psn}};
  if (p.bytes != 0) {
    j["addr"] = p.addr;
    j["rkey"] = p.rkey;
    j["bytes"] = p.bytes;
  }
  return j;
}

// An unsigned number no larger than `max`; absent is fine when not `required`.
bool unsigned_field(const nlohmann::json& j, const char* k, std::uint64_t max, std::uint64_t& out, bool required) {
  auto it = j.find(k);
  if (it == j.end()) return !required;
  if (!it->is_number_unsigned() || it->get<std::uint64_t>() > max) return false;
  out = it->get<std::uint64_t>();
  return true;
}

// A string of at most `max` bytes at `k`; absent is fine unless `required`.
bool string_field(const nlohmann::json& j, const char* k, std::size_t max, std::string& out, bool required) {
  auto it = j.find(k);
  if (it == j.end()) return !required;
  if (!it->is_string() || it->get_ref<const std::string&>().size() > max) return false;
  out = it->get<std::string>();
  return true;
}

Result<std::optional<RdmaPeer>> rdma_from(const nlohmann::json& parent) {
  auto r = parent.find("rdma");
  if (r == parent.end()) return std::optional<RdmaPeer>{};
  const nlohmann::json& j = *r;
  const auto bad = [](const std::string& why) {
    return make_error(Errc::protocol_error, "the peer's RDMA endpoint is malformed: " + why);
  };
  if (!j.is_object()) return bad("not a JSON object");
  RdmaPeer p;
  auto g = j.find("gid");
  if (g == j.end() || !g->is_string()) return bad("no gid string");
  p.gid = g->get<std::string>();
  in6_addr a{};
  if (p.gid.size() > 64 || ::inet_pton(AF_INET6, p.gid.c_str(), &a) != 1) return bad("its gid is not a GID");
  std::uint64_t qpn = 0, psn = 0, rkey = 0;
  if (!unsigned_field(j, "qpn", 0xffffff, qpn, true) || !unsigned_field(j, "psn", 0xffffff, psn, true))
    return bad("no 24-bit qpn and psn");
  if (!unsigned_field(j, "addr", ~std::uint64_t{0}, p.addr, false) || !unsigned_field(j, "rkey", 0xffffffffu, rkey, false) ||
      !unsigned_field(j, "bytes", kMaxStateBytes, p.bytes, false))
    return bad(fmt::format("addr, rkey or bytes out of range (a buffer holds at most {} bytes)", kMaxStateBytes));
  p.qpn = static_cast<std::uint32_t>(qpn);
  p.psn = static_cast<std::uint32_t>(psn);
  p.rkey = static_cast<std::uint32_t>(rkey);
  if (p.bytes == 0) p.addr = p.rkey = 0;  // no buffer: its address and key mean nothing
  return std::optional<RdmaPeer>(std::move(p));
}
}  // namespace

std::string release_name(const std::string& release) { return release.empty() ? "before 0.1.0" : release; }

std::string encode_hello(const Hello& h) {
  nlohmann::json j{{"gid", h.gid}, {"mac", h.mac}, {"engine", h.engine}, {"state_version", h.state_version},
                   {"source", h.source}};
  if (h.rdma) j["rdma"] = rdma_json(*h.rdma);
  if (h.state_hint != 0) j["state_hint"] = h.state_hint;
  if (!h.release.empty()) j["release"] = h.release;
  return j.dump();
}

Result<Hello> decode_hello(std::span<const std::uint8_t> payload) {
  auto j = nlohmann::json::parse(payload.begin(), payload.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(Errc::protocol_error, "HELLO is not a JSON object");
  Hello h;
  if (!string_field(j, "gid", 64, h.gid, true) || !string_field(j, "mac", 32, h.mac, true) ||
      !string_field(j, "engine", 32, h.engine, true) || !string_field(j, "source", 512, h.source, true))
    return make_error(Errc::protocol_error, "HELLO lacks gid, mac, engine or source strings (or one is too long)");
  auto v = j.find("state_version");
  if (v == j.end() || !v->is_number_unsigned() || v->get<std::uint64_t>() > 0xffffffffu)
    return make_error(Errc::protocol_error, "HELLO lacks a state_version number");
  h.state_version = v->get<std::uint32_t>();
  auto r = rdma_from(j);
  if (!r) return std::move(r).error();
  h.rdma = std::move(*r);
  if (!unsigned_field(j, "state_hint", kMaxStateBytes, h.state_hint, false))
    return make_error(Errc::protocol_error, "HELLO's state_hint is not a size up to the largest state");
  if (!string_field(j, "release", 32, h.release, false))
    return make_error(Errc::protocol_error, "HELLO's release is not a version string of up to 32 characters");
  return h;
}

std::string encode_hello_ok(const HelloOk& h) {
  nlohmann::json j{{"prestate", h.prestate}};
  if (h.rdma) j["rdma"] = rdma_json(*h.rdma);
  if (!h.release.empty()) j["release"] = h.release;
  return j.dump();
}

Result<HelloOk> decode_hello_ok(std::span<const std::uint8_t> payload) {
  auto j = nlohmann::json::parse(payload.begin(), payload.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(Errc::protocol_error, "HELLO_OK is not a JSON object");
  HelloOk h;
  auto p = j.find("prestate");
  h.prestate = p != j.end() && p->is_boolean() && p->get<bool>();
  auto r = rdma_from(j);
  if (!r) return std::move(r).error();
  h.rdma = std::move(*r);
  if (!string_field(j, "release", 32, h.release, false))
    return make_error(Errc::protocol_error, "HELLO_OK's release is not a version string of up to 32 characters");
  return h;
}

std::string encode_state_written(const StateWritten& s) {
  return nlohmann::json{{"bytes", s.bytes}, {"crc32", s.crc32}}.dump();
}

Result<StateWritten> decode_state_written(std::span<const std::uint8_t> payload) {
  auto j = nlohmann::json::parse(payload.begin(), payload.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(Errc::protocol_error, "STATE_WRITTEN is not a JSON object");
  StateWritten s;
  std::uint64_t crc = 0;
  if (!unsigned_field(j, "bytes", kMaxStateBytes, s.bytes, true) || !unsigned_field(j, "crc32", 0xffffffffu, crc, true))
    return make_error(Errc::protocol_error, "STATE_WRITTEN lacks bytes (up to the largest state) and a crc32");
  s.crc32 = static_cast<std::uint32_t>(crc);
  return s;
}

}  // namespace vrdma::migration
