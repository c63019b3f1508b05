// vrdma-perf's parts (one file per role): the resources, the measured loops and the engine's
// counters every exchange format shares (perf_ops.cpp); our own JSON exchange with another
// vrdma-perf (perf_native.cpp); the foreign formats, perftest's (perf_perftest.cpp) and
// ibv_rc_pingpong's (perf_pingpong.cpp), over the records of perf_foreign.cpp; RDMA-CM peers
// (perf_cm.hpp). A tool-private header: nicdrv's names are used unqualified.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "vrdma/common/fd.hpp"
#include "vrdma/nicdrv/device.hpp"

namespace vrdma::perf {

using namespace vrdma::nicdrv;
using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

struct Config {
  std::string device, connect, test = "write_bw";
  std::uint16_t port = 18515;
  std::uint32_t size = 65536, depth = 64, mtu = 1024;
  std::uint64_t iters = 1000;
  double duration = 0;
  bool json_out = false, verify = false;
  std::string peer_format = "vrdma";  // vrdma (our JSON lines), perftest, pingpong
  unsigned qp_timeout = 14;            // local ACK timeout exponent: 4.096 us * 2^n (IBA 9.7.6.1.3)
  std::string connection = "RC";       // RC, or UD (--peer-format pingpong: ibv_ud_pingpong)
  bool srq = false;                    // --peer-format pingpong: ibv_srq_pingpong (qps RC QPs on one SRQ)
  std::uint32_t qps = 16;              // its -q (the tool's default)
  bool all_sizes = false;              // write_bw/read_bw against perftest -a: every size 2 B .. 8 MiB
  bool bidirectional = false;          // write_bw/read_bw against perftest -b: the server runs the test too
  bool cmp_and_swap = false;           // atomic_bw: CMP_AND_SWAP instead of FETCH_AND_ADD (perftest's -A)
  bool busy_poll = false;              // poll the CQ only, never yield or sleep on its event (as perftest does)
  double rate = 0;                     // --peer-format pingpong: at most this many sends a second (0: no limit)
};

[[noreturn]] void die(const std::string& msg);
template <class T>
T must(Result<T> r, const char* what) {
  if (!r) die(std::string(what) + ": " + r.error().message);
  return std::move(r).value();
}
void must(Status s, const char* what);

struct Ctx {
  Config c;
  std::shared_ptr<Device> dev;
  std::shared_ptr<ProtectionDomain> pd;
  std::shared_ptr<CompletionQueue> cq;
  std::shared_ptr<QueuePair> qp;
  std::shared_ptr<Buffer> mem;  // from Device::alloc_buffer: memory every provider can register
  std::span<std::uint8_t> buf;  // the part of `mem` the test uses
  std::shared_ptr<MemoryRegion> mr;
  std::uint64_t remote_addr = 0;
  std::uint32_t remote_rkey = 0;
  std::uint64_t atomic_base = 0;  // atomic_bw: the value the target holds before the first atomic, if known
  std::size_t slots = 1;
  GidEntry gid;  // ours, as peers address us (local_gid)

  // UD (--connection UD): every receive starts with the 40-byte GRH; slots are that much larger.
  std::uint32_t grh = 0;
  std::shared_ptr<AddressHandle> ah;  // UD: the peer's address, and its QPN
  std::uint32_t remote_qpn = 0;
  // The peer may have left (it has every message it waits for): poll_checked hands a SEND that
  // ran out of retries to the caller instead of failing the run.
  bool peer_may_leave = false;

