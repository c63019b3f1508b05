#include "vrdma/common/result.hpp"

#include <cstring>

namespace vrdma {
namespace {

class Category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "vrdma"; }
  std::string message(int ev) const override {
    switch (static_cast<Errc>(ev)) {
      case Errc::ok: return "success";
      case Errc::invalid_argument: return "invalid argument";
      case Errc::not_supported: return "not supported";
      case Errc::no_device: return "no such device";
      case Errc::no_memory: return "out of memory or device resources";
      case Errc::limit_exceeded: return "limit exceeded";
      case Errc::busy: return "resource busy";
      case Errc::would_block: return "resource temporarily unavailable";
      case Errc::bad_state: return "operation not allowed in the current state";
      case Errc::access_denied: return "access denied";
      case Errc::not_found: return "not found";
      case Errc::io_error: return "I/O error";
      case Errc::timeout: return "timed out";
      case Errc::protocol_error: return "protocol error";
      case Errc::connection_lost: return "connection lost";
    }
    return "unknown vrdma error";
  }
};

}  // namespace

const std::error_category& vrdma_category() noexcept {
  static const Category c;
  return c;
}

bool Error::retryable() const noexcept {
  return is(Errc::would_block) || is(Errc::timeout) || is(Errc::connection_lost);
}

Error make_error(Errc e, std::string message) { return Error{make_error_code(e), std::move(message)}; }

Error errno_error(int err, std::string what) {
  Errc e = Errc::io_error;
  switch (err) {
    case EINVAL: e = Errc::invalid_argument; break;
    case EOPNOTSUPP: e = Errc::not_supported; break;
    case ENODEV: case ENXIO: e = Errc::no_device; break;
    case ENOMEM: case ENOSPC: case ENOBUFS: e = Errc::no_memory; break;
    case EBUSY: e = Errc::busy; break;
    case EAGAIN: e = Errc::would_block; break;
    case EACCES: case EPERM: e = Errc::access_denied; break;
    case ENOENT: e = Errc::not_found; break;
    case ETIMEDOUT: e = Errc::timeout; break;
    case ECONNRESET: case EPIPE: case ECONNREFUSED: e = Errc::connection_lost; break;
    default: break;
  }
  what += ": ";
  what += std::strerror(err);
  return Error{make_error_code(e), std::move(what)};
}

}  // namespace vrdma
