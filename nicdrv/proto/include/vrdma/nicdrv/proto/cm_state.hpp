// One IB CM connection's state machine (IBA vol 1 12.9, figures 151-153), as pure logic: it
// takes received messages, API calls and the time, and answers with the message to send (if
// any). No I/O, no locks, no clock of its own: the GSI endpoint (gsi.cpp) feeds it, and the
// unit tests drive it deterministically.
//
// Active side:  idle -REQ-> req_sent [-MRA-> mra_rcvd] -REP-> rep_rcvd -RTU-> established
// Passive side: (REQ) req_rcvd [-MRA-> mra_sent] -REP-> rep_sent -RTU (or traffic)-> established
// Both:         established -DREQ-> dreq_sent -DREP-> timewait -> closed
//               established <-DREQ- : DREP, timewait -> closed
// A REJ (sent or received) or a timeout ends in closed with the reason kept.
// Timers (12.4, 12.7.26-27): REQ, REP and DREQ are resent every cm_response_timeout, at most
// max_cm_retries times; an MRA replaces the REQ/REP timer with the service timeout it carries.
// Duplicates: a REQ again gets our MRA or REP again, a REP again our RTU again, a DREQ in
// timewait our DREP again.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "vrdma/nicdrv/proto/mad.hpp"

namespace vrdma::nicdrv::soft::cm {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

enum class State : std::uint8_t {
  idle,
  req_sent,
  mra_rcvd,     // the peer asked for more time to answer our REQ
  rep_rcvd,     // waiting for our application to move its QP and send RTU
  req_rcvd,     // waiting for our application to accept or reject
  mra_sent,
  rep_sent,
  established,
  dreq_sent,
  timewait,
  closed,
};
std::string_view to_string(State s) noexcept;

// 4.096 us * 2^exp, the encoding of every CM and ACK timeout (IBA 12.7.26).
std::chrono::nanoseconds iba_time(std::uint8_t exp) noexcept;

struct Reaction {
  std::optional<mad::Message> send;  // to transmit now
  bool changed = false;              // the state changed (waiters should look)
  bool qp_to_error = false;          // the peer disconnected: move the QP to ERR
};

class Conn {
 public:
  // Active side: the REQ to send (its local_comm_id names this connection).
  static Conn active(const mad::Req& req, TimePoint now);
  // Passive side: a new connection for a REQ that matched a listener.
  static Conn passive(const mad::Req& req, std::uint32_t local_id, std::uint64_t local_guid);

  // Passive side, while req_rcvd: ask for `service_timeout` more time (MRA of the REQ).
  Reaction send_mra(std::uint8_t service_timeout);
  // Passive: answer with this REP (ids are filled in); req_rcvd/mra_sent -> rep_sent.
  Reaction accept(mad::Rep rep, TimePoint now);
  // Active: after REP, once our QP is in RTS: RTU; rep_rcvd -> established.
  Reaction ready_to_use();
  // Either side before established: REJ with `reason`; -> closed.
  Reaction reject(mad::RejReason reason, std::string why);
  // Established (or rep_rcvd/rep_sent): DREQ; -> dreq_sent.
  Reaction disconnect(TimePoint now);

  Reaction on_message(const mad::Message& m, TimePoint now);
  // Passive: a packet arrived on our QP in rep_sent, so the peer got our REP and is in RTS
  // (IBA 12.9.7.3, "communication established"): as if RTU had come.
  Reaction on_traffic();
  // Resends or gives up; call at or after deadline().
  Reaction on_timer(TimePoint now);
  [[nodiscard]] TimePoint deadline() const noexcept { return deadline_; }

  [[nodiscard]] State state() const noexcept { return state_; }
  [[nodiscard]] bool is_active() const noexcept { return active_; }
  [[nodiscard]] std::uint32_t local_id() const noexcept { return local_id_; }
  [[nodiscard]] std::uint32_t remote_id() const noexcept { return remote_id_; }
  [[nodiscard]] std::uint64_t remote_guid() const noexcept { return remote_guid_; }
  [[nodiscard]] const mad::Req& req() const noexcept { return req_; }
  [[nodiscard]] const mad::Rep& rep() const noexcept { return rep_; }
  // Why the connection closed before being established ("" if it did not).
  [[nodiscard]] const std::string& failure() const noexcept { return failure_; }
  [[nodiscard]] std::optional<mad::RejReason> rej_reason() const noexcept { return rej_reason_; }
  [[nodiscard]] bool was_established() const noexcept { return was_established_; }
  [[nodiscard]] unsigned resends() const noexcept { return resends_; }
  // The peer's QPN (the DREQ carries it; IBA 12.6.10).
  [[nodiscard]] std::uint32_t remote_qpn() const noexcept { return active_ ? rep_.local_qpn : req_.local_qpn; }
  [[nodiscard]] std::uint32_t local_qpn() const noexcept { return active_ ? req_.local_qpn : rep_.local_qpn; }

 private:
  void arm(TimePoint now, std::chrono::nanoseconds interval, unsigned retries);
  void disarm() { deadline_ = TimePoint::max(); }
  void close(std::string why);
  void enter_timewait(TimePoint now);
  mad::Message make_rtu() const;
  mad::Message make_drep() const;

  bool active_ = false;
  State state_ = State::idle;
  std::uint32_t local_id_ = 0, remote_id_ = 0;
  std::uint64_t remote_guid_ = 0;
  mad::Req req_;
  mad::Rep rep_;
  mad::Message last_;  // what the timer resends (REQ, REP or DREQ)
  TimePoint deadline_ = TimePoint::max();
  std::chrono::nanoseconds interval_{0};
  unsigned retries_left_ = 0;
  unsigned resends_ = 0;
  std::uint8_t mra_timeout_ = 0;
  bool mra_pending_ = false;  // passive: we sent an MRA (a duplicate REQ gets it again)
  std::string failure_;
  std::optional<mad::RejReason> rej_reason_;
  bool was_established_ = false;
};

}  // namespace vrdma::nicdrv::soft::cm
