// Internals of the soft RoCEv2 engine.
//
// Threading model: each SoftDevice owns one engine thread. All protocol state (QPs, MR table,
// responder resources, timers) is guarded by SoftDevice::mu_. API calls take mu_ briefly to post
// or modify; the engine thread takes it for each round of work and drops it only to sleep.
// CQs have their own lock so that polling never waits for the engine.
//
// Work also runs on the application's threads, so that a busy-polling application needs no
// thread switch per message (on a shared core a switch costs more than the protocol itself):
// post_send transmits what it posted right away, and CompletionQueue::poll on a CQ with fewer
// completions than asked for does a round of receive work if the device lock is free (try_lock,
// never waiting). While an application polls an unarmed CQ the engine thread leaves the socket
// to it and sleeps on its doorbell and timers only; req_notify (or 1 ms without a poll) gives the
// socket back to the engine thread.
//
// Roles, one file each (as Linux rxe): requester.cpp builds and (re)transmits request packets,
// responder.cpp executes incoming requests and answers, completer.cpp handles ACKs, NAKs and
// responses and runs the retransmit/RNR timers; qp_state.cpp is the IBA QP state machine.
#pragma once

#include <sys/uio.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "vrdma/nicdrv/proto/wire.hpp"
#include "vrdma/common/fd.hpp"
#include "vrdma/nicdrv/device.hpp"
#include "vrdma/nicdrv/soft.hpp"

namespace vrdma::nicdrv::soft {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

class SoftDevice;
class SoftPd;
class SoftQp;
class GsiAgent;

inline constexpr std::size_t kMaxSge = 16;
inline constexpr std::uint32_t kMaxFastRegPages = 512;  // as Linux rxe's max_fast_reg_page_list_len
inline constexpr std::size_t kTxSlots = 64;
inline constexpr std::size_t kRxSlots = 64;
inline constexpr std::size_t kPktBuf = 4096 + 128;
// Unacknowledged packets in flight per QP: at most kSendWindowPkts, and after a loss a congestion
// window that halves on every loss (down to kMinSendWindowPkts) and grows back as ACKs come: a lost
// packet costs a go-back-N of what is in flight behind it, so under loss less is in flight.
inline constexpr std::uint32_t kSendWindowPkts = 512;
inline constexpr std::uint32_t kMinSendWindowPkts = 8;
// Re-read requests a responder queues besides its READs (IBA 9.7.5.1.4 duplicates asking for part
// of a READ again); more are dropped and the requester's timer asks again.
inline constexpr std::size_t kMaxReadReplays = 16;

// ---- Link: where packets go. UdpLink is the real socket; FaultLink wraps it for tests. -----------
// UDP segmentation offload (UDP_SEGMENT, "GSO"): a run of packets to one destination leaves in
// one send call and crosses veth/loopback as one buffer; a NIC or the receiving stack cuts it at
// the segment size, giving segment k the IPv4 ID of the first plus k (inet_gso_segment), so the
// ICRC of segment k is computed with that ID. We send with DF from an unconnected socket, so the
// first ID is 0. Runs hold full path-MTU packets only, so a receiver that gets the run whole
// (a raw socket does) can cut it again: the segment size is the first packet's header length
// plus its QP's path MTU plus the ICRC (SoftDevice::handle_datagram).
inline constexpr std::size_t kMaxGsoSegs = 64;           // UDP_MAX_SEGMENTS
inline constexpr std::size_t kMaxUdpPayload = 65535 - 20 - 8;
inline constexpr std::size_t kRxBuf = 65536;             // a whole run, as a raw socket shows it
// The largest single RoCE packet: headers (at most 40 bytes), 4096 bytes of payload, pad, ICRC.
inline constexpr std::size_t kMaxRocePacket = 40 + wire::kMaxPayload + 3 + wire::kIcrcLen;

struct TxPacket {
  std::uint32_t dst_ip_be = 0;
  std::uint8_t* data = nullptr;
  std::uint32_t len = 0;
  bool full = false;            // carries exactly one path MTU of payload: may start a GSO run
  std::uint16_t gso_segs = 0;   // set by tx_flush on a run's first packet: packets in the run
};
struct RxPacket {
  std::uint8_t* data = nullptr;
  std::uint32_t cap = 0;
  std::uint32_t len = 0;
  std::uint32_t src_ip_be = 0;
  std::uint16_t src_port = 0;
  std::uint16_t ip_id = 0;     // IPv4 identification and DF, which the ICRC covers (A17.3.3);
  bool dont_fragment = true;   // a plain UDP socket cannot see them (0 and DF is what we send)
  std::uint16_t gso_size = 0;  // several packets in one (UDP_GRO told the size; 0: unknown)
  std::int32_t alt_ip_id = -1; // a run's segment: the other IPv4 ID its ICRC may cover
};

class Link {
 public:
  virtual ~Link() = default;
  // Sends every packet (blocking briefly on a full socket buffer); returns how many went out.
  virtual std::size_t send(std::span<TxPacket> pkts) = 0;
  // Receives what is queued without blocking.
  virtual std::size_t recv(std::span<RxPacket> pkts) = 0;
  [[nodiscard]] virtual int fd() const = 0;
  // Whether send() honours TxPacket::gso_segs (else every packet leaves on its own).
  [[nodiscard]] virtual bool gso() const { return false; }
};

// `gso`: send runs with UDP_SEGMENT; `gro`: this socket receives (UDP_GRO: runs arrive whole).
std::unique_ptr<Link> make_udp_link(UniqueFd sock, std::uint16_t port, EngineStats& stats, bool gso, bool gro);
// Sends on `udp_sock` and receives from a raw socket that shows the IPv4 header (raw_rx.cpp).
// Takes the socket only on success; fails without CAP_NET_RAW.
Result<std::unique_ptr<Link>> make_raw_rx_link(UniqueFd& udp_sock, std::uint32_t ip_be, std::uint16_t port,
                                               EngineStats& stats, bool gso);
std::unique_ptr<Link> make_fault_link(std::unique_ptr<Link> inner, const FaultConfig& cfg, EngineStats& stats);

// ---- Objects ------------------------------------------------------------------------------------
class SoftMr final : public MemoryRegion {
 public:
  SoftMr(std::shared_ptr<SoftPd> pd, std::uint8_t* base, std::uint64_t len, Access acc, std::uint32_t key,
         std::shared_ptr<WriteObserver> obs, std::optional<std::uint64_t> iova, bool remote_invalidate)
      : pd_(std::move(pd)), base_(base), len_(len), acc_(acc), key_(key), obs_(std::move(obs)),
        iova_(iova.value_or(reinterpret_cast<std::uint64_t>(base))), remote_invalidate_(remote_invalidate) {}
  ~SoftMr() override;
  std::uint32_t lkey() const noexcept override { return key_.load(std::memory_order_relaxed); }
  std::uint32_t rkey() const noexcept override { return key_.load(std::memory_order_relaxed); }
  std::uint64_t addr() const noexcept override { return iova_; }
  std::uint64_t length() const noexcept override { return len_; }
  Access access() const noexcept override { return acc_; }

