#include "vrdma/vhost/message.hpp"

#include <fmt/format.h>

namespace vrdma::vhost {

const MessageSpec* find_spec(std::uint32_t request) noexcept {
  if (request >= kMessageTable.size()) return nullptr;
  return &kMessageTable[request];
}

std::string_view request_name(std::uint32_t request) noexcept {
  const MessageSpec* s = find_spec(request);
  return s != nullptr ? s->name : std::string_view("UNKNOWN");
}

void Message::set_bytes(std::size_t offset, const void* p, std::size_t n) {
  if (offset > kMaxPayload || n > kMaxPayload - offset) return;
  std::memcpy(payload.data() + offset, p, n);
}

UniqueFd Message::take_fd(std::size_t i) {
  if (i >= fds.size()) return UniqueFd{};
  return std::move(fds[i]);
}

Message make_request(Request r, std::uint32_t flags) {
  Message m;
  m.hdr.request = static_cast<std::uint32_t>(r);
  m.hdr.flags = kVersion | flags;
  m.hdr.size = 0;
  return m;
}

Message make_reply(const Message& req) {
  Message m;
  m.hdr.request = req.hdr.request;
  m.hdr.flags = kVersion | kFlagReply;
  m.hdr.size = 0;
  return m;
}

namespace {

Error bad(const MessageSpec& s, std::string what) {
  return make_error(Errc::protocol_error, fmt::format("vhost-user {}: {}", s.name, what));
}

Status check_fds(const Message& m, const MessageSpec& s) {
  const std::size_t n = m.fds.size();
  switch (s.fds) {
    case FdRule::none:
      if (n != 0) return bad(s, fmt::format("carries {} file descriptors but takes none", n));
      break;
    case FdRule::one:
      if (n != 1) return bad(s, fmt::format("carries {} file descriptors but takes exactly one", n));
      break;
    case FdRule::optional:
      if (n > 1) return bad(s, fmt::format("carries {} file descriptors but takes at most one", n));
      break;
    case FdRule::vring: {
      const auto v = m.get<std::uint64_t>();
      const std::size_t want = (v & kVringNoFd) != 0 ? 0 : 1;
      if (n != want) return bad(s, fmt::format("carries {} file descriptors but its flags say {}", n, want));
      break;
    }
    case FdRule::mem_table: {
      const auto h = m.get<MemTableHeader>();
      if (n != h.nregions) return bad(s, fmt::format("lists {} regions but carries {} file descriptors", h.nregions, n));
      break;
    }
  }
  return {};
}

Status check_ranges(const Message& m, const MessageSpec& s) {
  switch (m.request()) {
    case Request::set_mem_table: {
      const auto h = m.get<MemTableHeader>();
      if (h.nregions == 0 || h.nregions > kMaxMemTableRegions)
        return bad(s, fmt::format("lists {} regions; 1 to {} are allowed", h.nregions, kMaxMemTableRegions));
      // nregions <= 8, so the product cannot overflow.
      const std::uint32_t want = sizeof(MemTableHeader) + h.nregions * std::uint32_t{sizeof(MemRegion)};
      if (m.hdr.size != want)
        return bad(s, fmt::format("payload is {} bytes but {} regions need {}", m.hdr.size, h.nregions, want));
      break;
    }
    case Request::get_config:
    case Request::set_config: {
      const auto c = m.get<ConfigHeader>();
      if (c.size > kMaxConfigSize || c.offset > kMaxConfigSize || c.size > kMaxConfigSize - c.offset)
        return bad(s, fmt::format("config window offset {} size {} exceeds {} bytes", c.offset, c.size, kMaxConfigSize));
      if (m.hdr.size != sizeof(ConfigHeader) + c.size)
        return bad(s, fmt::format("payload is {} bytes but its config size says {}", m.hdr.size,
                                  sizeof(ConfigHeader) + c.size));
      break;
    }
    case Request::set_vring_kick:
    case Request::set_vring_call:
    case Request::set_vring_err: {
      const auto v = m.get<std::uint64_t>();
      if ((v & ~(kVringIndexMask | kVringNoFd)) != 0)
        return bad(s, fmt::format("sets unknown bits {:#x} in its payload", v & ~(kVringIndexMask | kVringNoFd)));
      break;
    }
    case Request::set_vring_addr: {
      const auto a = m.get<VringAddr>();
      if ((a.flags & ~kVringFlagLog) != 0) return bad(s, fmt::format("sets unknown flags {:#x}", a.flags));
      break;
    }
    case Request::set_device_state_fd: {
      const auto d = m.get<DeviceStateXfer>();
      if (d.direction > 1 || d.phase != 0)
        return bad(s, fmt::format("asks for direction {} phase {}; only save/load while stopped exist", d.direction,
                                  d.phase));
      break;
    }
    default:
      break;
  }
  return {};
}

}  // namespace

Status validate_request(const Message& m, ProtocolFeatures acked) {
  const MessageSpec* s = find_spec(m.hdr.request);
  if (s == nullptr || m.hdr.request == 0)
    return make_error(Errc::protocol_error, fmt::format("vhost-user: unknown request number {}", m.hdr.request));
  if ((m.hdr.flags & kVersionMask) != kVersion)
    return bad(*s, fmt::format("has protocol version {}; only 1 exists", m.hdr.flags & kVersionMask));
  if ((m.hdr.flags & kFlagReply) != 0) return bad(*s, "is flagged as a reply but came from the frontend");
  if ((m.hdr.flags & ~(kVersionMask | kFlagReply | kFlagNeedReply)) != 0)
    return bad(*s, fmt::format("sets unknown header flags {:#x}", m.hdr.flags));
  if (m.hdr.size < s->min_size || m.hdr.size > s->max_size)
    return bad(*s, fmt::format("payload is {} bytes; {} to {} are allowed", m.hdr.size, s->min_size, s->max_size));
  if (!s->supported) return make_error(Errc::not_supported, fmt::format("vhost-user {}: not supported by this backend", s->name));
  if (s->gated && !acked.has(s->gate))
    return bad(*s, fmt::format("needs protocol feature bit {}, which was not negotiated", static_cast<unsigned>(s->gate)));
  VRDMA_TRY(check_fds(m, *s));
  return check_ranges(m, *s);
}

Status validate_reply(const Message& m, Request expected, std::uint32_t expected_size) {
  const auto name = request_name(static_cast<std::uint32_t>(expected));
  if (m.hdr.request != static_cast<std::uint32_t>(expected))
    return make_error(Errc::protocol_error, fmt::format("vhost-user {}: backend answered with request {}", name,
                                                        m.hdr.request));
  if ((m.hdr.flags & kFlagReply) == 0 || (m.hdr.flags & kVersionMask) != kVersion)
    return make_error(Errc::protocol_error, fmt::format("vhost-user {}: reply has bad flags {:#x}", name, m.hdr.flags));
  if (m.hdr.size != expected_size)
    return make_error(Errc::protocol_error, fmt::format("vhost-user {}: reply is {} bytes, expected {}", name,
                                                        m.hdr.size, expected_size));
  return {};
}

}  // namespace vrdma::vhost