  Sge sge(std::size_t slot, std::uint32_t len) const {
    return Sge{reinterpret_cast<std::uint64_t>(buf.data()) + slot * (c.size + grh), len, mr->lkey()};
  }
  // A receive into `slot`: the message and, for UD, the GRH before it.
  Sge recv_sge(std::size_t slot) const { return sge(slot, c.size + grh); }
  // A send work request's destination, for UD (RC QPs are connected).
  void address(SendWr& w) const {
    if (!ah) return;
    w.ud.ah = ah.get();
    w.ud.remote_qpn = remote_qpn;
    w.ud.remote_qkey = kUdQkey;
  }
  static constexpr std::uint32_t kUdQkey = 0x11111111;  // perftest's and the pingpong tools' Q_Key
};

// What a QP needs to know of its peer to connect (every exchange format carries these).
struct Remote {
  std::uint32_t qpn = 0, psn = 0;
  Gid gid;
  std::uint8_t max_rd_atomic = 16;  // how many READs/atomics the peer's responder takes
  std::uint8_t min_rnr_timer = 1;
};


struct Outcome {
  std::uint64_t ops = 0;
  double seconds = 0;
  std::vector<double> lat_us;
};


// ---- perf_ops.cpp: the out-of-band TCP connection, resources, polling, the measured loops ----
UniqueFd oob_connect(const Config& c);  // retries for 10 s
UniqueFd oob_accept(const Config& c);
void fill(std::span<std::uint8_t> b, std::uint32_t seed);
std::uint32_t crc(const std::uint8_t* p, std::size_t n);
GidEntry local_gid(const Device& d);
void create_resources(Ctx& x, bool is_server);
std::uint32_t initial_psn();
// INIT: from here on receives may be posted (IBA 10.8.2), before the peer is known.
void qp_to_init(Ctx& x);
void qp_to_init(QueuePair& qp);
// Connects x.qp, or another QP of the run (perftest -q N), to its peer.
void connect_qp(Ctx& x, const Remote& r, std::uint32_t my_psn);
void connect_qp(Ctx& x, QueuePair& qp, const Remote& r, std::uint32_t my_psn);
// Another QP like x.qp (same PD, CQ and depth).
std::shared_ptr<QueuePair> new_qp(Ctx& x);
std::size_t poll_checked(Ctx& x, WorkCompletion* wc, std::size_t n);
std::size_t poll_some(Ctx& x, WorkCompletion* wc, std::size_t n);
// A time limit watched from a busy loop: it looks at the clock only every 1024 rounds, because a
// clock read is a system call where the clocksource has no vDSO path (a TCG guest's hpet: ~20 us
// each), which would be a system call per post. moved(): the limit runs again from now.
class Watchdog {
 public:
  explicit Watchdog(SteadyClock::duration limit) : limit_(limit), since_(SteadyClock::now()) {}
  void moved() { moved_ = true; }
  // Another round with nothing done: true once nothing has moved for the limit.
  bool expired() {
    if ((++rounds_ & 1023u) != 0) return false;
    const auto now = SteadyClock::now();
    if (moved_) {
      since_ = now;
      moved_ = false;
      return false;
    }
    return now - since_ >= limit_;
  }

 private:
  SteadyClock::duration limit_;
  SteadyClock::time_point since_;
  std::uint32_t rounds_ = 0;
  bool moved_ = false;
};
// Work is outstanding and nothing has completed for kStallSeconds: the peer stopped answering
// or the device lost work. Ends the run with a sentence (and the counts) instead of a hang.
inline constexpr int kStallSeconds = 20;
void check_stall(Watchdog& w, std::uint64_t posted, std::uint64_t completed, const char* what);
void post_recvs(Ctx& x, std::size_t n);
bool time_up(const Config& c, SteadyClock::time_point start, std::uint64_t done);
// Streams operations with up to `depth` outstanding (client side of the *_bw tests).
Outcome run_bw(Ctx& x);
// Ping-pong (send_lat, write_lat): one side sends first, the other answers each message; with
// `waits_first` this side is the one that answers. Latency (half the round trip) is measured
// by the side that sends first. write_lat writes `size` bytes whose last byte counts 1, 2, ...
// (as perftest's run_iter_lat_write), the peer watches that byte.
Outcome run_lat(Ctx& x, bool waits_first, std::uint64_t iters);
// read_lat: one READ of `size` bytes at a time; latency is the whole round trip (as perftest's).
Outcome run_read_lat(Ctx& x);
// A soft engine's packet counters in the JSON ("engine"): what a case checks moved (and was lost).
void add_engine_stats(json& out, const Device& dev);

// ---- the exchanges: each runs one test and returns the exit status ---------------------------
int run_native(Config c);   // perf_native.cpp: another vrdma-perf
int run_foreign(Config& c);  // perf_foreign.cpp: perftest or ibv_rc_pingpong

}  // namespace vrdma::perf