  // Host pointer for [va, va+len) if it lies inside the region, else nullptr.
  [[nodiscard]] std::uint8_t* at(std::uint64_t va, std::uint64_t len) const noexcept {
    std::uint64_t start = addr();
    if (va < start || len > len_ || va - start > len_ - len) return nullptr;
    return base_ + (va - start);
  }
  [[nodiscard]] const SoftPd* pd() const noexcept { return pd_.get(); }
  // A peer's SEND with Invalidate may end the region (MrOptions::remote_invalidate); once it
  // has, the keys name nothing (find_mr). Both guarded by the device's mu_.
  [[nodiscard]] bool remote_invalidate() const noexcept { return remote_invalidate_; }
  [[nodiscard]] bool valid() const noexcept override { return valid_; }
  void invalidate() noexcept { valid_ = false; }
  // A region for fast registration (SoftPd::alloc_mr): made invalid, with room for max_pages()
  // pages; REG_MR gives it memory (assign), LOCAL_INV takes it away (invalidate). Its address,
  // length and rights are the engine's to change (under mu_): read them through the API only
  // while no REG_MR of it is in flight.
  [[nodiscard]] bool fast() const noexcept { return max_pages_ != 0; }
  [[nodiscard]] std::uint32_t max_pages() const noexcept { return max_pages_; }
  void make_fast(std::uint32_t max_pages) noexcept {
    max_pages_ = max_pages;
    remote_invalidate_ = true;  // IBA 10.6.6: what a peer may invalidate is fast-registered
    valid_ = false;
  }
  void assign(std::uint8_t* base, std::uint64_t len, std::uint64_t iova, Access acc, std::uint32_t key) noexcept {
    base_ = base;
    len_ = len;
    iova_ = iova;
    acc_ = acc;
    key_.store(key, std::memory_order_relaxed);
    valid_ = true;
  }
  // Every engine write into the region goes through here (so the observer sees it).
  void write(std::uint8_t* dst, const void* src, std::size_t len) const noexcept {
    std::memcpy(dst, src, len);
    if (obs_) obs_->on_write(reinterpret_cast<std::uint64_t>(dst), len);
  }
  void wrote(const std::uint8_t* dst, std::size_t len) const noexcept {
    if (obs_) obs_->on_write(reinterpret_cast<std::uint64_t>(dst), len);
  }

