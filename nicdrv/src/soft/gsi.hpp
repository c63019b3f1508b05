// The soft engine's QP1 (General Services Interface, IBA vol 1 13.5) and the Communication
// Manager agent behind it: receives and sends CM MADs as RoCEv2 UD SEND ONLY packets (DETH
// Q_Key 0x80010000, source QP 1, P_Key 0xffff), keeps every connection's state machine
// (cm_state.hpp) by local communication ID, the listeners by service ID, and the timers.
//
// Threading: everything here is guarded by SoftDevice::mu_. The engine thread calls on_packet,
// on_timers and on_qp_traffic; API threads (cm.cpp) create connections and wait on `cv` (with
// mu_) for their state to change. Every change notifies `cv`.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <random>

#include "vrdma/nicdrv/proto/cm_state.hpp"
#include "vrdma/nicdrv/proto/mad.hpp"
#include "vrdma/nicdrv/proto/wire.hpp"

namespace vrdma::nicdrv::soft {

class SoftDevice;

struct CmStats {
  std::uint64_t mads_received = 0, mads_sent = 0, mads_dropped = 0, resends = 0;
};

class GsiAgent {
 public:
  explicit GsiAgent(SoftDevice& dev);

  struct Entry {
    cm::Conn conn;
    std::uint32_t peer_ip_be = 0;
    std::uint64_t tid = 0;
    bool app_owned = true;  // a CmConnection refers to it (else it is reaped once closed)
  };
  struct Listener {
    std::deque<std::uint32_t> pending;  // local IDs of requests not yet handed out
    std::size_t backlog = 16;
  };

  // ---- engine thread (mu_ held) ----
  // A packet for QP 1: checked (UD SEND, Q_Key, 256-byte MAD) and dispatched.
  void on_packet(const wire::Packet& pkt, std::uint32_t src_ip_be);
  void on_timers(cm::TimePoint now);
  [[nodiscard]] bool has_timers() const noexcept;
  // A packet arrived on an RC QP whose connection waits for RTU.
  void on_qp_traffic(std::uint32_t qpn);

  // ---- API threads (mu_ held) ----
  std::uint32_t new_local_id();
  std::uint32_t random_psn() { return static_cast<std::uint32_t>(rng_()) & wire::kPsnMask; }
  std::uint64_t new_tid() { return rng_(); }
  // Sends `m` to QP1 at `dst_ip_be` and flushes the transmit batch.
  void send(std::uint32_t dst_ip_be, std::uint64_t tid, const mad::Message& m);
  // Applies a reaction of `e`'s state machine: sends, moves the QP to ERR, wakes waiters.
  void apply(Entry& e, const cm::Reaction& r);
  Entry* find(std::uint32_t local_id);

  std::map<std::uint32_t, Entry> conns;          // by local communication ID
  std::map<std::uint64_t, Listener> listeners;   // by service ID
  std::condition_variable cv;
  CmStats stats;
  // Service timeout of the MRA we send as soon as a REQ is queued for the application (as the
  // kernel's cma does): 4.096 us * 2^21 = 8.6 s for the application to accept.
  static constexpr std::uint8_t kMraServiceTimeout = 21;

 private:
  void on_mad(const mad::Mad& m, std::uint32_t src_ip_be, cm::TimePoint now);
  void on_req(const mad::Mad& m, std::uint32_t src_ip_be, cm::TimePoint now);
  void reply_rej(std::uint32_t dst_ip_be, std::uint64_t tid, std::uint32_t their_id, std::uint8_t msg_rejected,
                 mad::RejReason reason);
  void qp_to_error(std::uint32_t qpn);

  SoftDevice& dev_;
  std::mt19937_64 rng_;
  std::uint32_t psn_ = 0;  // BTH PSN of our UD sends (ignored by UD receivers, kept increasing)
};

}  // namespace vrdma::nicdrv::soft
