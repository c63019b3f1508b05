// One error convention for all of vrdma (see STYLE.md, "One error convention").
//
// Every fallible call returns Result<T>: either a value or an Error that carries an
// std::error_code in our own category plus one sentence for the operator. The data path
// never throws; exceptions are kept for construction failures and programmer errors.
#pragma once

#include <cerrno>
#include <string>
#include <system_error>
#include <utility>
#include <variant>

namespace vrdma {

enum class Errc {
  ok = 0,
  invalid_argument,   // a caller-supplied value is out of range or malformed
  not_supported,      // the provider or device lacks the capability
  no_device,          // no device by that name
  no_memory,          // allocation or a device resource is exhausted
  limit_exceeded,     // a configured per-object or per-guest limit would be exceeded
  busy,               // object is in use (e.g. PD with live MRs)
  would_block,        // try again later (queue full)
  bad_state,          // operation not allowed in the object's current state
  access_denied,      // key or rights check failed
  not_found,          // handle, key or entry does not exist
  io_error,           // a system call failed
  timeout,            // an operation did not finish in time
  protocol_error,     // the peer or frontend broke the protocol
  connection_lost,    // the peer went away
};

const std::error_category& vrdma_category() noexcept;
inline std::error_code make_error_code(Errc e) noexcept { return {static_cast<int>(e), vrdma_category()}; }

// What failed, as a sentence the operator can act on.
struct Error {
  std::error_code code;
  std::string message;

  // Worth retrying the same call later (queue full, timeout, lost connection).
  [[nodiscard]] bool retryable() const noexcept;
  [[nodiscard]] bool is(Errc e) const noexcept { return code == make_error_code(e); }
  // Its kind (io_error for a code of another category).
  [[nodiscard]] Errc errc() const noexcept {
    return code.category() == vrdma_category() ? static_cast<Errc>(code.value()) : Errc::io_error;
  }
};

Error make_error(Errc e, std::string message);
// errno values and error kinds, both ways, each written once (errno_error, libpvverbs' C API, and
// the virtio RDMA device's command statuses, which are errno numbers, use these).
// A queue that is full is would_block, answered as ENOMEM, as ibv_post_send answers it.
Errc errc_of_errno(int err) noexcept;
int errno_of(Errc e) noexcept;
// An Error of errno_of's kind: "what: strerror(err)".
Error errno_error(int err, std::string what);

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}               // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}           // NOLINT
  [[nodiscard]] bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const& { return std::get<1>(v_); }
  Error&& error() && { return std::get<1>(std::move(v_)); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : err_(std::move(error)), failed_(true) {}  // NOLINT
  [[nodiscard]] bool ok() const noexcept { return !failed_; }
  explicit operator bool() const noexcept { return ok(); }
  const Error& error() const& { return err_; }
  Error&& error() && { return std::move(err_); }

 private:
  Error err_;
  bool failed_ = false;
};

using Status = Result<void>;

}  // namespace vrdma

template <>
struct std::is_error_code_enum<vrdma::Errc> : std::true_type {};

// Propagate an error from an expression returning Result<...>.
#define VRDMA_TRY(expr)                                  \
  do {                                                   \
    auto vrdma_try_r_ = (expr);                          \
    if (!vrdma_try_r_.ok()) return std::move(vrdma_try_r_).error(); \
  } while (0)