 private:
  std::shared_ptr<SoftPd> pd_;
  std::uint8_t* base_;
  std::uint64_t len_;
  Access acc_;
  std::atomic<std::uint32_t> key_;
  std::shared_ptr<WriteObserver> obs_;
  std::uint64_t iova_;
  bool remote_invalidate_ = false;
  bool valid_ = true;
  std::uint32_t max_pages_ = 0;
};

class SoftCq final : public CompletionQueue, public std::enable_shared_from_this<SoftCq> {
 public:
  SoftCq(std::shared_ptr<SoftDevice> dev, std::uint32_t cqe, UniqueFd efd);
  Result<std::size_t> poll(std::span<WorkCompletion> out) override;
  Status req_notify(bool solicited_only) override;
  int event_fd() const noexcept override { return efd_.get(); }
  std::uint64_t ack_events() noexcept override;
  std::uint32_t capacity() const noexcept override { return cap_; }
  // Engine side: appends a completion; `solicited` marks a solicited receive.
  void push(const WorkCompletion& wc, bool solicited);
  [[nodiscard]] const SoftDevice* device() const noexcept { return dev_.get(); }

 private:
  std::shared_ptr<SoftDevice> dev_;
  std::uint32_t cap_;
  UniqueFd efd_;
  std::mutex mu_;
  std::vector<WorkCompletion> ring_;
  std::size_t head_ = 0, count_ = 0;
  bool overflow_ = false;
  int armed_ = 0;  // 0 off, 1 any, 2 solicited only
};

class SoftAh final : public AddressHandle {
 public:
  SoftAh(std::shared_ptr<SoftPd> pd, const AhAttr& a) : pd_(std::move(pd)), attr_(a) {}
  const AhAttr& attr() const noexcept override { return attr_; }

 private:
  std::shared_ptr<SoftPd> pd_;
  AhAttr attr_;
};

struct RecvWqe {
  std::uint64_t wr_id = 0;
  std::uint32_t num_sge = 0;
  std::array<Sge, kMaxSge> sge{};
};

class SoftSrq final : public SharedReceiveQueue, public std::enable_shared_from_this<SoftSrq> {
 public:
  SoftSrq(std::shared_ptr<SoftPd> pd, std::uint32_t max_wr, std::uint32_t max_sge)
      : pd_(std::move(pd)), max_wr_(max_wr), max_sge_(max_sge) {}
  Status post_recv(std::span<const RecvWr> wrs, std::size_t* bad_index) override;
  std::uint32_t max_wr() const noexcept override { return max_wr_; }
  Result<std::vector<std::uint8_t>> export_state() const override;  // qp_migrate.cpp
  Status import_state(std::span<const std::uint8_t> blob) override;
  [[nodiscard]] const SoftPd* pd() const noexcept { return pd_.get(); }
  std::deque<RecvWqe> queue;  // guarded by SoftDevice::mu_

 private:
  std::shared_ptr<SoftPd> pd_;
  std::uint32_t max_wr_, max_sge_;
};

class SoftPd final : public ProtectionDomain, public std::enable_shared_from_this<SoftPd> {
 public:
  SoftPd(std::shared_ptr<SoftDevice> dev, std::uint32_t handle) : dev_(std::move(dev)), handle_(handle) {}
  Result<std::shared_ptr<MemoryRegion>> reg_mr(void* addr, std::size_t length, Access access,
                                               const MrOptions& opts) override;
  Result<std::shared_ptr<QueuePair>> create_qp(const QpInitAttr& attr, const QpOptions& opts) override;
  Result<std::shared_ptr<AddressHandle>> create_ah(const AhAttr& attr) override;
  Result<std::shared_ptr<SharedReceiveQueue>> create_srq(std::uint32_t max_wr, std::uint32_t max_sge) override;
  Result<std::shared_ptr<MemoryRegion>> alloc_mr(std::uint32_t max_pages, const MrOptions& opts) override;
  std::uint32_t handle() const noexcept override { return handle_; }
  [[nodiscard]] SoftDevice& dev() const { return *dev_; }

