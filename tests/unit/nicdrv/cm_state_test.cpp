// The CM connection state machine (vrdma/nicdrv/proto/cm_state.hpp, IBA vol 1 12.9) on its own,
// two instances wired to each other by hand with a fake clock: the happy path, lost REQ/REP/RTU
// and DREQ answered by resends, duplicates answered again, MRA stretching the wait, REJ with its
// reason on both sides, DREQ from either side and at once, and every timeout.
#define BOOST_TEST_MODULE cm_state_test
#include <boost/test/unit_test.hpp>

#include <optional>

#include "vrdma/nicdrv/proto/cm_state.hpp"

namespace vrdma::nicdrv::soft::cm {
std::ostream& operator<<(std::ostream& o, State s) { return o << to_string(s); }
}  // namespace vrdma::nicdrv::soft::cm

namespace mad = vrdma::nicdrv::soft::mad;
namespace cm = vrdma::nicdrv::soft::cm;
using cm::State;

namespace {

constexpr std::uint8_t kResp = 14;  // 67 ms resend interval
const cm::TimePoint t0{};

mad::Req req() {
  mad::Req r;
  r.local_comm_id = 0x1111;
  r.local_ca_guid = 0xaaaa;
  r.local_qpn = 0x11;
  r.starting_psn = 100;
  r.remote_cm_response_timeout = kResp;
  r.local_cm_response_timeout = kResp;
  r.max_cm_retries = 3;
  r.primary_local_ack_timeout = 14;
  return r;
}

mad::Rep rep() {
  mad::Rep r;
  r.local_qpn = 0x22;
  r.starting_psn = 200;
  r.rnr_retry_count = 7;
  return r;
}

cm::TimePoint after(cm::TimePoint t, std::uint8_t exp, int times = 1) {
  return t + times * std::chrono::duration_cast<cm::Clock::duration>(cm::iba_time(exp)) + std::chrono::microseconds(1);
}

// A connected pair: active `a` (established after RTU), passive `p` (established).
struct Pair {
  cm::Conn a = cm::Conn::active(req(), t0);
  cm::Conn p = cm::Conn::passive(req(), 0x2222, 0xbbbb);
  Pair() {
    auto r = p.accept(rep(), t0);
    BOOST_REQUIRE(r.send);
    BOOST_REQUIRE(a.on_message(*r.send, t0).changed);
    auto rtu = a.ready_to_use();
    BOOST_REQUIRE(rtu.send);
    BOOST_REQUIRE(p.on_message(*rtu.send, t0).changed);
    BOOST_REQUIRE(a.state() == State::established);
    BOOST_REQUIRE(p.state() == State::established);
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(handshake_carries_ids_qpns_and_psns) {
  Pair x;
  BOOST_TEST(x.a.remote_id() == 0x2222u);
  BOOST_TEST(x.p.remote_id() == 0x1111u);
  BOOST_TEST(x.a.remote_qpn() == 0x22u);
  BOOST_TEST(x.p.remote_qpn() == 0x11u);
  BOOST_TEST(x.a.rep().starting_psn == 200u);
  BOOST_TEST(x.p.req().starting_psn == 100u);
  BOOST_TEST(x.a.remote_guid() == 0xbbbbu);
  BOOST_TEST(x.p.remote_guid() == 0xaaaau);
  BOOST_TEST(x.a.was_established());
  BOOST_TEST(x.a.failure().empty());
}

BOOST_AUTO_TEST_CASE(a_lost_req_is_resent_then_given_up_with_a_timeout_rej) {
  auto a = cm::Conn::active(req(), t0);
  BOOST_TEST(!a.on_timer(t0).send);  // not yet
  cm::TimePoint t = t0;
  for (int i = 0; i < 3; ++i) {
    t = after(t, kResp);
    auto r = a.on_timer(t);
    BOOST_REQUIRE(r.send);
    BOOST_TEST(std::holds_alternative<mad::Req>(*r.send));
    BOOST_TEST(a.state() == State::req_sent);
  }
  t = after(t, kResp);
  auto r = a.on_timer(t);
  BOOST_REQUIRE(r.send);
  const auto* rej = std::get_if<mad::Rej>(&*r.send);
  BOOST_REQUIRE(rej != nullptr);
  BOOST_TEST(rej->reason == static_cast<std::uint16_t>(mad::RejReason::timeout));
  BOOST_TEST(a.state() == State::closed);
  BOOST_TEST(a.resends() == 3u);
  BOOST_TEST(a.failure().find("did not answer") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(mra_stops_req_resends_and_stretches_the_wait) {
  auto a = cm::Conn::active(req(), t0);
  mad::Mra m;
  m.remote_comm_id = 0x1111;
  m.service_timeout = 20;  // 4.3 s
  BOOST_TEST(a.on_message(m, t0).changed);
  BOOST_TEST(a.state() == State::mra_rcvd);
  // Long after the REQ interval: no resend while the peer said it needs time.
  BOOST_TEST(!a.on_timer(after(t0, kResp, 10)).send);
  BOOST_TEST(a.state() == State::mra_rcvd);
  // The REP within the service timeout is taken.
  auto p = cm::Conn::passive(req(), 0x2222, 0xbbbb);
  BOOST_TEST(p.send_mra(20).send.has_value());
  auto r = p.accept(rep(), t0);
  BOOST_TEST(a.on_message(*r.send, after(t0, 19)).changed);
  BOOST_TEST(a.state() == State::rep_rcvd);
  // Without a REP the service timeout ends it.
  auto b = cm::Conn::active(req(), t0);
  b.on_message(m, t0);
  auto rr = b.on_timer(after(t0, 20, 2));
  BOOST_TEST(b.state() == State::closed);
  BOOST_TEST(rr.send.has_value());
}

BOOST_AUTO_TEST_CASE(duplicate_req_gets_the_mra_or_rep_again) {
  auto p = cm::Conn::passive(req(), 0x2222, 0xbbbb);
  BOOST_TEST(!p.on_message(req(), t0).send);  // REQ received, nothing said yet: silence
  p.send_mra(21);
  auto again = p.on_message(req(), t0);
  BOOST_REQUIRE(again.send);
  BOOST_TEST(std::get<mad::Mra>(*again.send).service_timeout == 21);
  p.accept(rep(), t0);
  auto r2 = p.on_message(req(), t0);
  BOOST_REQUIRE(r2.send);
  BOOST_TEST(std::get<mad::Rep>(*r2.send).local_qpn == 0x22u);
  // A REQ of another connection is not ours.
  mad::Req other = req();
  other.local_comm_id = 0x9999;
  BOOST_TEST(!p.on_message(other, t0).send);
}

BOOST_AUTO_TEST_CASE(a_lost_rep_is_resent_and_a_lost_rtu_is_answered_by_the_duplicate) {
  auto a = cm::Conn::active(req(), t0);
  auto p = cm::Conn::passive(req(), 0x2222, 0xbbbb);
  p.accept(rep(), t0);  // this REP is lost
  auto resent = p.on_timer(after(t0, kResp));
  BOOST_REQUIRE(resent.send);
  BOOST_TEST(std::holds_alternative<mad::Rep>(*resent.send));
  a.on_message(*resent.send, t0);
  auto rtu = a.ready_to_use();  // this RTU is lost
  BOOST_REQUIRE(rtu.send);
  // The passive side resends the REP; the active side answers with the RTU again.
  auto rep2 = p.on_timer(after(t0, kResp, 2));
  BOOST_REQUIRE(rep2.send);
  auto rtu2 = a.on_message(*rep2.send, t0);
  BOOST_REQUIRE(rtu2.send);
  BOOST_TEST(std::holds_alternative<mad::Rtu>(*rtu2.send));
  BOOST_TEST(p.on_message(*rtu2.send, t0).changed);
  BOOST_TEST(p.state() == State::established);
}

BOOST_AUTO_TEST_CASE(traffic_on_the_qp_stands_for_a_lost_rtu) {
  auto p = cm::Conn::passive(req(), 0x2222, 0xbbbb);
  BOOST_TEST(!p.on_traffic().changed);  // before REP: meaningless
  p.accept(rep(), t0);
  BOOST_TEST(p.on_traffic().changed);
  BOOST_TEST(p.state() == State::established);
  BOOST_TEST(!p.on_timer(after(t0, kResp, 5)).send);  // no more REP resends
}

BOOST_AUTO_TEST_CASE(no_rtu_at_all_ends_in_a_timeout_rej) {
  auto p = cm::Conn::passive(req(), 0x2222, 0xbbbb);
  p.accept(rep(), t0);
  cm::TimePoint t = t0;
  int reps = 0;
  std::optional<mad::Message> last;
  for (int i = 0; i < 10 && p.state() == State::rep_sent; ++i) {
    t = after(t, kResp);
    auto r = p.on_timer(t);
    if (r.send && std::holds_alternative<mad::Rep>(*r.send)) ++reps;
    last = r.send;
  }
  BOOST_TEST(reps == 3);
  BOOST_TEST(p.state() == State::closed);
  BOOST_REQUIRE(last.has_value());
  const auto& rej = std::get<mad::Rej>(*last);
  BOOST_TEST(rej.reason == static_cast<std::uint16_t>(mad::RejReason::timeout));
  BOOST_TEST(rej.message_rejected == 0);
  BOOST_TEST(p.failure().find("ready-to-use") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(rej_from_the_passive_side_reaches_the_active_side_with_its_reason) {
  auto a = cm::Conn::active(req(), t0);
  auto p = cm::Conn::passive(req(), 0x2222, 0xbbbb);
  auto r = p.reject(mad::RejReason::consumer, "not today");
  BOOST_REQUIRE(r.send);
  BOOST_TEST(p.state() == State::closed);
  BOOST_TEST(a.on_message(*r.send, t0).changed);
  BOOST_TEST(a.state() == State::closed);
  BOOST_TEST((a.rej_reason() == mad::RejReason::consumer));
  BOOST_TEST(a.failure().find("rejected by the application") != std::string::npos);
  // Other reasons are named too; an unknown one by number.
  for (auto reason : {mad::RejReason::invalid_service_id, mad::RejReason::stale_connection, mad::RejReason::no_qp}) {
    auto a2 = cm::Conn::active(req(), t0);
    mad::Rej rej;
    rej.remote_comm_id = 0x1111;
    rej.reason = static_cast<std::uint16_t>(reason);
    a2.on_message(rej, t0);
    BOOST_TEST(a2.failure().find(std::string(mad::to_string(reason))) != std::string::npos);
  }
  auto a3 = cm::Conn::active(req(), t0);
  mad::Rej odd;
  odd.reason = 200;
  a3.on_message(odd, t0);
  BOOST_TEST(a3.failure().find("reason 200") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(active_side_can_reject_a_rep_it_cannot_use) {
  auto a = cm::Conn::active(req(), t0);
  auto p = cm::Conn::passive(req(), 0x2222, 0xbbbb);
  a.on_message(*p.accept(rep(), t0).send, t0);
  auto r = a.reject(mad::RejReason::consumer, "QP refused RTR");
  BOOST_REQUIRE(r.send);
  BOOST_TEST(std::get<mad::Rej>(*r.send).message_rejected == 1);  // their REP
  BOOST_TEST(p.on_message(*r.send, t0).changed);
  BOOST_TEST(p.state() == State::closed);
}

BOOST_AUTO_TEST_CASE(dreq_from_either_side_ends_in_timewait_then_closed) {
  for (bool active_first : {true, false}) {
    Pair x;
    cm::Conn& from = active_first ? x.a : x.p;
    cm::Conn& to = active_first ? x.p : x.a;
    auto d = from.disconnect(t0);
    BOOST_REQUIRE(d.send);
    const auto& dreq = std::get<mad::Dreq>(*d.send);
    BOOST_TEST(dreq.remote_qpn == to.local_qpn());  // the kernel drops a DREQ naming another QPN
    auto answer = to.on_message(*d.send, t0);
    BOOST_TEST(answer.qp_to_error);
    BOOST_REQUIRE(answer.send);
    BOOST_TEST(std::holds_alternative<mad::Drep>(*answer.send));
    BOOST_TEST(to.state() == State::timewait);
    BOOST_TEST(from.on_message(*answer.send, t0).changed);
    BOOST_TEST(from.state() == State::timewait);
    // A duplicate DREQ in timewait is answered again (our DREP was lost).
    auto dup = to.on_message(*d.send, t0);
    BOOST_TEST((dup.send && std::holds_alternative<mad::Drep>(*dup.send)));
    BOOST_TEST(!dup.qp_to_error);
    from.on_timer(after(t0, 20));
    to.on_timer(after(t0, 20));
    BOOST_TEST(from.state() == State::closed);
    BOOST_TEST(to.state() == State::closed);
    BOOST_TEST(from.was_established());
    // Closed and still held by the application: a late duplicate is confirmed all the same.
    auto late = to.on_message(*d.send, after(t0, 21));
    BOOST_TEST((late.send && std::holds_alternative<mad::Drep>(*late.send)));
    BOOST_TEST(!late.qp_to_error);
  }
}

BOOST_AUTO_TEST_CASE(lost_dreq_is_resent_and_no_drep_still_ends_in_timewait) {
  Pair x;
  x.a.disconnect(t0);
  cm::TimePoint t = t0;
  int dreqs = 0;
  for (int i = 0; i < 10 && x.a.state() == State::dreq_sent; ++i) {
    t = after(t, kResp);
    auto r = x.a.on_timer(t);
    if (r.send && std::holds_alternative<mad::Dreq>(*r.send)) ++dreqs;
  }
  BOOST_TEST(dreqs == 3);
  BOOST_TEST(x.a.state() == State::timewait);
}

BOOST_AUTO_TEST_CASE(both_sides_disconnect_at_once) {
  Pair x;
  auto da = x.a.disconnect(t0);
  auto dp = x.p.disconnect(t0);
  auto ra = x.a.on_message(*dp.send, t0);  // each gets the other's DREQ while in dreq_sent
  auto rp = x.p.on_message(*da.send, t0);
  BOOST_TEST((ra.send && std::holds_alternative<mad::Drep>(*ra.send)));
  BOOST_TEST((rp.send && std::holds_alternative<mad::Drep>(*rp.send)));
  BOOST_TEST(x.a.state() == State::timewait);
  BOOST_TEST(x.p.state() == State::timewait);
}

BOOST_AUTO_TEST_CASE(messages_out_of_place_change_nothing) {
  Pair x;
  BOOST_TEST(!x.a.on_message(mad::Rtu{}, t0).changed);   // RTU to the active side
  BOOST_TEST(!x.p.on_message(rep(), t0).changed);        // REP to the passive side
  BOOST_TEST(!x.a.on_message(mad::Drep{}, t0).changed);  // DREP without DREQ
  mad::Rej late;
  late.reason = 28;
  BOOST_TEST(!x.a.on_message(late, t0).changed);  // REJ after establishment
  BOOST_TEST(x.a.state() == State::established);
  BOOST_TEST(!x.a.reject(mad::RejReason::consumer, "x").send);  // too late to reject
  BOOST_TEST(!x.p.accept(rep(), t0).send);                      // already accepted
  BOOST_TEST(!x.a.ready_to_use().send);                         // already sent
  BOOST_TEST(cm::to_string(State::mra_rcvd) == "MRA received");
}
