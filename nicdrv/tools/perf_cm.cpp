// rping's protocol over the nicdrv connection API (see perf_cm.hpp).
#include "perf_cm.hpp"
#include "perf_cm_common.hpp"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <span>
#include <thread>
#include <vector>

#include "vrdma/nicdrv/cm.hpp"
#include "vrdma/nicdrv/registry.hpp"
#include "vrdma/nicdrv/soft.hpp"

namespace vrdma::perf {
namespace {

using namespace cm_detail;
using namespace vrdma::nicdrv;
using SteadyClock = std::chrono::steady_clock;
using json = nlohmann::json;
constexpr std::size_t kInfoLen = 16;  // struct rping_rdma_info: be64 buf, be32 rkey, be32 size

// rping_test_client's text: "rdma-ping-<n>: " then letters from `start` cycling 'A'..'z'
// (65..122), the last byte NUL; `start` advances by one per ping.
void rping_pattern(std::span<std::uint8_t> b, std::uint64_t ping) {
  char head[32];
  const int cc = std::snprintf(head, sizeof head, "rdma-ping-%llu: ", static_cast<unsigned long long>(ping));
  const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(cc), b.size());
  std::memcpy(b.data(), head, n);
  unsigned c = 65 + static_cast<unsigned>(ping % 58);
  for (std::size_t i = n; i < b.size(); ++i) {
    b[i] = static_cast<std::uint8_t>(c);
    if (++c > 122) c = 65;
  }
  if (!b.empty()) b[b.size() - 1] = 0;
}

struct Rping {
  CmRunConfig c;
  std::shared_ptr<Device> dev;
  std::shared_ptr<ProtectionDomain> pd;
  std::shared_ptr<CompletionQueue> cq;
  std::shared_ptr<QueuePair> qp;
  std::shared_ptr<Buffer> mem;
  std::shared_ptr<MemoryRegion> mr;
  std::uint8_t* start = nullptr;  // client: the source the server READs; server: unused
  std::uint8_t* rdma = nullptr;   // client: the sink the server WRITEs; server: READ target
  std::uint8_t* send_info = nullptr;
  std::uint8_t* recv_info = nullptr;
  bool disconnected = false;
  bool last_send_unacknowledged = false;
  bool client_idle = false;

  std::uint64_t addr(const std::uint8_t* p) const {
    return mr->addr() + static_cast<std::uint64_t>(p - mem->data());
  }
  Sge sge(std::uint8_t* p, std::uint32_t len) const { return Sge{addr(p), len, mr->lkey()}; }

  void setup() {
    dev = must(open_device(c.device), "open " + c.device);
    pd = must(dev->alloc_pd(), "alloc PD");
    cq = must(dev->create_cq(64), "create CQ");
    QpInitAttr ia;
    ia.send_cq = cq.get();
    ia.recv_cq = cq.get();
    ia.cap.max_send_wr = 16;  // RPING_SQ_DEPTH
    ia.cap.max_recv_wr = 2;
    qp = must(pd->create_qp(ia), "create QP");
    mem = must(dev->alloc_buffer(2 * std::size_t{c.size} + 2 * kInfoLen), "allocate buffers");
    start = mem->data();
    rdma = start + c.size;
    send_info = rdma + c.size;
    recv_info = send_info + kInfoLen;
    mr = must(pd->reg_mr(mem->data(), mem->size(), Access::local_write | Access::remote_read | Access::remote_write),
              "register buffers");
    // INIT now, so the receive for the peer's first message is up before the connection is.
    to_init(*qp, Access::local_write | Access::remote_read | Access::remote_write);
    post_recv();
  }

  CmParams params() const {
    CmParams p;
    p.responder_resources = 1;  // as rping_connect_client
    p.initiator_depth = 1;
    p.retry_count = 7;
    p.rnr_retry_count = 7;
    p.local_ack_timeout = static_cast<std::uint8_t>(c.qp_timeout);
    p.timeout = std::chrono::milliseconds(20000);
    return p;
  }

  void post_recv() {
    Sge s = sge(recv_info, kInfoLen);
    RecvWr w{1, std::span<const Sge>(&s, 1)};
    must(qp->post_recv(std::span<const RecvWr>(&w, 1)), "post receive");
  }