 private:
  std::shared_ptr<SoftDevice> dev_;
  std::uint32_t handle_;
};

// ---- Queue pair state ---------------------------------------------------------------------------
// READ and atomics: requests answered with data, limited by max_rd_atomic (IBA 9.4.4).
constexpr bool is_rd_atomic(WrOpcode op) noexcept {
  return op == WrOpcode::rdma_read || op == WrOpcode::atomic_cmp_and_swp || op == WrOpcode::atomic_fetch_and_add;
}

struct SendWqe {
  std::uint64_t wr_id = 0;
  WrOpcode opcode = WrOpcode::send;
  bool signaled = false;
  bool solicited = false;
  bool fence = false;
  std::uint32_t imm = 0;  // SEND_WITH_IMM's ImmDt; SEND_WITH_INV's and LOCAL_INV's key (ibv_send_wr's union)
  // REG_MR: what the region (named by its key's upper 24 bits, which REG_MR never changes) gets.
  struct {
    std::uint32_t index = 0;
    std::uint8_t* addr = nullptr;
    std::uint64_t iova = 0, length = 0;
    Access access = Access::none;
    std::uint32_t key = 0;
  } reg;
  std::uint64_t remote_addr = 0;
  std::uint32_t rkey = 0;
  std::uint64_t compare_add = 0, swap = 0;
  std::uint32_t ud_dst_ip_be = 0, ud_qpn = 0, ud_qkey = 0;
  std::uint32_t num_sge = 0;
  std::array<Sge, kMaxSge> sge{};
  std::vector<std::uint8_t> inline_data;  // capacity reserved at QP creation; never grows on post
  bool is_inline = false;
  std::uint32_t length = 0;
  // Progress (engine thread).
  bool started = false;         // PSNs assigned
  std::uint32_t first_psn = 0;
  std::uint32_t npkts = 0;      // PSNs this request consumes
  std::uint32_t resp_pkts = 0;  // READ: response packets received in order so far (the first missing one)
  // READ, under loss: responses after a lost one are kept (got: a bit per packet, allocated on the
  // first loss), and only the lost packets are read again, one request at a time for the lowest
  // gap (a responder may refuse a re-read below an earlier one: Linux rxe moves its start up).
  std::uint32_t resp_high = 0;                 // one past the highest response packet received
  std::uint32_t req_from = 0, req_end = 0;     // packets the last READ request for it asked for
  std::uint64_t req_seq = 0;                   // when that request left (SoftQp::read_requests)
  bool req_heard = false;                      // a packet of that request arrived
  std::vector<std::uint64_t> got;              // packets received at or after resp_pkts
  bool has(std::uint32_t i) const {
    return i < resp_pkts || (i / 64 < got.size() && (got[i / 64] >> (i % 64) & 1u) != 0);
  }
  // The first packet at or after `from` received already, or npkts.
  std::uint32_t next_had(std::uint32_t from) const {
    for (std::uint32_t i = from; i < resp_high; ++i)
      if (has(i)) return i;
    return npkts;
  }
  // Keeps what arrived in order (resp_pkts), forgets the rest: posting, and a migrated QP whose
  // packets after a gap did not travel (they are read again).
  void forget_after_gap() {
    resp_high = resp_pkts;
    req_from = req_end = 0;
    req_seq = 0;
    req_heard = false;
    got.clear();
  }
  bool done = false;            // READ/atomic data arrived (completes when it reaches the head)
  WcStatus status = WcStatus::success;
};

// Responder's memory of a READ or atomic request, for duplicate replay (IBA 9.7.5.1.4/9.7.5.2.6).
struct RdAtomicResource {
  bool valid = false;
  bool atomic = false;
  std::uint32_t first_psn = 0, last_psn = 0;
  std::uint64_t va = 0;
  std::uint32_t rkey = 0, length = 0;
  std::uint64_t orig = 0;  // atomic: value returned the first time
};

// An outgoing READ response being streamed: packets [next_psn - first_psn, npkts) of the READ
// whose first response has PSN first_psn (a re-read of part of it ends before the READ's end).
struct ReadJob {
  std::uint32_t first_psn = 0;  // PSN of the READ request
  std::uint32_t next_psn = 0;   // next response PSN to send
  std::uint32_t npkts = 0;      // the job ends before this packet (the READ's count for a whole one)
  std::uint64_t va = 0;
  std::uint32_t rkey = 0, length = 0;
  std::uint32_t msn = 0;
};

class SoftQp final : public QueuePair {
 public:
  SoftQp(std::shared_ptr<SoftPd> pd, const QpInitAttr& init, std::uint32_t qpn);
  ~SoftQp() override;
  std::uint32_t qp_num() const noexcept override { return qpn_; }
  QpType type() const noexcept override { return type_; }
  Status modify(const QpAttr& attr, QpAttrMask mask) override;
  Result<QpAttr> query() const override;
  QpState state() const noexcept override { return state_.load(std::memory_order_acquire); }
  Status post_send(std::span<const SendWr> wrs, std::size_t* bad_index) override;
  Status check_reg(const SendWr& wr) const;
  Status post_recv(std::span<const RecvWr> wrs, std::size_t* bad_index) override;
  Result<std::vector<std::uint8_t>> export_state() const override;
  Status import_state(std::span<const std::uint8_t> blob) override;

