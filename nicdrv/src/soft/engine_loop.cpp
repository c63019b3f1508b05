// The engine's rounds of work: packet output (batched, with UDP segmentation offload), packet
// input (cutting segmentation runs back into packets), the timer queue, the engine thread's loop
// and the same work done on application threads (see the threading notes in engine.hpp).
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "soft/engine.hpp"
#include "soft/gsi.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::nicdrv::soft {
namespace {

// While an application polled an unarmed CQ this recently, the engine thread leaves the socket
// to it (and checks again at the end of this window).
constexpr auto kAppPollWindow = std::chrono::milliseconds(1);
// Every QP's timers are also looked at this often: a safety net under the timer queue.
constexpr auto kTimerSweep = std::chrono::milliseconds(50);
constexpr auto kIdleSleep = std::chrono::milliseconds(100);
// ACKs an application thread left for its next post or poll: sent by the engine after this.
constexpr auto kAckDelay = std::chrono::microseconds(200);

std::int64_t ns_since_epoch(TimePoint t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

std::uint32_t get24(const std::uint8_t* p) { return (std::uint32_t{p[0]} << 16) | (std::uint32_t{p[1]} << 8) | p[2]; }

}  // namespace

// ---- Packet output ------------------------------------------------------------------------------
std::uint8_t* SoftDevice::tx_alloc(std::uint32_t dst_ip_be) {
  if (tx_count_ == kTxSlots) tx_flush();
  tx_[tx_count_].dst_ip_be = dst_ip_be;
  return tx_[tx_count_].data;
}

void SoftDevice::tx_commit(std::size_t len) {
  tx_[tx_count_].len = static_cast<std::uint32_t>(len);
  ++tx_count_;
}

std::uint8_t* SoftDevice::pkt_begin(std::uint32_t dst_ip_be, wire::Headers& h, std::size_t payload_len, bool full) {
  std::uint8_t* buf = tx_alloc(dst_ip_be);
  h.bth.pkey = pkey_;  // every QP's partition: the table's one entry
  pkt_hdr_len_ = wire::encode_headers(h, payload_len, std::span<std::uint8_t>(buf, kPktBuf));
  pkt_payload_len_ = payload_len;
  pkt_full_ = full;
  pkt_open_ = true;
  return buf + pkt_hdr_len_;
}

void SoftDevice::pkt_end() {
  if (!pkt_open_) return;
  pkt_open_ = false;
  // Pad and ICRC are written by tx_flush, which knows the IPv4 ID each packet will carry.
  tx_[tx_count_].full = pkt_full_;
  tx_commit(pkt_hdr_len_ + pkt_payload_len_);
}

void SoftDevice::tx_flush() {
  if (tx_count_ == 0) return;
  const bool gso = link_->gso();
  // Wire length of a packet whose headers and payload are in place (its pad is in the BTH).
  auto wire_len = [&](std::size_t i) { return tx_[i].len + ((tx_[i].data[1] >> 4) & 3u) + wire::kIcrcLen; };
  for (std::size_t i = 0; i < tx_count_;) {
    // A run: full-MTU packets of one length to one destination, then at most one shorter.
    std::size_t n = 1;
    if (gso && tx_[i].full) {
      const std::size_t seg = wire_len(i);
      std::size_t total = seg;
      while (i + n < tx_count_ && n < kMaxGsoSegs && tx_[i + n].dst_ip_be == tx_[i].dst_ip_be) {
        const std::size_t len = wire_len(i + n);
        if (len > seg || total + len > kMaxUdpPayload) break;
        total += len;
        ++n;
        if (len < seg) break;
      }
    }
    for (std::size_t k = 0; k < n; ++k) {
      TxPacket& p = tx_[i + k];
      wire::Ipv4Context ip = ip_ctx(p.dst_ip_be);
      ip.ip_id = static_cast<std::uint16_t>(n > 1 ? k : 0);  // inet_gso_segment numbers the segments
      p.len = static_cast<std::uint32_t>(wire::finish_packet(ip, std::span<std::uint8_t>(p.data, kPktBuf), p.len));
      p.gso_segs = k == 0 ? static_cast<std::uint16_t>(n) : 0;
      ++st.tx_packets;
      st.tx_bytes += p.len;
    }
    if (n > 1) ++st.tx_gso_runs;
    i += n;
  }
  link_->send(std::span<TxPacket>(tx_.data(), tx_count_));
  tx_count_ = 0;
}

void SoftDevice::flush_acks() {
  for (SoftQp* qp : acks) {
    const QpState s = qp->state();
    if (qp->ack_pending && (s == QpState::rtr || s == QpState::rts || s == QpState::sqd))
      send_ack(*qp, wire::AckType::ack, wire::kCreditInvalid, qp->ack_psn);
    qp->ack_pending = false;
  }
  acks.clear();
}

// ---- Packet input -------------------------------------------------------------------------------
// Whether `d` begins like a packet for one of our QPs: a known opcode, transport version 0, a
// destination QP that exists. A run's later segments do; a payload does so by chance one time in
// well over 2^24 (and a peer that forges one only spoils its own packet).
bool SoftDevice::starts_a_packet_here(const std::uint8_t* d, std::size_t len) const {
  if (len < wire::kBthLen || !wire::info(static_cast<wire::Opcode>(d[0])).valid || (d[1] & 0x0f) != 0) return false;
  auto it = qps.find(get24(d + 5));
  return it != qps.end() && it->second != nullptr;
}

void SoftDevice::handle_datagram(RxPacket& p) {
  // A segmentation run that nobody cut (veth and loopback carry it whole) is longer than one
  // packet of its first packet's opcode can be on that QP. Its segment size is what UDP_GRO
  // said, or else that packet's headers plus the QP's path MTU plus the ICRC: senders put only
  // full path-MTU packets first in a run (see kMaxGsoSegs).
  std::size_t seg = 0;
  if (p.gso_size != 0) {
    if (p.len > p.gso_size) seg = p.gso_size;
  } else if (p.len >= wire::kBthLen) {
    auto it = qps.find(get24(p.data + 5));
    if (it != qps.end() && it->second != nullptr)
      seg = wire::run_segment_size(std::span<const std::uint8_t>(p.data, p.len), it->second->pmtu());
    // Unless a packet for a QP here starts where the second one would, this is ONE packet longer
    // than the QP's path MTU (a peer at a larger path MTU; Linux rxe 6.1 sends such): cut, it
    // would fail the ICRC piece by piece, unanswered, until the peer's retries ran out. Whole,
    // the responder refuses it as IBA's length error and counts it (rx_longer_than_mtu).
    if (seg != 0 && !starts_a_packet_here(p.data + seg, p.len - seg)) seg = 0;
  }
  if (seg == 0) {
    handle_rx(p);
    return;
  }
  ++st.rx_gso_runs;
  const std::uint32_t total = p.len;
  std::uint8_t* const base = p.data;
  const std::uint16_t id0 = p.ip_id;
  std::uint16_t k = 0;
  // Segment k carries ID id0 + k once cut (inet_gso_segment). GRO also merges packets that all
  // carry one ID (DF set, IBA senders like us use ID 0): a segment whose ICRC fails with
  // id0 + k is tried with id0 (handle_rx), never more than that.
  for (std::uint32_t off = 0; off < total; off += static_cast<std::uint32_t>(seg), ++k) {
    p.data = base + off;
    p.len = static_cast<std::uint32_t>(std::min<std::size_t>(seg, total - off));
    p.ip_id = static_cast<std::uint16_t>(id0 + k);
    p.alt_ip_id = k > 0 ? id0 : -1;
    handle_rx(p);
  }
  p.data = base;
  p.alt_ip_id = -1;
}

// ---- Timers -------------------------------------------------------------------------------------
void SoftDevice::arm_timer(SoftQp& qp, TimePoint t) {
  if (t >= qp.timer_at) return;  // an earlier entry is queued: it re-arms when it fires
  qp.timer_at = t;
  timers_.emplace(t, qp.qp_num());
  if (ns_since_epoch(t) < sleep_until_ns_.load(std::memory_order_acquire)) kick();
}

void SoftDevice::rearm(SoftQp& qp) {
  TimePoint t = TimePoint::max();
  if (qp.retx_deadline != TimePoint{}) t = qp.retx_deadline;
  if (qp.rnr_wait) t = std::min(t, qp.rnr_deadline);
  if (qp.probe_deadline != TimePoint{}) t = std::min(t, qp.probe_deadline);
  if (t != TimePoint::max()) arm_timer(qp, t);
}

void SoftDevice::run_timers(TimePoint now) {
  while (!timers_.empty() && timers_.top().first <= now) {
    auto [t, qpn] = timers_.top();
    timers_.pop();
    auto it = qps.find(qpn);
    if (it == qps.end() || it->second == nullptr) continue;  // destroyed since
    SoftQp& qp = *it->second;
    if (t >= qp.timer_at) qp.timer_at = TimePoint::max();
    timers_run(qp, now);
    rearm(qp);
  }
  if (gsi->has_timers()) gsi->on_timers(now);
  if (now >= next_timer_sweep_) {
    for (auto& [n, qp] : qps)
      if (qp != nullptr) {
        timers_run(*qp, now);
        rearm(*qp);
      }
    gsi->on_timers(now);
    next_timer_sweep_ = now + kTimerSweep;
  }
}

// ---- Rounds of work -----------------------------------------------------------------------------
bool SoftDevice::work_round(int rx_batches, bool defer_acks) {
  bool work = false;
  // Receive first: ACKs free send window and RNR/NAKs redirect the requester.
  for (int rounds = 0; rounds < rx_batches; ++rounds) {
    std::size_t n = link_->recv(std::span<RxPacket>(rx_.data(), kRxSlots));
    for (std::size_t i = 0; i < n; ++i) handle_datagram(rx_[i]);
    if (!defer_acks) flush_acks();
    if (n > 0) work = true;
    if (n < kRxSlots) break;
  }
  // Swap with a scratch list (both keep their capacity: no allocation per round).
  round_list_.swap(active);
  active.clear();
  for (SoftQp* qp : round_list_) {
    qp->queued = false;
    if (qp->flush_pending) flush_queues(*qp);
    bool more = false;
    if (qp->state() == QpState::rts || qp->state() == QpState::sqd) {
      auto before = qp->sq_next;
      auto psn_before = qp->send_psn;
      requester_run(*qp, 32);
      if (qp->sq_next != before || qp->send_psn != psn_before) work = true;
      more = qp->sq_next != qp->sq_tail && !qp->rnr_wait;
    }
    if (qp->state() != QpState::err && qp->state() != QpState::reset && qp->reads_pending()) {
      work = true;
      more = responder_run_reads(*qp, 32) || more;
    }
    if (more) mark_active(*qp);
  }
  round_list_.clear();
  tx_flush();
  return work;
}

bool SoftDevice::engine_round() {
  std::lock_guard lk(mu_);
  if (quiesced) {
    tx_flush();
    return false;
  }
  run_timers(Clock::now());
  return work_round(4, false);
}

bool SoftDevice::send_now(SoftQp& qp) {
  if (quiesced) return true;
  bool left = false;
  if (qp.state() == QpState::rts || qp.state() == QpState::sqd) left = requester_run(qp, 64);
  flush_acks();  // ACKs owed to the peer ride in the same batch
  tx_flush();
  return left || qp.flush_pending;
}

bool SoftDevice::progress(bool cq_armed) {
  if (!cq_armed) app_poll_ns_.store(ns_since_epoch(Clock::now()), std::memory_order_release);
  std::unique_lock lk(mu_, std::try_to_lock);
  if (!lk.owns_lock() || quiesced) return false;
  // ACKs for what this round receives wait for the application's answer (post_send sends them
  // in the same batch: a ping-pong reply then leaves one send call earlier) or for the next
  // poll, which sends what the previous one left; the engine thread sends any left after that.
  flush_acks();
  return work_round(1, true);
}

void SoftDevice::app_waits() noexcept {
  if (app_poll_ns_.exchange(0, std::memory_order_acq_rel) != 0) kick();
}

void SoftDevice::engine_main() {
  while (running_.load(std::memory_order_acquire)) {
    if (engine_round()) continue;
    if (busy_poll_) continue;
    sleeping_.store(true, std::memory_order_seq_cst);
    const TimePoint now = Clock::now();
    TimePoint wake = now + kIdleSleep;
    int sock = -1;
    {
      std::lock_guard lk(mu_);
      // Quiesced: packets wait in the socket until resume() (which kicks us).
      if (!quiesced) sock = link_->fd();
      if (!active.empty() && !quiesced) {
        sleeping_.store(false);
        continue;
      }
      if (!timers_.empty()) wake = std::min(wake, timers_.top().first);
      wake = std::min(wake, next_timer_sweep_);
      if (gsi->has_timers()) wake = std::min(wake, now + std::chrono::milliseconds(1));
      if (!acks.empty()) wake = std::min(wake, now + kAckDelay);
    }
    // Read after `sleeping_` is set: app_waits() then either is seen here or kicks us.
    const std::int64_t polled = app_poll_ns_.load(std::memory_order_acquire);
    const bool app_polls = polled != 0 && ns_since_epoch(now) - polled < std::chrono::nanoseconds(kAppPollWindow).count();
    if (app_polls) wake = std::min(wake, TimePoint(std::chrono::nanoseconds(polled)) + kAppPollWindow);
    sleep_until_ns_.store(ns_since_epoch(wake), std::memory_order_release);
    auto left = std::max<std::chrono::nanoseconds>(wake - Clock::now(), std::chrono::nanoseconds(0));
    timespec ts{static_cast<time_t>(left.count() / 1000000000), static_cast<long>(left.count() % 1000000000)};
    pollfd fds[2] = {{wake_fd_.get(), POLLIN, 0}, {sock, POLLIN, 0}};
    int n = ::ppoll(fds, app_polls || sock < 0 ? 1 : 2, &ts, nullptr);
    sleep_until_ns_.store(0, std::memory_order_release);
    sleeping_.store(false, std::memory_order_release);
    if (n > 0 && (fds[0].revents & POLLIN) != 0) {
      std::uint64_t v;
      [[maybe_unused]] auto r = ::read(wake_fd_.get(), &v, sizeof v);
    }
  }
}

}  // namespace vrdma::nicdrv::soft
