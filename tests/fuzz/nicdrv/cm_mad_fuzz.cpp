// Fuzzes the CM MAD parser (vrdma/nicdrv/proto/mad.hpp) on untrusted QP1 payloads, and feeds what
// parses to the connection state machine on both sides. Checks: whatever parses re-encodes to a
// MAD that parses to the same message (encode/decode are inverse on every field), the RDMA-CM
// header parser stays inside its input, and no message moves a state machine into a state its
// role cannot have.
#include <cstdint>
#include <cstdlib>

#include "vrdma/nicdrv/proto/cm_state.hpp"
#include "vrdma/nicdrv/proto/mad.hpp"

namespace mad = vrdma::nicdrv::soft::mad;
namespace cm = vrdma::nicdrv::soft::cm;

#define FUZZ_CHECK(cond)       \
  do {                         \
    if (!(cond)) std::abort(); \
  } while (0)

namespace {

bool same(const mad::Message& a, const mad::Message& b) {
  if (a.index() != b.index()) return false;
  return std::visit([&](const auto& x) { return x == std::get<std::decay_t<decltype(x)>>(b); }, a);
}

bool active_state(cm::State s) {
  return s == cm::State::req_sent || s == cm::State::mra_rcvd || s == cm::State::rep_rcvd ||
         s == cm::State::established || s == cm::State::dreq_sent || s == cm::State::timewait || s == cm::State::closed;
}
bool passive_state(cm::State s) {
  return s == cm::State::req_rcvd || s == cm::State::mra_sent || s == cm::State::rep_sent ||
         s == cm::State::established || s == cm::State::dreq_sent || s == cm::State::timewait || s == cm::State::closed;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> in(data, size);
  mad::Header h;
  (void)mad::parse_header(in, h);
  (void)mad::parse_cma(in);
  mad::Mad m;
  if (mad::parse(in, m) != mad::ParseError::none) return 0;
  FUZZ_CHECK(size == mad::kMadLen);
  const mad::MadBytes again = mad::encode(m.hdr, m.msg);
  mad::Mad m2;
  FUZZ_CHECK(mad::parse(again, m2) == mad::ParseError::none);
  FUZZ_CHECK(m2.hdr == m.hdr);
  FUZZ_CHECK(same(m.msg, m2.msg));
  if (const auto* r = std::get_if<mad::Req>(&m.msg)) (void)mad::parse_cma(r->private_data);

  // The message against both roles, in a few states; then the timers.
  const cm::TimePoint t0{};
  mad::Req req;
  req.local_comm_id = 1;
  req.remote_cm_response_timeout = req.local_cm_response_timeout = 14;
  req.max_cm_retries = 2;
  auto a = cm::Conn::active(req, t0);
  auto p = cm::Conn::passive(req, 2, 3);
  for (int step = 0; step < 3; ++step) {
    (void)a.on_message(m.msg, t0);
    (void)p.on_message(m.msg, t0);
    if (step == 0) (void)p.accept(mad::Rep{}, t0);
    if (step == 1) (void)a.ready_to_use();
    FUZZ_CHECK(active_state(a.state()));
    FUZZ_CHECK(passive_state(p.state()));
  }
  for (int i = 0; i < 8; ++i) {
    const auto t = t0 + std::chrono::seconds(1 << i);
    (void)a.on_timer(t);
    (void)p.on_timer(t);
  }
  return 0;
}