  // ---- everything below is guarded by SoftDevice::mu_ ----
  SoftDevice& dev;
  std::shared_ptr<SoftPd> pd;
  std::shared_ptr<SoftCq> scq, rcq;
  std::shared_ptr<SoftSrq> srq;
  const std::uint32_t qpn_;
  const QpType type_;
  bool sq_sig_all;
  QpCap cap;
  QpAttr attr;  // current attributes (qp_state mirrors state_)
  std::atomic<QpState> state_{QpState::reset};

  // Send queue: a ring of cap.max_send_wr entries; [sq_head, sq_tail) posted,
  // [sq_head, sq_next) transmitted at least partly, sq_next.. waiting to be sent.
  std::vector<SendWqe> sq;
  std::uint64_t sq_head = 0, sq_next = 0, sq_tail = 0;
  std::uint32_t send_psn = 0;    // PSN of the next packet to transmit
  std::uint32_t una_psn = 0;     // oldest unacknowledged PSN
  std::uint32_t next_new_psn = 0;  // first PSN of the next request not yet started
  std::uint32_t rd_atomic_outstanding = 0;
  std::uint32_t retry_left = 7, rnr_left = 7;
  TimePoint retx_deadline{};     // armed while packets are unacknowledged
  TimePoint rnr_deadline{};      // armed after an RNR NAK
  bool rnr_wait = false;
  std::uint32_t rnr_psn = 0;
  bool retx_pending = false;     // a go-back-N was requested; stops repeated requests per gap
  std::uint64_t read_requests = 0;           // READ requests sent (their order: SendWqe::req_seq)
  std::uint32_t cwnd = kSendWindowPkts;      // congestion window (packets); see kSendWindowPkts
  std::uint32_t ssthresh = kSendWindowPkts;  // below it the window doubles per round trip, above it grows by one
  std::uint32_t cwnd_acked = 0;              // packets acknowledged towards the next step of one
  // Tail-loss probe: when nothing is acknowledged for a few round trips while packets are out (the
  // last ones, or their ACK, lost: nothing behind them makes the responder NAK), resend from the
  // oldest unacknowledged PSN once, long before the local ACK timeout. The round trip is sampled
  // from one ACK-requesting packet at a time, never a retransmitted one (Karn).
  TimePoint probe_deadline{};
  bool probed = false;
  bool ack_next = false;  // the next packet sent asks for an ACK (the probe)
  Clock::duration srtt{};
  std::uint32_t rtt_psn = 0;
  TimePoint rtt_sent{};
  std::uint32_t sent_high = 0;  // one past the highest PSN ever sent (below it: a retransmission)

  // Receive queue.
  std::deque<RecvWqe> rq;
  std::uint32_t rq_max = 0;

