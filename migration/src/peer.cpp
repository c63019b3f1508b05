// Telling vrdma peers where a QP went (docs/migration.md "On a NIC", peer_notice.hpp for the
// bytes). A NIC re-creates a moved QP under a new QPN and registers its regions under new keys,
// so the QP's peer elsewhere would keep sending to the old QPN and keys. When that peer is
// another vrdma backend that takes notices:
//   the mover, at its stop, before its QPs drain: PAUSE to the peer's backend, which holds its
//     guest's send ring, drains what its NIC has in flight (RTS -> SQD: all of it acknowledged),
//     and answers with a token. Both sides drained, the PSNs each saves fall on message
//     boundaries, so the re-created QPs start where the old ones stopped.
//   the mover, once the QP exists again (destination, or the source after a failed move), before
//     taking it to RTR: REPOINT with the token, the new QPN, the PSNs and the map of its guest's
//     rkeys to the new NIC's. The peer stops its QP (ERR) and brings the same QP through RESET
//     up again the way a move re-creates one (rebuild.cpp; its QPN stays, on a NIC or the soft
//     engine, the receives its engine held are posted again), connected to the new QPN,
//     translates those rkeys in its guest's RDMA and atomic work requests, lets its ring run,
//     and answers with its QPN, which the mover connects to.
//   a stop abandoned after the pause: RELEASE, and the peer's ring runs on toward the old QPN.
//   a peer that hears nothing for hold_timeout_ms after a pause lets its ring run on by itself;
//     its sends then go to the old QPN, and its retries run out, as without notices.
// A notice is taken only for a QP connected to exactly the QPN and GID it names, from that GID's
// address; a re-point or release only with the token the pause gave. Anything else is refused
// with a sentence, to the sender and in the log.
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <random>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "device_state_impl.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::migration {

