// What perf_cm.cpp (rping, ucmatose) and perf_cm_perftest.cpp (perftest -R) share: fatal
// errors as sentences, big-endian fields, a QP to INIT, the step and idle timeouts.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "vrdma/nicdrv/types.hpp"
#include "vrdma/nicdrv/device.hpp"

namespace vrdma::perf::cm_detail {

using namespace vrdma::nicdrv;

[[noreturn]] inline void die(const std::string& msg) {
  std::fprintf(stderr, "vrdma-perf: %s\n", msg.c_str());
  std::exit(1);
}
template <class T>
T must(Result<T> r, const std::string& what) {
  if (!r) die(what + ": " + r.error().message);
  return std::move(r).value();
}
inline void must(Status s, const std::string& what) {
  if (!s) die(what + ": " + s.error().message);
}

constexpr auto kStepTimeout = std::chrono::seconds(30);
// A server between pings that hears nothing for this long takes the client as gone: its DREQ was
// lost and Linux does not resend one once rping has destroyed its cm_id (a real rping server
// would wait forever). We disconnect ourselves; the client's own count says whether every ping
// arrived.
constexpr auto kClientIdle = std::chrono::seconds(10);

inline void put_be(std::uint8_t* p, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * (n - 1 - i)));
}
inline std::uint64_t get_be(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}
// An RC QP to INIT with `access`: receives can be posted before its connection exists.
inline void to_init(QueuePair& qp, Access access) {
  QpAttr a;
  a.qp_state = QpState::init;
  a.qp_access_flags = access;
  must(qp.modify(a, QpAttrMask::state | QpAttrMask::pkey_index | QpAttrMask::port | QpAttrMask::access_flags),
       "QP to INIT");
}

}  // namespace vrdma::perf::cm_detail