  // Responder.
  std::uint32_t e_psn = 0;       // expected PSN
  std::uint32_t msn = 0;
  bool nak_sent = false;
  bool in_send = false, in_write = false;
  RecvWqe cur_recv{};
  bool have_recv = false;
  std::uint32_t recv_offset = 0;
  std::uint64_t write_va = 0;
  std::uint32_t write_rkey = 0, write_left = 0, write_total = 0;
  std::vector<RdAtomicResource> rd_res;
  std::size_t rd_res_next = 0;
  std::deque<ReadJob> read_jobs;
  // Re-reads of part of an earlier READ (duplicates), each served when the READs that came before
  // it are (in arrival order, 9.5: a requester may read that as every earlier request answered);
  // never exported (after a migration the requester asks again).
  struct ReadReplay {
    ReadJob job;
    std::uint64_t after = 0;  // served once read_jobs_done reaches this
  };
  std::deque<ReadReplay> read_replays;
  std::uint64_t read_jobs_done = 0;  // read_jobs finished (popped) so far
  bool ack_pending = false;
  std::uint32_t ack_psn = 0;

  bool flush_pending = false;    // entered ERR: flush both queues
  bool queued = false;           // on SoftDevice::active
  TimePoint timer_at = TimePoint::max();  // earliest entry of this QP in SoftDevice::timers_
  bool cm_wait_rtu = false;      // its CM connection sent REP: the first packet stands for RTU

  [[nodiscard]] std::uint32_t pmtu() const noexcept { return mtu_bytes(attr.path_mtu); }
  [[nodiscard]] std::uint32_t dst_ip() const noexcept { return attr.ah_attr.dgid.ipv4(); }
  [[nodiscard]] bool sq_empty() const noexcept { return sq_head == sq_tail; }
  // READ responses still to send: streaming READs or re-reads.
  [[nodiscard]] bool reads_pending() const noexcept { return !read_jobs.empty() || !read_replays.empty(); }
  void drop_reads() noexcept {
    read_jobs.clear();
    read_replays.clear();
  }
  // The sender's loss state as for a new connection (RTS, or a QP imported after a migration):
  // full window, no round trip known yet; PSNs below sent_high count as retransmissions.
  void reset_send_loss_state(std::uint32_t sent_high_psn) noexcept {
    cwnd = ssthresh = kSendWindowPkts;
    cwnd_acked = 0;
    sent_high = sent_high_psn;
    srtt = {};
    rtt_sent = probe_deadline = {};
    probed = false;
  }
  SendWqe& wqe(std::uint64_t idx) { return sq[idx % sq.size()]; }
  void set_state(QpState s) noexcept {
    attr.qp_state = s;
    state_.store(s, std::memory_order_release);
  }
};

// ---- The device ---------------------------------------------------------------------------------
class SoftDevice final : public Device {
 public:
  SoftDevice(std::string name, std::string netdev, std::uint32_t ip_be, std::uint8_t mac[6], Mtu active_mtu,
             std::unique_ptr<Link> link, UniqueFd wake_fd, bool busy_poll, bool verify_icrc, std::uint16_t port);
  ~SoftDevice() override;
  const std::string& name() const noexcept override { return name_; }
  Result<DeviceAttr> query_device() const override;
  Result<PortAttr> query_port(std::uint8_t port) const override;
  Result<std::vector<GidEntry>> gid_table(std::uint8_t port) const override;
  Result<GidEntry> query_gid(std::uint32_t index, std::uint8_t port) const override;
  Result<std::shared_ptr<ProtectionDomain>> alloc_pd() override;
  Result<std::shared_ptr<CompletionQueue>> create_cq(std::uint32_t cqe) override;
  Status quiesce() override;
  Status resume() override;

  void start();
  void set_link(std::unique_ptr<Link> l) { link_ = std::move(l); }
  void stop();
  // Wake the engine thread (called after posting work).
  void kick() noexcept;
  // A round of receive and send work on an application thread (CompletionQueue::poll), only if
  // the device lock is free. `cq_armed`: the caller will wait for the CQ's event, so the engine
  // thread must keep watching the socket. True if anything happened.
  bool progress(bool cq_armed);
  // The application armed a CQ to sleep on its event: the engine thread takes the socket back.
  void app_waits() noexcept;
  void set_faults(const FaultConfig& cfg);
  EngineStats stats_snapshot() const;
  // The partition (before start()): `soft:IP?pkey=0x8001`. Default 0xffff, the default full one.
  void set_pkey(std::uint16_t pkey) { pkey_ = pkey; }
  [[nodiscard]] std::uint16_t pkey() const { return pkey_; }