  void post(WrOpcode op, std::uint8_t* local, std::uint32_t len, std::uint64_t raddr = 0, std::uint32_t rkey = 0) {
    Sge s = sge(local, len);
    SendWr w;
    w.wr_id = static_cast<std::uint64_t>(op);
    w.opcode = op;
    w.flags = SendFlags::signaled;
    w.sg_list = std::span<const Sge>(&s, 1);
    w.rdma.remote_addr = raddr;
    w.rdma.rkey = rkey;
    must(qp->post_send(std::span<const SendWr>(&w, 1)), "post " + std::string(to_string(op)));
  }

  // Waits for the next completion of `want` (a receive when want is recv), skipping our own
  // SEND completions. A flushed receive means the peer disconnected: returns false. With
  // `peer_may_leave` (a server between pings: rping's client disconnects as soon as it has our
  // last "go ahead"), a SEND the peer never acknowledged ends the run the same way: its ACK was
  // lost and its QP was gone before our retransmission; the client's own count says whether
  // every ping arrived. So does kClientIdle of silence.
  bool wait(WcOpcode want, WorkCompletion* out = nullptr, bool peer_may_leave = false) {
    const auto t0 = SteadyClock::now();
    const auto deadline = t0 + kStepTimeout;
    WorkCompletion wc[4];
    while (SteadyClock::now() < deadline) {
      if (peer_may_leave && SteadyClock::now() - t0 >= kClientIdle) {
        std::fprintf(stderr, "vrdma-perf: the client sent nothing for %lld s after its last ping (its disconnect was "
                             "lost?); disconnecting\n",
                     static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(kClientIdle).count()));
        client_idle = true;
        return false;
      }
      auto n = cq->poll(wc);
      if (!n) die("poll CQ: " + n.error().message);
      for (std::size_t i = 0; i < *n; ++i) {
        if (wc[i].status == WcStatus::wr_flush_err) {
          disconnected = true;
          return false;
        }
        if (peer_may_leave && wc[i].opcode == WcOpcode::send && wc[i].status == WcStatus::retry_exc_err) {
          std::fprintf(stderr, "vrdma-perf: our last SEND was never acknowledged (%s); the client has gone\n",
                       std::string(to_string(wc[i].status)).c_str());
          last_send_unacknowledged = true;
          disconnected = true;
          return false;
        }
        if (wc[i].status != WcStatus::success)
          die(std::string(to_string(wc[i].opcode)) + " completed with " + std::string(to_string(wc[i].status)));
        if (wc[i].opcode == want) {
          if (out != nullptr) *out = wc[i];
          return true;
        }
      }
      if (*n == 0) sched_yield();
    }
    die("no " + std::string(to_string(want)) + " completion within 30 s");
  }

  void send_info_of(std::uint8_t* buf) {
    put_be(send_info, addr(buf), 8);
    put_be(send_info + 8, mr->rkey(), 4);
    put_be(send_info + 12, c.size, 4);
    post(WrOpcode::send, send_info, kInfoLen);
  }

  struct Info {
    std::uint64_t addr;
    std::uint32_t rkey, size;
  };
  Info got_info(const WorkCompletion& wc) {
    if (wc.byte_len != kInfoLen) die("the peer sent " + std::to_string(wc.byte_len) + " bytes; rping sends 16");
    Info i{get_be(recv_info, 8), static_cast<std::uint32_t>(get_be(recv_info + 8, 4)),
           static_cast<std::uint32_t>(get_be(recv_info + 12, 4))};
    post_recv();
    return i;
  }
};

}  // namespace

