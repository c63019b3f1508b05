#include "vrdma/common/result.hpp"

#include <cerrno>
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

Errc errc_of_errno(int err) noexcept {
  switch (err) {
    case 0: return Errc::ok;
    case EINVAL: case EFAULT: return Errc::invalid_argument;
    case EOPNOTSUPP: return Errc::not_supported;
    case ENODEV: case ENXIO: return Errc::no_device;
    case ENOMEM: case ENOBUFS: return Errc::no_memory;
    case ENOSPC: return Errc::limit_exceeded;
    case EBUSY: return Errc::busy;
    case EAGAIN: return Errc::would_block;
    case EACCES: case EPERM: return Errc::access_denied;
    case ENOENT: return Errc::not_found;
    case ETIMEDOUT: return Errc::timeout;
    case ECONNRESET: case EPIPE: case ECONNREFUSED: return Errc::connection_lost;
    default: return Errc::io_error;
  }
}

int errno_of(Errc e) noexcept {
  switch (e) {
    case Errc::ok: return 0;
    case Errc::invalid_argument: return EINVAL;
    case Errc::not_supported: return EOPNOTSUPP;
    case Errc::no_device: return ENODEV;
    case Errc::no_memory: return ENOMEM;
    case Errc::limit_exceeded: return ENOSPC;
    case Errc::busy: return EBUSY;
    case Errc::would_block: return ENOMEM;  // a full queue, as ibv_post_send answers it
    case Errc::bad_state: return EINVAL;
    case Errc::access_denied: return EPERM;
    case Errc::not_found: return ENOENT;
    case Errc::timeout: return ETIMEDOUT;
    case Errc::io_error: case Errc::protocol_error: case Errc::connection_lost: return EIO;
  }
  return EIO;
}

Error errno_error(int err, std::string what) {
  what += ": ";
  what += std::strerror(err);
  return Error{make_error_code(errc_of_errno(err)), std::move(what)};
}

}  // namespace vrdma