  // ---- guarded by mu_ ----
  mutable std::mutex mu_;
  std::unordered_map<std::uint32_t, SoftMr*> mrs;
  std::unordered_map<std::uint32_t, SoftQp*> qps;
  std::vector<SoftQp*> active;  // QPs with send work; deduplicated by SoftQp::queued
  EngineStats st;
  std::uint32_t next_key = 0x100;  // plain regions: 0x100 up to kFastKeys
  // Fast-registration regions by their key's upper 24 bits (keys from kFastKeys up; REG_MR
  // changes only the low byte of a key, so each holds a block of 256).
  static constexpr std::uint32_t kFastKeys = 0x80000000u;
  std::unordered_map<std::uint32_t, SoftMr*> fast_mrs;
  std::uint32_t next_fast = kFastKeys >> 8;
  std::uint32_t next_qpn = 0x11;
  std::uint32_t next_pd = 1;
  bool quiesced = false;

  // Engine helpers (engine thread or API caller, with mu_ held).
  // The valid region `key` names (a remotely invalidated one names nothing).
  SoftMr* find_mr(std::uint32_t key) {
    auto it = mrs.find(key);
    return it == mrs.end() || !it->second->valid() ? nullptr : it->second;
  }
  void mark_active(SoftQp& qp);
  void move_to_error(SoftQp& qp);
  // Executes a LOCAL_INV or REG_MR at the head of the send queue (requester.cpp).
  WcStatus local_op(SoftQp& qp, const SendWqe& w);
  // Allocates a TX slot for a packet to dst; flushes when the batch is full. Returns the buffer.
  std::uint8_t* tx_alloc(std::uint32_t dst_ip_be);
  void tx_commit(std::size_t len);
  // Pads and writes the ICRC of every packet built since the last flush (segmentation runs
  // numbered as the kernel will number them) and sends them.
  void tx_flush();
  // Transmits what was just posted on qp (post_send, mu_ held); true if work is left for the
  // engine thread.
  bool send_now(SoftQp& qp);
  // Queues a look at qp's timers at t (engine_loop.cpp); every deadline set calls it.
  void arm_timer(SoftQp& qp, TimePoint t);
  void rearm(SoftQp& qp);
  [[nodiscard]] wire::Ipv4Context ip_ctx(std::uint32_t dst_ip_be) const noexcept {
    wire::Ipv4Context c;
    c.src_be = ip_be_;
    c.dst_be = dst_ip_be;
    c.udp_src_port = port_;
    c.udp_dst_port = port_;
    return c;
  }
  [[nodiscard]] std::uint32_t ip_be() const noexcept { return ip_be_; }
  [[nodiscard]] Mtu active_mtu() const noexcept { return active_mtu_; }
  [[nodiscard]] std::uint64_t node_guid() const noexcept;
  // QP1 and the connection manager (gsi.hpp), guarded by mu_.
  std::unique_ptr<GsiAgent> gsi;

  // Builds one packet: pkt_begin encodes the headers and returns where `payload_len` bytes of
  // payload go; the caller fills them and calls pkt_end (tx_flush pads and writes the ICRC).
  // `full`: the payload is exactly the QP's path MTU (the packet may lead a GSO run).
  std::uint8_t* pkt_begin(std::uint32_t dst_ip_be, wire::Headers& h, std::size_t payload_len, bool full = false);
  void pkt_end();
  void pkt_abort() noexcept { pkt_open_ = false; }
  void send_packet(std::uint32_t dst_ip_be, wire::Headers& h, std::span<const std::uint8_t> payload);
  // Local memory through a scatter/gather list (lkeys checked against the QP's PD).
  WcStatus gather(const SoftQp& qp, const Sge* sge, std::uint32_t n, std::uint32_t offset, std::uint8_t* dst,
                  std::uint32_t len);
  WcStatus scatter(const SoftPd& pd, const Sge* sge, std::uint32_t n, std::uint32_t offset,
                   const std::uint8_t* src, std::uint32_t len);
  std::vector<SoftQp*> acks;  // QPs with an ACK to send at the end of the receive batch
  void send_ack(SoftQp& qp, wire::AckType type, std::uint8_t value, std::uint32_t psn);
  void flush_acks();