int run_rping(const CmRunConfig& cfg) {
  Rping r;
  r.c = cfg;
  if (r.c.size < 26 || r.c.size > 65535) die("rping sizes are 26..65535 bytes (its RPING_MIN_BUFSIZE..RPING_BUFSIZE-1)");
  r.setup();
  const bool server = cfg.connect.empty();
  std::unique_ptr<CmListener> listener;
  std::unique_ptr<CmConnection> conn;
  const auto t0 = SteadyClock::now();
  if (server) {
    listener = must(cm_listen(r.dev, cfg.port), "listen on port " + std::to_string(cfg.port));
    conn = must(listener->get_request(std::chrono::seconds(120)), "wait for rping -c");
    must(conn->accept(*r.qp, r.params()), "accept");
  } else {
    conn = must(cm_resolve(r.dev, cfg.connect, cfg.port, r.params()), "resolve " + cfg.connect);
    must(conn->connect(*r.qp, r.params()), "connect to " + cfg.connect + ":" + std::to_string(cfg.port));
  }
  const double connect_s = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  std::uint64_t pings = 0;
  bool verified = true;
  WorkCompletion wc{};
  const auto run0 = SteadyClock::now();
  if (server) {
    // rping_test_server, until the client disconnects.
    std::vector<std::uint8_t> expect(r.c.size);
    while (r.wait(WcOpcode::recv, &wc, pings > 0)) {
      auto src = r.got_info(wc);
      if (src.size > r.c.size) die("the client's buffer (" + std::to_string(src.size) + " bytes) is larger than --size");
      std::memset(r.rdma, 0xee, r.c.size);
      r.post(WrOpcode::rdma_read, r.rdma, src.size, src.addr, src.rkey);
      if (!r.wait(WcOpcode::rdma_read)) break;
      rping_pattern(std::span<std::uint8_t>(expect.data(), src.size), pings);
      if (std::memcmp(expect.data(), r.rdma, src.size) != 0) {
        if (verified) std::fprintf(stderr, "vrdma-perf: ping %llu: the data we READ is not rping's pattern\n",
                                   static_cast<unsigned long long>(pings));
        verified = false;
      }
      r.send_info_of(r.rdma);  // "go ahead" (rping sends its idle send buffer; only the length counts)
      if (!r.wait(WcOpcode::recv, &wc)) break;
      auto sink = r.got_info(wc);
      const auto len = static_cast<std::uint32_t>(::strnlen(reinterpret_cast<const char*>(r.rdma), src.size) + 1);
      r.post(WrOpcode::rdma_write, r.rdma, std::min(len, sink.size), sink.addr, sink.rkey);
      if (!r.wait(WcOpcode::rdma_write)) break;
      r.send_info_of(r.rdma);
      ++pings;
    }
  } else {
    for (; pings < cfg.iters; ++pings) {
      rping_pattern(std::span<std::uint8_t>(r.start, r.c.size), pings);
      std::memset(r.rdma, 0, r.c.size);
      r.send_info_of(r.start);
      if (!r.wait(WcOpcode::recv, &wc)) break;
      r.got_info(wc);
      r.send_info_of(r.rdma);
      if (!r.wait(WcOpcode::recv, &wc)) break;
      r.got_info(wc);
      if (std::memcmp(r.start, r.rdma, r.c.size) != 0) {
        if (verified) std::fprintf(stderr, "vrdma-perf: ping %llu: data mismatch\n", static_cast<unsigned long long>(pings));
        verified = false;
      }
    }
    if (pings < cfg.iters) verified = false;  // the server went away early
  }
  const double run_s = std::chrono::duration<double>(SteadyClock::now() - run0).count();
  if (!r.disconnected) must(conn->disconnect(), "disconnect");
  json out = {{"test", "rping"}, {"peer_format", "rping"}, {"device", cfg.device}, {"role", server ? "server" : "client"},
              {"size", cfg.size}, {"pings", pings}, {"verified", verified && pings > 0}, {"connect_seconds", connect_s},
              {"seconds", run_s}, {"peer_disconnected", r.disconnected},
              {"last_send_unacknowledged", r.last_send_unacknowledged}, {"client_idle", r.client_idle}};
  if (auto st = soft::stats(*r.dev))
    out["engine"] = {{"rx_dropped_icrc", st->rx_dropped_icrc}, {"rx_dropped_malformed", st->rx_dropped_malformed},
                     {"retransmits", st->retransmits}, {"cm_mads_sent", st->cm_mads_sent},
                     {"cm_mads_received", st->cm_mads_received}, {"cm_mads_dropped", st->cm_mads_dropped},
                     {"cm_resends", st->cm_resends}};
  std::cout << out.dump() << std::endl;
  return verified && pings > 0 ? 0 : 2;
}

