// The CM connection state machine (IBA vol 1 12.9). See cm_state.hpp.
#include "vrdma/nicdrv/proto/cm_state.hpp"

#include <algorithm>

namespace vrdma::nicdrv::soft::cm {
namespace {

using mad::RejReason;

// Timewait (IBA 12.9.8.7): long enough for stray packets of the old connection to die.
constexpr auto kTimewaitMin = std::chrono::milliseconds(50);
constexpr auto kTimewaitMax = std::chrono::seconds(2);

std::string rej_text(const mad::Rej& r) {
  std::string_view why = mad::to_string(static_cast<RejReason>(r.reason));
  return "the peer rejected the connection: " + (why.empty() ? "reason " + std::to_string(r.reason) : std::string(why)) +
         " (IBA REJ reason " + std::to_string(r.reason) + ")";
}

}  // namespace

std::string_view to_string(State s) noexcept {
  switch (s) {
    case State::idle: return "idle";
    case State::req_sent: return "REQ sent";
    case State::mra_rcvd: return "MRA received";
    case State::rep_rcvd: return "REP received";
    case State::req_rcvd: return "REQ received";
    case State::mra_sent: return "MRA sent";
    case State::rep_sent: return "REP sent";
    case State::established: return "established";
    case State::dreq_sent: return "DREQ sent";
    case State::timewait: return "timewait";
    case State::closed: return "closed";
  }
  return "?";
}

std::chrono::nanoseconds iba_time(std::uint8_t exp) noexcept {
  return std::chrono::nanoseconds(std::int64_t{4096} << std::min<int>(exp, 31));
}

Conn Conn::active(const mad::Req& req, TimePoint now) {
  Conn c;
  c.active_ = true;
  c.req_ = req;
  c.local_id_ = req.local_comm_id;
  c.state_ = State::req_sent;
  c.last_ = req;
  c.arm(now, iba_time(req.remote_cm_response_timeout), req.max_cm_retries);
  return c;
}

Conn Conn::passive(const mad::Req& req, std::uint32_t local_id, std::uint64_t local_guid) {
  Conn c;
  c.active_ = false;
  c.req_ = req;
  c.local_id_ = local_id;
  c.remote_id_ = req.local_comm_id;
  c.remote_guid_ = req.local_ca_guid;
  c.rep_.local_ca_guid = local_guid;
  c.state_ = State::req_rcvd;
  return c;
}

void Conn::arm(TimePoint now, std::chrono::nanoseconds interval, unsigned retries) {
  interval_ = interval;
  retries_left_ = retries;
  deadline_ = now + std::chrono::duration_cast<Clock::duration>(interval);
}

void Conn::close(std::string why) {
  if (!was_established_ && failure_.empty()) failure_ = std::move(why);
  state_ = State::closed;
  disarm();
}

void Conn::enter_timewait(TimePoint now) {
  state_ = State::timewait;
  auto t = std::clamp<std::chrono::nanoseconds>(2 * iba_time(req_.primary_local_ack_timeout), kTimewaitMin, kTimewaitMax);
  deadline_ = now + std::chrono::duration_cast<Clock::duration>(t);
  retries_left_ = 0;
}

mad::Message Conn::make_rtu() const {
  mad::Rtu r;
  r.local_comm_id = local_id_;
  r.remote_comm_id = remote_id_;
  return r;
}

mad::Message Conn::make_drep() const {
  mad::Drep r;
  r.local_comm_id = local_id_;
  r.remote_comm_id = remote_id_;
  return r;
}

Reaction Conn::send_mra(std::uint8_t service_timeout) {
  if (state_ != State::req_rcvd && state_ != State::mra_sent) return {};
  mad::Mra m;
  m.local_comm_id = local_id_;
  m.remote_comm_id = remote_id_;
  m.message_mraed = 0;  // the REQ
  m.service_timeout = static_cast<std::uint8_t>(service_timeout & 0x1f);
  mra_timeout_ = m.service_timeout;
  mra_pending_ = true;
  state_ = State::mra_sent;
  return {m, true, false};
}

Reaction Conn::accept(mad::Rep rep, TimePoint now) {
  if (state_ != State::req_rcvd && state_ != State::mra_sent) return {};
  rep.local_comm_id = local_id_;
  rep.remote_comm_id = remote_id_;
  rep.local_ca_guid = rep_.local_ca_guid;
  rep_ = rep;
  last_ = rep;
  state_ = State::rep_sent;
  arm(now, iba_time(req_.local_cm_response_timeout), req_.max_cm_retries);
  return {rep, true, false};
}

Reaction Conn::ready_to_use() {
  if (state_ != State::rep_rcvd) return {};
  state_ = State::established;
  was_established_ = true;
  disarm();
  return {make_rtu(), true, false};
}

Reaction Conn::reject(mad::RejReason reason, std::string why) {
  if (state_ == State::established || state_ == State::dreq_sent || state_ == State::timewait || state_ == State::closed)
    return {};
  mad::Rej r;
  r.local_comm_id = local_id_;
  r.remote_comm_id = remote_id_;
  r.message_rejected = active_ ? 1 : 0;  // we reject their REP (active) or their REQ (passive)
  r.reason = static_cast<std::uint16_t>(reason);
  rej_reason_ = reason;
  close(std::move(why));
  return {r, true, false};
}

Reaction Conn::disconnect(TimePoint now) {
  if (state_ != State::established && state_ != State::rep_sent && state_ != State::rep_rcvd) return {};
  mad::Dreq d;
  d.local_comm_id = local_id_;
  d.remote_comm_id = remote_id_;
  d.remote_qpn = remote_qpn();
  last_ = d;
  state_ = State::dreq_sent;
  // Our own response timeout paces the DREQ (the peer's REP carries none).
  arm(now, iba_time(active_ ? req_.remote_cm_response_timeout : req_.local_cm_response_timeout), req_.max_cm_retries);
  return {d, true, false};
}

Reaction Conn::on_traffic() {
  if (state_ != State::rep_sent) return {};
  state_ = State::established;
  was_established_ = true;
  disarm();
  return {std::nullopt, true, false};
}

Reaction Conn::on_message(const mad::Message& m, TimePoint now) {
  Reaction r;
  if (const auto* req = std::get_if<mad::Req>(&m)) {
    // A duplicate REQ (the peer did not hear us): say again what we said.
    if (active_ || req->local_comm_id != remote_id_) return r;
    if (state_ == State::mra_sent && mra_pending_) {
      mad::Mra mra;
      mra.local_comm_id = local_id_;
      mra.remote_comm_id = remote_id_;
      mra.service_timeout = mra_timeout_;
      r.send = mra;
    } else if (state_ == State::rep_sent) {
      r.send = rep_;
      ++resends_;
    }
    return r;
  }
  if (const auto* mra = std::get_if<mad::Mra>(&m)) {
    if (active_ && (state_ == State::req_sent || state_ == State::mra_rcvd) && mra->message_mraed == 0) {
      // The peer will answer within its service timeout: stop resending the REQ (12.6.6).
      state_ = State::mra_rcvd;
      arm(now, iba_time(req_.remote_cm_response_timeout) + iba_time(mra->service_timeout), 0);
      r.changed = true;
    } else if (!active_ && state_ == State::rep_sent && mra->message_mraed == 1) {
      arm(now, iba_time(req_.local_cm_response_timeout) + iba_time(mra->service_timeout), 0);
    }
    return r;
  }
  if (const auto* rep = std::get_if<mad::Rep>(&m)) {
    if (!active_) return r;
    if (state_ == State::req_sent || state_ == State::mra_rcvd) {
      rep_ = *rep;
      remote_id_ = rep->local_comm_id;
      remote_guid_ = rep->local_ca_guid;
      state_ = State::rep_rcvd;
      disarm();
      r.changed = true;
    } else if (state_ == State::established && rep->local_comm_id == remote_id_) {
      r.send = make_rtu();  // our RTU was lost (12.9.6)
      ++resends_;
    }
    return r;
  }
  if (const auto* rej = std::get_if<mad::Rej>(&m)) {
    const bool before = state_ == State::req_sent || state_ == State::mra_rcvd || state_ == State::rep_rcvd ||
                        state_ == State::req_rcvd || state_ == State::mra_sent || state_ == State::rep_sent;
    if (!before) return r;
    rej_reason_ = static_cast<RejReason>(rej->reason);
    close(rej_text(*rej));
    r.changed = true;
    return r;
  }
  if (std::get_if<mad::Rtu>(&m) != nullptr) {
    if (!active_ && state_ == State::rep_sent) {
      state_ = State::established;
      was_established_ = true;
      disarm();
      r.changed = true;
    }
    return r;
  }
  if (std::get_if<mad::Dreq>(&m) != nullptr) {
    switch (state_) {
      case State::established:
      case State::rep_sent:
      case State::rep_rcvd:
      case State::dreq_sent:  // both sides disconnect at once: answer and wait (12.9.8.3)
        if (state_ == State::rep_sent || state_ == State::rep_rcvd) was_established_ = true;
        r.send = make_drep();
        r.qp_to_error = true;
        r.changed = true;
        enter_timewait(now);
        break;
      case State::timewait:
        r.send = make_drep();  // our DREP was lost
        break;
      case State::closed:
        // Gone (after timewait, or closed by a REJ the peer may never have heard): confirm
        // anyway, as for a connection we no longer hold, or the peer resends until its retries
        // run out (12.9.8.3).
        if (remote_id_ != 0) r.send = make_drep();
        break;
      default: break;
    }
    return r;
  }
  if (std::get_if<mad::Drep>(&m) != nullptr) {
    if (state_ == State::dreq_sent) {
      enter_timewait(now);
      r.changed = true;
    }
    return r;
  }
  return r;
}

Reaction Conn::on_timer(TimePoint now) {
  Reaction r;
  if (now < deadline_) return r;
  switch (state_) {
    case State::req_sent:
    case State::rep_sent:
    case State::dreq_sent:
      if (retries_left_ > 0) {
        --retries_left_;
        ++resends_;
        r.send = last_;
        deadline_ = now + std::chrono::duration_cast<Clock::duration>(interval_);
        return r;
      }
      if (state_ == State::dreq_sent) {  // no DREP: the connection is gone anyway (12.9.8.4)
        enter_timewait(now);
        r.changed = true;
        return r;
      }
      [[fallthrough]];
    case State::mra_rcvd: {
      const char* what = state_ == State::rep_sent ? "no ready-to-use (RTU) message came back for our reply"
                                                  : "the peer's connection manager did not answer our request";
      r = reject(RejReason::timeout, std::string(what) + " after " + std::to_string(resends_ + 1) + " sends");
      return r;
    }
    case State::timewait:
      state_ = State::closed;
      disarm();
      r.changed = true;
      return r;
    default:
      disarm();
      return r;
  }
}

}  // namespace vrdma::nicdrv::soft::cm