  // Role entry points (requester.cpp, responder.cpp, completer.cpp).
  // Sends up to `budget` packets; true if it stopped for the budget with packets left to send
  // (not for the window, a READ/atomic limit, a fence or an RNR wait: a response ends those).
  bool requester_run(SoftQp& qp, std::size_t budget);
  void responder_packet(SoftQp& qp, const wire::Packet& pkt, std::uint32_t src_ip_be);
  void responder_ud_packet(SoftQp& qp, const wire::Packet& pkt, std::uint32_t src_ip_be);
  bool responder_run_reads(SoftQp& qp, std::size_t budget);
  void completer_packet(SoftQp& qp, const wire::Packet& pkt);
  void timers_run(SoftQp& qp, TimePoint now);
  void flush_queues(SoftQp& qp);
  void complete_send(SoftQp& qp, SendWqe& w, WcStatus status);
  void retire_completed(SoftQp& qp);
  void go_back_n(SoftQp& qp, std::uint32_t psn);
  // A loss was seen (a NAK, an implied NAK, a timeout): the congestion window shrinks.
  void window_on_loss(SoftQp& qp, bool timeout);
  // (Re)arms the tail-loss probe a few round trips from now, once the round trip is known.
  void arm_probe(SoftQp& qp);
  // READ request for w's packets from `from` (at least its first missing one) up to the next
  // one already received.
  void request_read(SoftQp& qp, SendWqe& w, std::uint32_t from);
  void read_response(SoftQp& qp, const wire::Packet& pkt);
  // Points the requester at psn (the first unfinished packet at or after it); false if none.
  bool seek(SoftQp& qp, std::uint32_t psn);
  TimePoint retx_interval(const SoftQp& qp) const;

 private:
  void engine_main();
  bool engine_round();
  bool work_round(int rx_batches, bool defer_acks);
  void run_timers(TimePoint now);
  // One received datagram: a packet, or a segmentation run cut back into packets.
  void handle_datagram(RxPacket& p);
  [[nodiscard]] bool starts_a_packet_here(const std::uint8_t* d, std::size_t len) const;
  void handle_rx(RxPacket& p);

  std::string name_, netdev_;
  std::uint32_t ip_be_;
  std::array<std::uint8_t, 6> mac_{};
  Mtu active_mtu_;
  std::unique_ptr<Link> link_;
  UniqueFd wake_fd_;
  bool busy_poll_;
  bool verify_icrc_;
  std::uint16_t port_;
  // The port's P_Key table has this one entry (index 0): every QP's partition. Sent in every
  // BTH; a received packet whose P_Key does not match it is dropped (IBA 9.6.1.1).
  std::uint16_t pkey_ = wire::kDefaultPkey;
  std::thread thread_;
  std::atomic<bool> running_{false};
  std::atomic<bool> sleeping_{false};
  std::atomic<std::int64_t> sleep_until_ns_{0};  // while sleeping: when the engine wakes by itself
  std::atomic<std::int64_t> app_poll_ns_{0};     // last poll of an unarmed CQ (0: the app waits)

  std::vector<std::uint8_t> tx_mem_, rx_mem_;
  std::array<TxPacket, kTxSlots> tx_{};
  std::size_t tx_count_ = 0;
  bool pkt_open_ = false;
  std::size_t pkt_hdr_len_ = 0, pkt_payload_len_ = 0;
  bool pkt_full_ = false;
  // Timer queue: (when, QPN), earliest first; SoftQp::timer_at is a QP's earliest entry.
  std::priority_queue<std::pair<TimePoint, std::uint32_t>, std::vector<std::pair<TimePoint, std::uint32_t>>,
                      std::greater<>>
      timers_;
  TimePoint next_timer_sweep_{};
  std::vector<SoftQp*> round_list_;  // engine_round's copy of `active`
  std::array<RxPacket, kRxSlots> rx_{};
};

// Duration of the local ACK timeout (IBA 9.7.6.1.3): 4.096 us * 2^timeout, 0 means infinite.
std::chrono::nanoseconds ack_timeout(std::uint8_t timeout);
// RNR NAK timer field (IBA table 45) to a duration.
std::chrono::nanoseconds rnr_timer(std::uint8_t code);

}  // namespace vrdma::nicdrv::soft