int run_ucmatose(const CmRunConfig& cfg) {
  const bool server = cfg.connect.empty();
  if (cfg.size == 0 || cfg.iters == 0 || cfg.iters > 4096) die("ucmatose: --size at least 1, --iters 1..4096");
  const auto count = static_cast<std::uint32_t>(cfg.iters);
  auto dev = must(open_device(cfg.device), "open " + cfg.device);
  auto pd = must(dev->alloc_pd(), "alloc PD");
  // Our receives, one slot each, plus one more on the client: its flush is the server's disconnect.
  const std::uint32_t recvs = count + (server ? 0 : 1);
  auto cq = must(dev->create_cq(count + recvs + 8), "create CQ");
  QpInitAttr ia;
  ia.send_cq = cq.get();
  ia.recv_cq = cq.get();
  ia.cap.max_send_wr = count;
  ia.cap.max_recv_wr = recvs;
  auto qp = must(pd->create_qp(ia), "create QP");
  const std::size_t slot = cfg.size;
  auto mem = must(dev->alloc_buffer(slot * (recvs + 1)), "allocate buffers");
  auto mr = must(pd->reg_mr(mem->data(), mem->size(), Access::local_write), "register buffers");
  std::uint8_t* out = mem->data() + slot * recvs;  // what we send: a counting pattern
  for (std::size_t i = 0; i < slot; ++i) out[i] = static_cast<std::uint8_t>(i);
  to_init(*qp, Access::local_write);
  for (std::uint32_t i = 0; i < recvs; ++i) {
    Sge g{mr->addr() + slot * i, cfg.size, mr->lkey()};
    RecvWr w{i, std::span<const Sge>(&g, 1)};
    must(qp->post_recv(std::span<const RecvWr>(&w, 1)), "post receive");
  }
  CmParams p;
  p.responder_resources = 1;  // as cmatose's conn_param
  p.initiator_depth = 1;
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  p.local_ack_timeout = static_cast<std::uint8_t>(cfg.qp_timeout);
  p.timeout = std::chrono::milliseconds(20000);
  std::unique_ptr<CmListener> listener;
  std::unique_ptr<CmConnection> conn;
  const auto t0 = SteadyClock::now();
  if (server) {
    listener = must(cm_listen(dev, cfg.port), "listen on port " + std::to_string(cfg.port));
    conn = must(listener->get_request(std::chrono::seconds(120)), "wait for ucmatose -s");
    must(conn->accept(*qp, p), "accept");
  } else {
    conn = must(cm_resolve(dev, cfg.connect, cfg.port, p), "resolve " + cfg.connect);
    must(conn->connect(*qp, p), "connect to " + cfg.connect + ":" + std::to_string(cfg.port));
  }
  const double connect_s = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  constexpr std::uint64_t kSendId = 1u << 20;  // our sends' wr_ids; receives count from 0
  std::uint32_t sent = 0, received = 0, wrong_length = 0, flushed_sends = 0, unacked_sends = 0;
  std::uint64_t bytes = 0;
  bool disconnected = false, peer_may_leave = false;
  auto post_sends = [&] {
    for (std::uint32_t i = 0; i < count; ++i) {
      Sge g{mr->addr() + slot * recvs, cfg.size, mr->lkey()};
      SendWr w;
      w.wr_id = kSendId + i;
      w.opcode = WrOpcode::send;
      w.flags = SendFlags::signaled;  // cmatose: sq_sig_all
      w.sg_list = std::span<const Sge>(&g, 1);
      must(qp->post_send(std::span<const SendWr>(&w, 1)), "post send");
    }
  };
  // Polls until `done()` or kStepTimeout of silence. A flushed work request is the peer's
  // disconnect: then the rest of the flushed ones are taken too (until 100 ms pass without one).
  auto run_until = [&](const std::function<bool()>& done) {
    WorkCompletion wc[16];
    auto last = SteadyClock::now();
    while (!done()) {
      const auto quiet = SteadyClock::now() - last;
      if (quiet > kStepTimeout || (disconnected && quiet > std::chrono::milliseconds(100))) return false;
      auto n = cq->poll(wc);
      if (!n) die("poll CQ: " + n.error().message);
      for (std::size_t i = 0; i < *n; ++i) {
        last = SteadyClock::now();
        if (wc[i].status == WcStatus::wr_flush_err) {
          disconnected = true;
          if (wc[i].wr_id >= kSendId) ++flushed_sends;
          continue;
        }
        // The client's replies: the server leaves once it has them all, so a reply whose ACK was
        // lost may be resent to a QP that is gone (its disconnect, lost too, not here yet) until
        // the retries run out. It arrived: the server's count judges, as for a flushed one.
        if (peer_may_leave && wc[i].opcode == WcOpcode::send && wc[i].status == WcStatus::retry_exc_err) {
          std::fprintf(stderr, "vrdma-perf: a reply was never acknowledged (%s): the server has gone\n",
                       std::string(to_string(wc[i].status)).c_str());
          disconnected = true;
          ++unacked_sends;
          continue;
        }
        if (wc[i].status != WcStatus::success)
          die(std::string(to_string(wc[i].opcode)) + " completed with " + std::string(to_string(wc[i].status)));
        if (wc[i].opcode == WcOpcode::send) {
          ++sent;
        } else if (wc[i].opcode == WcOpcode::recv) {
          ++received;
          bytes += wc[i].byte_len;
          if (wc[i].byte_len != cfg.size) ++wrong_length;
        }
      }
      if (*n == 0) sched_yield();
    }
    return done();
  };
  const auto run0 = SteadyClock::now();
  if (server) {  // run_server: send, complete the sends, receive the replies, disconnect
    post_sends();
    run_until([&] { return sent == count && received == count; });
    if (!disconnected) must(conn->disconnect(), "disconnect");
  } else {  // run_client: receive, reply, wait for the server's disconnect
    run_until([&] { return received == count; });
    peer_may_leave = true;
    if (received == count && !disconnected) post_sends();
    // ucmatose's client never waits for its sends: the server disconnects once it has every
    // reply, and a SEND whose ACK was lost is flushed here after it arrived (the server's count
    // is the judge, as with rping's last go-ahead).
    run_until([&] { return sent + flushed_sends + unacked_sends == count; });
    if (!run_until([&] { return disconnected; })) {
      std::fprintf(stderr, "vrdma-perf: the ucmatose server did not disconnect within 30 s; disconnecting\n");
      must(conn->disconnect(), "disconnect");
    }
  }
  const double run_s = std::chrono::duration<double>(SteadyClock::now() - run0).count();
  const bool ok = received == count && wrong_length == 0 &&
                  (sent == count || (!server && disconnected && sent + flushed_sends + unacked_sends == count));
  json o = {{"test", "ucmatose"}, {"peer_format", "ucmatose"}, {"device", cfg.device}, {"role", server ? "server" : "client"},
            {"size", cfg.size}, {"messages", count}, {"sent", sent}, {"received", received}, {"bytes_received", bytes},
            {"wrong_length", wrong_length}, {"sends_flushed_at_disconnect", flushed_sends},
            {"sends_unacknowledged_at_disconnect", unacked_sends}, {"ok", ok},
            {"connect_seconds", connect_s}, {"seconds", run_s}, {"peer_disconnected", disconnected}};
  if (auto st = soft::stats(*dev))
    o["engine"] = {{"rx_packets", st->rx_packets}, {"tx_packets", st->tx_packets}, {"retransmits", st->retransmits},
                   {"rx_dropped_icrc", st->rx_dropped_icrc}, {"rx_longer_than_mtu", st->rx_longer_than_mtu},
                   {"cm_mads_sent", st->cm_mads_sent}, {"cm_mads_received", st->cm_mads_received},
                   {"cm_resends", st->cm_resends}};
  std::cout << o.dump() << std::endl;
  if (!ok)
    std::fprintf(stderr, "vrdma-perf: ucmatose: %u of %u sends completed (%u flushed, %u never acknowledged), %u of %u "
                         "messages arrived, %u of the wrong length\n",
                 sent, count, flushed_sends, unacked_sends, received, count, wrong_length);
  return ok ? 0 : 2;
}

}  // namespace vrdma::perf