namespace {
using M = nicdrv::QpAttrMask;
using nicdrv::QpState;
using Clock = std::chrono::steady_clock;
using notice::Kind;
// A peer's host that drops the connection attempt (no backend, a firewall) costs the stop this
// much, once per address; a backend that is there answers a connect in well under a millisecond.
constexpr std::chrono::milliseconds kNoticeConnectTimeout{200};

std::uint64_t new_token() {
  static std::random_device rd;
  std::uint64_t t = 0;
  while (t == 0) t = (std::uint64_t{rd()} << 32) | rd();
  return t;
}

// Waits until the QP in SQD has no send in flight, at most `timeout`.
bool drained(nicdrv::QueuePair& q, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    auto a = q.query();
    if (a && a->qp_state == QpState::sqd && a->sq_draining == 0) return true;
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

std::string gid_ip(const std::array<std::uint8_t, 16>& gid) {
  auto a = notice::notice_address(gid);
  return a ? notice::to_string(*a) : fmt::format("GID {} (no address notices can reach)", nicdrv::Gid{gid}.str());
}

}  // namespace

// ---- the mover ------------------------------------------------------------------------------------

std::vector<DeviceState::Impl::PausedPeer> DeviceState::Impl::pause_peers(
    const std::unordered_map<std::uint32_t, nicdrv::QpAttr>& attrs) {
  std::vector<PausedPeer> out;
  if (!opts.notices) return out;
  std::set<notice::Address> silent;  // addresses where no backend answered
  for (auto& [h, qp] : d.qps) {
    const auto& b = attrs.at(h);
    if (qp.type != nicdrv::QpType::rc || qp.local_peer || b.qp_state != QpState::rts) continue;
    auto to = notice::notice_address(b.ah_attr.dgid.raw);
    auto sg = d.engine->query_gid(b.ah_attr.sgid_index, b.port_num == 0 ? 1 : b.port_num);
    if (!to || !sg.ok() || silent.count(*to) != 0) continue;
    auto from = notice::notice_address(sg->gid.raw);
    if (!from || notice::is_ipv4(*from) != notice::is_ipv4(*to)) continue;
    notice::Message m;
    m.kind = Kind::pause;
    m.peer_qpn = b.dest_qp_num;
    m.mover_qpn = qp.eng->qp_num();
    m.mover_gid = sg->gid.raw;
    const auto t0 = Clock::now();
    auto ans = notice::exchange(*from, *to, opts.notice_port, m, std::chrono::milliseconds(opts.drain_timeout_ms + 500),
                                kNoticeConnectTimeout);
    if (!ans) {
      silent.insert(*to);
      log::info("virtio-rdma: QP {}: no vrdma backend at {} port {} paused its peer ({}); a peer there sees its retries "
                "run out after the move",
                h, notice::to_string(*to), opts.notice_port, ans.error().message);
      continue;
    }
    if (ans->kind != Kind::paused || ans->token == 0) {
      log::warn("virtio-rdma: QP {}: the backend at {} did not pause its peer QPN {:#x}: {}", h, notice::to_string(*to),
                m.peer_qpn,
                ans->kind == Kind::refused  ? ans->reason
                : ans->kind == Kind::paused ? std::string("it answered PAUSED without a token")
                                            : std::string("it answered ") + notice::to_string(ans->kind));
      continue;
    }
    PausedPeer p;
    p.handle = h;
    p.from = *from;
    p.to = *to;
    p.peer_qpn = m.peer_qpn;
    p.mover_qpn = m.mover_qpn;
    p.mover_gid = m.mover_gid;
    p.token = ans->token;
    out.push_back(p);
    ++st.peers_paused;
    log::info("virtio-rdma: QP {}: the backend at {} paused its peer QPN {:#x} (its send PSN {:#x}) in {:.1f} ms", h,
              notice::to_string(*to), m.peer_qpn, ans->sq_psn,
              std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return out;
}

void DeviceState::Impl::release_peers(const std::vector<PausedPeer>& peers) {
  for (const auto& p : peers) {
    notice::Message m;
    m.kind = Kind::release;
    m.peer_qpn = p.peer_qpn;
    m.mover_qpn = p.mover_qpn;
    m.mover_gid = p.mover_gid;
    m.token = p.token;
    auto ans = notice::exchange(p.from, p.to, opts.notice_port, m, std::chrono::milliseconds(1000), kNoticeConnectTimeout);
    if (!ans || ans->kind != Kind::released)
      log::warn("virtio-rdma: QP {}: the backend at {} did not let its peer QPN {:#x} go after the abandoned stop ({}); "
                "it does so by itself after its hold time",
                p.handle, notice::to_string(p.to), p.peer_qpn,
                !ans ? ans.error().message : ans->kind == Kind::refused ? ans->reason : notice::to_string(ans->kind));
  }
}

std::optional<std::uint32_t> DeviceState::Impl::repoint_peer(std::uint32_t handle, const QpObj& qp, const rebuild::Record& r) {
  notice::Message m;
  m.kind = Kind::repoint;
  m.peer_qpn = r.dest_qp_num;
  m.mover_qpn = qp.eng->qp_num();
  m.mover_gid = r.sgid;
  m.token = r.notice_token;
  m.sq_psn = r.sq_psn;
  m.rq_psn = r.rq_psn;
  m.rkeys.assign(d.rkey_to_engine.begin(), d.rkey_to_engine.end());
  const auto from = notice::notice_address(r.sgid).value_or(notice::Address{});
  const auto t0 = Clock::now();
  auto ans = notice::exchange(from, r.notice_addr, r.notice_port, m, std::chrono::milliseconds(opts.drain_timeout_ms + 500),
                              kNoticeConnectTimeout);
  if (!ans || ans->kind != Kind::repointed) {
    log::warn("virtio-rdma: QP {}: the backend at {} did not re-point its peer QPN {:#x} to the new QPN {:#x} ({}); that "
              "peer sees its retries run out",
              handle, notice::to_string(r.notice_addr), m.peer_qpn, m.mover_qpn,
              !ans ? ans.error().message : ans->kind == Kind::refused ? ans->reason : notice::to_string(ans->kind));
    return std::nullopt;
  }
  ++st.peers_repointed;
  log::info("virtio-rdma: QP {} (QPN {:#x}, now {:#x}): the backend at {} re-connected its peer QPN {:#x}{} ({} rkeys "
            "translated there) in {:.1f} ms",
            handle, qp.guest_qpn, m.mover_qpn, notice::to_string(r.notice_addr), m.peer_qpn,
            ans->peer_qpn == m.peer_qpn ? std::string() : fmt::format(", now {:#x}", ans->peer_qpn), m.rkeys.size(),
            std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  return ans->peer_qpn;
}

// ---- the peer -------------------------------------------------------------------------------------

notice::Message DeviceState::Impl::answer_notice(const notice::Message& m, const notice::Address& from) {
  auto refuse = [&](const std::string& why) {
    ++st.notices_refused;
    log::warn("virtio-rdma: a {} notice from {} for QPN {:#x} refused: {}", notice::to_string(m.kind),
              notice::to_string(from), m.peer_qpn, why);
    notice::Message r;
    r.kind = Kind::refused;
    r.peer_qpn = m.peer_qpn;
    r.mover_qpn = m.mover_qpn;
    r.reason = why;
    return r;
  };
  if (m.kind != Kind::pause && m.kind != Kind::repoint && m.kind != Kind::release)
    return refuse(fmt::format("a {} is an answer, not a request", notice::to_string(m.kind)));
  if (!opts.notices) return refuse("this vrdmad does not take peer notices (it runs without --notices)");
  if (d.paused) return refuse("this vrdmad's guest is stopped (it is moving itself); its own move re-points its peers");
  auto q = d.qp_by_engine_qpn.find(m.peer_qpn);
  if (q == d.qp_by_engine_qpn.end() || d.qps.count(q->second) == 0)
    return refuse(fmt::format("no QP here has QPN {:#x}", m.peer_qpn));
  const auto h = q->second;
  auto& qp = d.qps[h];
  if (qp.type != nicdrv::QpType::rc) return refuse(fmt::format("QP {} is not a reliable connection", h));
  auto b = qp.eng->query();
  if (!b) return refuse(fmt::format("QP {}: {}", h, b.error().message));
  notice::Message ans;
  if (m.kind == Kind::pause) {
    ans = pause_for_peer(h, qp, *b, m, from);
  } else {
    if (qp.peer_token == 0 || m.token != qp.peer_token)
      return refuse(fmt::format("QP {}: the token is not the one its pause gave", h));
    if (notice::notice_address(m.mover_gid) != from)
      return refuse(fmt::format("QP {}: a {} comes from the moved QP's own address ({}), not {}", h,
                                notice::to_string(m.kind), gid_ip(m.mover_gid), notice::to_string(from)));
    if (m.kind == Kind::repoint) {
      ans = repoint_for_peer(h, qp, *b, m);
    } else {
      if (held_for_peer.count(h) == 0) return refuse(fmt::format("QP {} is not paused", h));
      if (auto s = resume_after_hold(h, qp); !s.ok()) return refuse(s.error().message);
      log::info("virtio-rdma: QP {}: its peer at {} abandoned its move; its sends go on", h, notice::to_string(from));
      ans.kind = Kind::released;
      ans.peer_qpn = m.peer_qpn;
      ans.token = m.token;
    }
  }
  if (ans.kind == Kind::refused) return refuse(ans.reason);
  ++st.notices_answered;
  return ans;
}

notice::Message DeviceState::Impl::pause_for_peer(std::uint32_t h, QpObj& qp, const nicdrv::QpAttr& attr,
                                                 const notice::Message& m, const notice::Address& from) {
  notice::Message no;
  no.kind = Kind::refused;
  if (held_for_peer.count(h) != 0) {
    no.reason = fmt::format("QP {} is paused already", h);
    return no;
  }
  if (attr.qp_state != QpState::rts) {
    no.reason = fmt::format("QP {} is in {}, not RTS", h, nicdrv::to_string(attr.qp_state));
    return no;
  }
  if (attr.dest_qp_num != m.mover_qpn || attr.ah_attr.dgid.raw != m.mover_gid) {
    no.reason = fmt::format("QP {} is connected to QPN {:#x} at {}, not to QPN {:#x} at {}", h, attr.dest_qp_num,
                            attr.ah_attr.dgid.str(), m.mover_qpn, nicdrv::Gid{m.mover_gid}.str());
    return no;
  }
  if (notice::notice_address(m.mover_gid) != from) {
    no.reason = fmt::format("QP {}: a pause comes from the address its peer has ({}), not {}", h, gid_ip(m.mover_gid),
                            notice::to_string(from));
    return no;
  }
  if (auto why = hold_and_drain(h, qp)) {
    no.reason = *why;
    return no;
  }
  auto after = qp.eng->query();
  if (!after) {
    (void)resume_after_hold(h, qp);
    no.reason = fmt::format("QP {}: {}", h, after.error().message);
    return no;
  }
  qp.peer_token = new_token();
  arm_hold_timer();
  ++st.qps_paused;
  log::info("virtio-rdma: QP {} (QPN {:#x}) paused for its peer QPN {:#x} at {}, which is moving: send ring held, "
            "sends drained (send PSN {:#x}, expected {:#x})",
            h, qp.guest_qpn, m.mover_qpn, notice::to_string(from), after->sq_psn & 0xffffff, after->rq_psn & 0xffffff);
  notice::Message ans;
  ans.kind = Kind::paused;
  ans.peer_qpn = m.peer_qpn;
  ans.mover_qpn = m.mover_qpn;
  ans.token = qp.peer_token;
  ans.sq_psn = after->sq_psn & 0xffffff;
  ans.rq_psn = after->rq_psn & 0xffffff;
  return ans;
}

notice::Message DeviceState::Impl::repoint_for_peer(std::uint32_t h, QpObj& qp, const nicdrv::QpAttr& attr,
                                                   const notice::Message& m) {
  notice::Message no;
  no.kind = Kind::refused;
  // A re-point without a pause before it (the source after a failed move, which re-pointed this
  // QP to the destination already): what the NIC has in flight drains first.
  if (held_for_peer.count(h) == 0) {
    log::info("virtio-rdma: QP {}: re-pointed while not paused (its hold ended, or the source re-points after a move "
              "that failed): it drains first",
              h);
    if (attr.qp_state == QpState::rts) {
      if (auto why = hold_and_drain(h, qp)) {
        no.reason = *why;
        return no;
      }
    } else {
      hold(h, qp);
    }
  }
  const auto t0 = Clock::now();
  // Stop this QP as a move stops it (rebuild.cpp), then bring the same QP (its QPN kept, on any
  // engine) through RESET up again toward the new QPN.
  nicdrv::QpAttr a;
  a.qp_state = QpState::err;
  if (auto s = qp.eng->modify(a, M::state); !s.ok()) {
    (void)resume_after_hold(h, qp);
    no.reason = fmt::format("QP {} cannot be stopped (-> ERR): {}", h, s.error().message);
    return no;
  }
  let_go(h, qp);
  auto fail = [&](const std::string& why) {
    log::error("virtio-rdma: QP {} is lost after its peer moved: {}", h, why);
    d.queue_event(vd::EventType::qp_fatal, h, static_cast<std::uint32_t>(nicdrv::WcStatus::fatal_err));
    no.reason = fmt::format("QP {} could not be re-created: {}", h, why);
    return no;
  };
  auto after = qp.eng->query();
  if (!after) return fail(after.error().message);
  std::unordered_map<std::uint32_t, std::uint32_t> expect;
  if (qp.srq == 0 && qp.rq.consumed != qp.rq_done) expect[h] = qp.rq.consumed - qp.rq_done;
  if (auto s = collect_after_stop(expect, {h}); !s.ok()) return fail(s.error().message);
  auto r = record_of(qp, attr, *after);
  r.state = static_cast<std::uint8_t>(QpState::rts);
  r.dest_qp_num = m.mover_qpn;
  r.dgid = m.mover_gid;
  r.rq_psn = m.sq_psn;  // what the mover sends next
  r.local_peer = 0;
  r.guest_dest_qpn = qp.guest_dest_qpn != 0 ? qp.guest_dest_qpn : attr.dest_qp_num;
  r.recv_outstanding = qp.srq != 0 ? 0 : qp.rq.consumed - qp.rq_done;
  if (m.rq_psn != r.sq_psn)
    log::warn("virtio-rdma: QP {}: the moved peer expects PSN {:#x}, this QP sends {:#x} next", h, m.rq_psn, r.sq_psn);
  if (auto s = reset_for_rebuild(h, qp, rebuild::encode(r)); !s.ok()) return fail(s.error().message);
  if (auto s = finish_rebuilds(); !s.ok()) return fail(s.error().message);
  qp.remote_rkeys.clear();
  for (const auto& [guest, nic] : m.rkeys)
    if (guest != nic) qp.remote_rkeys[guest] = nic;
  ++st.qps_repointed;
  check_state_area();  // the translations travel in the state if this guest moves too
  d.drain_all();         // the completions taken from the CQs at the stop go to the guest now
  d.write_status(d.view(), qp.status_gpa, qp.sq.consumed, qp.rq.consumed, static_cast<std::uint32_t>(qp.eng->state()));
  d.retry_pending();
  log::info("virtio-rdma: QP {} (QPN {:#x}) re-connected toward its moved peer QPN {:#x} at {} in {:.1f} ms "
            "({} of its rkeys translated)",
            h, qp.guest_qpn, m.mover_qpn, gid_ip(m.mover_gid),
            std::chrono::duration<double, std::milli>(Clock::now() - t0).count(), qp.remote_rkeys.size());
  notice::Message ans;
  ans.kind = Kind::repointed;
  ans.peer_qpn = qp.eng->qp_num();
  ans.mover_qpn = m.mover_qpn;
  ans.token = m.token;
  return ans;
}

std::optional<std::string> DeviceState::Impl::hold_and_drain(std::uint32_t h, QpObj& qp) {
  nicdrv::QpAttr a;
  a.qp_state = QpState::sqd;
  if (auto s = qp.eng->modify(a, M::state); !s.ok())
    return fmt::format("QP {} cannot drain its sends (RTS -> SQD): {}", h, s.error().message);
  hold(h, qp);
  if (!drained(*qp.eng, std::chrono::milliseconds(opts.drain_timeout_ms))) {
    (void)resume_after_hold(h, qp);
    return fmt::format("QP {}: its sends in flight were not acknowledged within {} ms", h, opts.drain_timeout_ms);
  }
  return std::nullopt;
}

void DeviceState::Impl::hold(std::uint32_t h, QpObj& qp) {
  held_for_peer[h] = Clock::now() + std::chrono::milliseconds(opts.hold_timeout_ms);
  qp.send_held = true;
}

void DeviceState::Impl::let_go(std::uint32_t h, QpObj& qp) {
  held_for_peer.erase(h);
  qp.send_held = false;
}

Status DeviceState::Impl::resume_after_hold(std::uint32_t h, QpObj& qp) {
  let_go(h, qp);
  if (qp.eng->state() == QpState::sqd) {
    nicdrv::QpAttr a;
    a.qp_state = QpState::rts;
    if (auto s = qp.eng->modify(a, M::state); !s.ok())
      return prefixed(fmt::format("QP {} cannot send again (SQD -> RTS): ", h), s.error());
  }
  if (qp.sq.produced != qp.sq.consumed) d.pending_sq.insert(h);
  d.retry_pending();
  return {};
}

void DeviceState::Impl::expire_holds() {
  const auto now = Clock::now();
  std::vector<std::uint32_t> due;
  for (const auto& [h, until] : held_for_peer)
    if (until <= now) due.push_back(h);
  for (auto h : due) {
    auto it = d.qps.find(h);
    if (it == d.qps.end()) {
      held_for_peer.erase(h);
      continue;
    }
    log::warn("virtio-rdma: QP {}: its moving peer said nothing within {} ms of the pause; its sends go on toward the "
              "peer's old QPN",
              h, opts.hold_timeout_ms);
    if (auto s = resume_after_hold(h, it->second); !s.ok()) log::error("virtio-rdma: {}", s.error().message);
  }
  arm_hold_timer();
}

void DeviceState::Impl::arm_hold_timer() {
  if (!hold_timer) {
    hold_timer = UniqueFd(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
    if (!hold_timer) return;
    auto w = d.loop.add(hold_timer.get(), EPOLLIN, [this](std::uint32_t) {
      std::uint64_t n;
      [[maybe_unused]] auto r = ::read(hold_timer.get(), &n, sizeof n);
      expire_holds();
    });
    if (!w.ok()) log::error("virtio-rdma: the hold timer cannot be watched: {}", w.error().message);
  }
  itimerspec its{};
  if (!held_for_peer.empty()) {
    auto first = Clock::time_point::max();
    for (const auto& [h, until] : held_for_peer) first = std::min(first, until);
    const auto ns = std::max<std::int64_t>(
        1000, std::chrono::duration_cast<std::chrono::nanoseconds>(first - Clock::now()).count());
    its.it_value.tv_sec = ns / 1000000000;
    its.it_value.tv_nsec = ns % 1000000000;
  }
  ::timerfd_settime(hold_timer.get(), 0, &its, nullptr);
}

}  // namespace vrdma::migration
