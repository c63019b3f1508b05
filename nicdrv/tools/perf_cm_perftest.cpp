// perftest with -R (RDMA-CM) in either role over the nicdrv connection API (see perf_cm.hpp).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "perf_cm.hpp"
#include "perf_cm_common.hpp"
#include "vrdma/nicdrv/cm.hpp"
#include "vrdma/nicdrv/registry.hpp"
#include "vrdma/nicdrv/soft.hpp"

namespace vrdma::perf {

using namespace cm_detail;
using namespace vrdma::nicdrv;
using SteadyClock = std::chrono::steady_clock;
using json = nlohmann::json;

int run_perftest_cm_server(const CmRunConfig& cfg) {
  // write_bw and read_bw: the client WRITEs into, or READs from, the region our keys name.
  const bool write = cfg.test == "write_bw", read = cfg.test == "read_bw", rdma = write || read;
  if (cfg.test != "send_bw" && !rdma)
    die("--peer-format perftest --cm serves send_bw, write_bw and read_bw (ib_send_bw -R, ib_write_bw -R, "
        "ib_read_bw -R), not " + cfg.test);
  auto dev = must(open_device(cfg.device), "open " + cfg.device);
  auto pd = must(dev->alloc_pd(), "alloc PD");
  constexpr std::uint32_t kMsg = 4096, kCommRecvs = 8, kDataRecvs = 256;
  const std::uint32_t size = std::max<std::uint32_t>(cfg.size, 1);
  // The data region: a receive slot per posted receive (send_bw), and room for perftest's WRITEs
  // or READs, which cycle within its cycle buffer (a page by default; the message when larger)
  // from the address we name: twice the larger of the message and 64 KiB.
  const std::size_t data_len =
      std::max(std::size_t{size} * kDataRecvs, 2 * std::max<std::size_t>(size, std::size_t{1} << 16));
  auto mem = must(dev->alloc_buffer(std::size_t{kMsg} * (kCommRecvs + 1) + data_len), "buffers");
  auto mr = must(pd->reg_mr(mem->data(), mem->size(), Access::local_write | Access::remote_read | Access::remote_write),
                 "register");
  auto addr = [&](std::size_t off) { return mr->addr() + off; };
  const std::size_t send_off = std::size_t{kMsg} * kCommRecvs, data_off = send_off + kMsg;
  struct Side {
    std::shared_ptr<CompletionQueue> cq;
    std::shared_ptr<QueuePair> qp;
  };
  auto make = [&](std::uint32_t recvs) {
    Side s;
    s.cq = must(dev->create_cq(2 * recvs + 64), "create CQ");
    QpInitAttr ia;
    ia.send_cq = s.cq.get();
    ia.recv_cq = s.cq.get();
    ia.cap.max_send_wr = 64;
    ia.cap.max_recv_wr = recvs;
    s.qp = must(pd->create_qp(ia), "create QP");
    to_init(*s.qp, Access::local_write | Access::remote_read | Access::remote_write);
    return s;
  };
  auto post_recv = [&](Side& s, std::uint64_t id, std::size_t off, std::uint32_t len) {
    Sge g{addr(off), len, mr->lkey()};
    RecvWr w{id, std::span<const Sge>(&g, 1)};
    must(s.qp->post_recv(std::span<const RecvWr>(&w, 1)), "post receive");
  };
  Side comm = make(kCommRecvs), data = make(kDataRecvs);
  for (std::uint32_t i = 0; i < kCommRecvs; ++i) post_recv(comm, i, std::size_t{kMsg} * i, kMsg);
  for (std::uint32_t i = 0; i < kDataRecvs; ++i) post_recv(data, i, data_off + std::size_t{size} * i, size);
  CmParams p;
  p.responder_resources = p.initiator_depth = 16;
  p.local_ack_timeout = static_cast<std::uint8_t>(cfg.qp_timeout);
  p.timeout = std::chrono::milliseconds(20000);
  auto listener = must(cm_listen(dev, cfg.port), "listen on port " + std::to_string(cfg.port));
  auto comm_conn = must(listener->get_request(std::chrono::seconds(120)), "wait for the perftest client");
  must(comm_conn->accept(*comm.qp, p), "accept the out-of-band connection");
  std::unique_ptr<CmConnection> data_conn;
  std::vector<std::size_t> records;
  std::uint64_t received = 0, keys = 0;
  bool done = false, client_idle = false;
  // Who ends the test connection: perftest up to 4.5 has its client disconnect it after the
  // closing record exchange (ctx_close_connection); from 24.x its server does
  // (rdma_cm_disconnect_nodes: only the server calls rdma_disconnect, the client waits for the
  // DISCONNECTED event). So once a record arrives after the test's data (the closing one), we
  // disconnect the test connection ourselves unless the client has within kCloseGrace. Our CM
  // resends that DREQ until the DREP (a lost one would leave such a client waiting for ever).
  constexpr auto kCloseGrace = std::chrono::seconds(1);
  bool data_flushed = false, we_disconnected = false;
  std::optional<SteadyClock::time_point> closing_record_at;
  std::uint64_t packets_at_record = 0;
  const auto start = SteadyClock::now();
  auto last = start;
  // WRITEs and READs complete nothing on our side: the engine's packets are the test's progress.
  std::uint64_t packets_seen = 0;
  auto engine_packets = [&] {
    auto st = soft::stats(*dev);
    return st ? st->rx_packets + st->tx_packets : 0;
  };
  const auto at_start = soft::stats(*dev);
  const std::uint64_t rx_at_start = at_start ? at_start->rx_packets : 0;
  const std::uint64_t tx_at_start = at_start ? at_start->tx_packets : 0;
  auto packets_checked = start;
  WorkCompletion wc[16];
  while (!done && SteadyClock::now() - last < kStepTimeout) {
    if (rdma && SteadyClock::now() - packets_checked >= std::chrono::milliseconds(50)) {
      packets_checked = SteadyClock::now();
      if (const auto now_packets = engine_packets(); now_packets != packets_seen) {
        packets_seen = now_packets;
        last = packets_checked;
      }
    }
    if (closing_record_at && !data_flushed && !we_disconnected && SteadyClock::now() - *closing_record_at >= kCloseGrace) {
      must(data_conn->disconnect(), "disconnect the test connection");
      we_disconnected = true;
      last = SteadyClock::now();
    }
    // After its test the client disconnects and exits; Linux sends that DREQ once (ib_send_bw
    // destroys its cm_id at once: no resend), so a lost one leaves only silence, as with rping.
    if (data_conn && (received > 0 || rdma) && SteadyClock::now() - last >= kClientIdle) {
      std::fprintf(stderr, "vrdma-perf: the client sent nothing for %lld s after %llu messages (its disconnect was "
                           "lost?); taking it as gone\n",
                   static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(kClientIdle).count()),
                   static_cast<unsigned long long>(received));
      client_idle = true;
      break;
    }
    if (!data_conn) {  // the test QP's connection comes while records are exchanged
      auto r = listener->get_request(std::chrono::milliseconds(1));
      if (r) {
        data_conn = std::move(*r);
        must(data_conn->accept(*data.qp, p), "accept the test connection");
        last = SteadyClock::now();
      }
    }
    for (Side* s : {&comm, &data}) {
      auto n = s->cq->poll(wc);
      if (!n) die("poll CQ: " + n.error().message);
      for (std::size_t i = 0; i < *n; ++i) {
        last = SteadyClock::now();
        if (wc[i].status == WcStatus::wr_flush_err) {  // a disconnect (the client's, or ours of the test QP)
          if (s == &comm) done = true;
          else data_flushed = true;
          continue;
        }
        if (wc[i].status != WcStatus::success)
          die(std::string(to_string(wc[i].opcode)) + " completed with " + std::string(to_string(wc[i].status)));
        if (wc[i].opcode != WcOpcode::recv) continue;
        if (s == &data) {
          ++received;
          post_recv(data, wc[i].wr_id, data_off + std::size_t{size} * wc[i].wr_id, size);
          continue;
        }
        // A record: answer with the client's own bytes, then take the next one. Its keys
        // (struct pingpong_dest, big-endian: lid, out_reads, qpn, psn, rkey at 16, vaddr at
        // 24, gid, srqn, gid_index; 56 bytes, 64 with perftest 23's tail_markers_vaddr) name,
        // for write_bw and read_bw, our data region instead: the client WRITEs there, or READs.
        const std::size_t off = std::size_t{kMsg} * wc[i].wr_id;
        records.push_back(wc[i].byte_len);
        // The test's data came in between: SENDs received, or for WRITEs and READs more packets
        // than a record exchange takes (a SEND each way and their ACKs).
        const std::uint64_t packets_now = engine_packets();
        if (data_conn && (received > 0 || (rdma && packets_now - packets_at_record > 64)))
          closing_record_at = SteadyClock::now();
        packets_at_record = packets_now;
        std::memcpy(mem->data() + send_off, mem->data() + off, wc[i].byte_len);
        if (rdma && (wc[i].byte_len == 56 || wc[i].byte_len == 64)) {
          put_be(mem->data() + send_off + 16, mr->rkey(), 4);
          put_be(mem->data() + send_off + 24, addr(data_off), 8);
          ++keys;
        }
        Sge g{addr(send_off), wc[i].byte_len, mr->lkey()};
        SendWr w;
        w.wr_id = 1000;
        w.opcode = WrOpcode::send;
        w.flags = SendFlags::signaled;
        w.sg_list = std::span<const Sge>(&g, 1);
        must(comm.qp->post_send(std::span<const SendWr>(&w, 1)), "answer a record");
        post_recv(comm, wc[i].wr_id, off, kMsg);
      }
    }
  }
  // The client's disconnect may be seen on the out-of-band QP before every message of the test
  // QP was polled (16 a poll): count what is left.
  for (bool more = true; more;) {
    auto n = data.cq->poll(wc);
    if (!n) die("poll CQ: " + n.error().message);
    more = *n > 0;
    for (std::size_t i = 0; i < *n; ++i)
      if (wc[i].status == WcStatus::success && wc[i].opcode == WcOpcode::recv) ++received;
  }
  const double secs = std::chrono::duration<double>(SteadyClock::now() - start).count();
  json out = {{"test", cfg.test}, {"peer_format", "perftest"}, {"cm", true}, {"device", cfg.device}, {"role", "server"},
              {"size", size}, {"ops", received}, {"seconds", secs}, {"records", records}, {"keys_answered", keys},
              {"test_connection", data_conn != nullptr}, {"peer_disconnected", done}, {"client_idle", client_idle},
              {"we_disconnected_test", we_disconnected}};
  std::uint64_t rx_test = 0, tx_test = 0;
  if (auto st = soft::stats(*dev)) {
    rx_test = st->rx_packets - rx_at_start;
    tx_test = st->tx_packets - tx_at_start;
    out["engine"] = {{"rx_dropped_icrc", st->rx_dropped_icrc}, {"retransmits", st->retransmits},
                     {"cm_mads_sent", st->cm_mads_sent}, {"cm_mads_received", st->cm_mads_received},
                     {"cm_resends", st->cm_resends}, {"rx_packets", rx_test}, {"rx_bytes", st->rx_bytes},
                     {"tx_packets", tx_test}, {"tx_bytes", st->tx_bytes}};
  }
  std::cout << out.dump() << std::endl;
  // The data moved: SENDs received; WRITEs' packets received; READ responses sent.
  const bool moved = write ? keys > 0 && rx_test > 0 : read ? keys > 0 && tx_test > 0 : received > 0;
  return moved && data_conn && (done || client_idle) ? 0 : 2;
}


// perftest's -R server (ib_send_bw -R / ib_write_bw -R with no address) as its client: the same
// records as perftest's client sends (perftest_communication.c), each a SEND on the out-of-band
// connection answered by one of the server's: the version, the cycle buffer and cache line sizes,
// the path MTU (the smaller wins), then the test QP's connection (a second one on the port, once
// the server listens again), then key records (struct pingpong_dest, 56 bytes, big-endian): 6
// before a send_bw, 5 before a write_bw; the test; for write_bw the "finished" record and the
// report (size, iterations, peak and average bandwidth, message rate, 8 bytes each, which the
// server prints as its result); last the closing record.
int run_perftest_cm_client(const CmRunConfig& cfg) {
  const bool write = cfg.test == "write_bw";
  if (cfg.test != "send_bw" && !write)
    die("--peer-format perftest --cm --connect runs send_bw and write_bw (against ib_send_bw -R, ib_write_bw -R), not " +
        cfg.test);
  if (cfg.iters == 0 || cfg.iters > 1000000) die("--cm --connect: --iters 1..1000000");
  auto dev = must(open_device(cfg.device), "open " + cfg.device);
  auto pd = must(dev->alloc_pd(), "alloc PD");
  constexpr std::uint32_t kMsg = 4096, kCommRecvs = 8, kDepth = 128;
  const std::uint32_t size = std::max<std::uint32_t>(cfg.size, 1);
  auto mem = must(dev->alloc_buffer(std::size_t{kMsg} * (kCommRecvs + 1) + size), "buffers");
  auto mr = must(pd->reg_mr(mem->data(), mem->size(), Access::local_write | Access::remote_read | Access::remote_write),
                 "register");
  const std::size_t send_off = std::size_t{kMsg} * kCommRecvs, data_off = send_off + kMsg;
  for (std::uint32_t i = 0; i < size; ++i) mem->data()[data_off + i] = static_cast<std::uint8_t>(i * 7 + 1);
  auto cq = must(dev->create_cq(2 * kDepth + 2 * kCommRecvs), "create CQ");
  auto make_qp = [&](std::uint32_t recvs) {
    QpInitAttr ia;
    ia.send_cq = cq.get();
    ia.recv_cq = cq.get();
    ia.cap.max_send_wr = kDepth;
    ia.cap.max_recv_wr = std::max<std::uint32_t>(recvs, 1);
    auto qp = must(pd->create_qp(ia), "create QP");
    to_init(*qp, Access::local_write | Access::remote_read | Access::remote_write);
    return qp;
  };
  auto comm = make_qp(kCommRecvs);
  for (std::uint32_t i = 0; i < kCommRecvs; ++i) {
    Sge g{mr->addr() + std::size_t{kMsg} * i, kMsg, mr->lkey()};
    RecvWr w{i, std::span<const Sge>(&g, 1)};
    must(comm->post_recv(std::span<const RecvWr>(&w, 1)), "post receive");
  }
  CmParams p;
  p.responder_resources = p.initiator_depth = 16;
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  p.local_ack_timeout = static_cast<std::uint8_t>(cfg.qp_timeout);
  p.timeout = std::chrono::milliseconds(20000);
  const std::string where = cfg.connect + ":" + std::to_string(cfg.port);
  auto comm_conn = must(cm_resolve(dev, cfg.connect, cfg.port, p), "resolve " + cfg.connect);
  must(comm_conn->connect(*comm, p), "connect the out-of-band connection to " + where);
  // Completions of both QPs come on the one CQ; the data QP's are counted as they come.
  std::uint64_t completed = 0;
  std::vector<std::vector<std::uint8_t>> answers;
  bool comm_sent = false;
  WorkCompletion wc[32];
  auto poll = [&](const char* what) {
    auto n = cq->poll(wc);
    if (!n) die("poll CQ: " + n.error().message);
    for (std::size_t i = 0; i < *n; ++i) {
      if (wc[i].status != WcStatus::success)
        die(std::string(what) + ": " + std::string(to_string(wc[i].opcode)) + " completed with " +
            std::string(to_string(wc[i].status)));
      if (wc[i].qp_num != comm->qp_num()) {
        ++completed;
      } else if (wc[i].opcode == WcOpcode::recv) {
        const std::size_t off = std::size_t{kMsg} * wc[i].wr_id;
        answers.emplace_back(mem->data() + off, mem->data() + off + wc[i].byte_len);
        Sge g{mr->addr() + off, kMsg, mr->lkey()};
        RecvWr w{wc[i].wr_id, std::span<const Sge>(&g, 1)};
        must(comm->post_recv(std::span<const RecvWr>(&w, 1)), "post receive");
      } else {
        comm_sent = true;
      }
    }
  };
  std::vector<std::size_t> record_sizes;
  // One exchange: our record, then the server's answer (perftest's client writes first).
  auto exchange = [&](std::span<const std::uint8_t> mine, const char* what) {
    std::memcpy(mem->data() + send_off, mine.data(), mine.size());
    Sge g{mr->addr() + send_off, static_cast<std::uint32_t>(mine.size()), mr->lkey()};
    SendWr w;
    w.wr_id = 1000;
    w.opcode = WrOpcode::send;
    w.flags = SendFlags::signaled;
    w.sg_list = std::span<const Sge>(&g, 1);
    comm_sent = false;
    must(comm->post_send(std::span<const SendWr>(&w, 1)), std::string("send ") + what);
    const auto deadline = SteadyClock::now() + kStepTimeout;
    while ((!comm_sent || answers.empty()) && SteadyClock::now() < deadline) poll(what);
    if (answers.empty())
      die(std::string("perftest's server did not answer our ") + what + " within 30 s (is it ib_" + cfg.test +
          " -R, the same test?)");
    auto a = std::move(answers.front());
    answers.erase(answers.begin());
    record_sizes.push_back(a.size());
    return a;
  };
  auto be_record = [](std::uint64_t v, int n) {
    std::vector<std::uint8_t> r(static_cast<std::size_t>(n));
    put_be(r.data(), v, n);
    return r;
  };
  const auto t0 = SteadyClock::now();
  // The version (perftest's own, 16 bytes: the server refuses one below 5.70), then the sizes
  // (big-endian ints; each side takes the larger), then the MTU as text ("5": 4096).
  std::vector<std::uint8_t> version(16, 0);
  std::memcpy(version.data(), "6.06", 4);
  const auto rem_version = exchange(version, "version");
  exchange(be_record(4096, 4), "cycle buffer size");
  exchange(be_record(64, 4), "cache line size");
  auto port = must(dev->query_port(1), "query port");
  const int mtu_enum = static_cast<int>(port.active_mtu);
  std::vector<std::uint8_t> mtu_text = {static_cast<std::uint8_t>('0' + mtu_enum), 0};
  const auto rem_mtu = exchange(mtu_text, "path MTU");
  const int peer_mtu = rem_mtu.empty() ? 0 : rem_mtu[0] - '0';
  const int mtu = peer_mtu >= 1 && peer_mtu <= 5 ? std::min(mtu_enum, peer_mtu) : mtu_enum;
  // Our key records: LID 0, READ depth, QPN (the test QP's, once it exists), PSN 0, the rkey
  // and address of our buffer, GID.
  std::vector<std::uint8_t> key(56, 0);
  put_be(key.data() + 4, 16, 4);
  put_be(key.data() + 16, mr->rkey(), 4);
  put_be(key.data() + 24, mr->addr() + data_off, 8);
  if (auto g = dev->query_gid(1, 0)) std::memcpy(key.data() + 32, g->gid.raw.data(), 16);
  std::uint32_t rkey = 0;
  std::uint64_t raddr = 0;
  std::shared_ptr<QueuePair> data;
  std::unique_ptr<CmConnection> data_conn;
  const int before = write ? 5 : 6;
  for (int i = 0; i < before; ++i) {
    if (i == 1) {
      // The test QP's connection, between the first two key records (create_rdma_cm_connection's
      // syncs): the server listens for it once it answered the first, so a REJ (it did not listen
      // yet) is tried again, on a fresh QP, as perftest's client does.
      for (int attempt = 0;; ++attempt) {
        data = make_qp(0);
        auto c = cm_resolve(dev, cfg.connect, cfg.port, p);
        if (c) {
          if (auto st = (*c)->connect(*data, p); st) {
            data_conn = std::move(*c);
            break;
          } else if (attempt >= 50) {
            die("connect the test QP to " + where + ": " + st.error().message);
          }
        } else if (attempt >= 50) {
          die("resolve " + cfg.connect + ": " + c.error().message);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      put_be(key.data() + 8, data->qp_num(), 4);
    }
    const auto r = exchange(key, "key record");
    if (r.size() < 32) die("perftest's key record has " + std::to_string(r.size()) + " bytes (want 56)");
    rkey = static_cast<std::uint32_t>(get_be(r.data() + 16, 4));
    raddr = get_be(r.data() + 24, 8);
  }
  // The test: iters messages (SEND into the server's receives; WRITE to the buffer it named),
  // at most kDepth in flight, each signaled and counted.
  const auto run0 = SteadyClock::now();
  std::uint64_t posted = 0;
  const auto run_deadline = run0 + std::chrono::seconds(120);
  while (completed < cfg.iters && SteadyClock::now() < run_deadline) {
    while (posted < cfg.iters && posted - completed < kDepth) {
      Sge g{mr->addr() + data_off, size, mr->lkey()};
      SendWr w;
      w.wr_id = posted;
      w.opcode = write ? WrOpcode::rdma_write : WrOpcode::send;
      w.flags = SendFlags::signaled;
      w.sg_list = std::span<const Sge>(&g, 1);
      w.rdma.remote_addr = raddr;
      w.rdma.rkey = rkey;
      must(data->post_send(std::span<const SendWr>(&w, 1)), "post the test's work request");
      ++posted;
    }
    poll("the test");
  }
  const double run_s = std::chrono::duration<double>(SteadyClock::now() - run0).count();
  if (completed < cfg.iters)
    die("the test did not finish in 120 s: " + std::to_string(completed) + " of " + std::to_string(cfg.iters) +
        " completed");
  const double mbps = static_cast<double>(size) * static_cast<double>(cfg.iters) / run_s / 1048576.0;
  const double mpps = static_cast<double>(cfg.iters) / run_s / 1e6;
  if (write) {
    exchange(key, "finished record");
    auto dbl = [&](double d) {
      std::uint64_t bits = 0;
      std::memcpy(&bits, &d, 8);
      return be_record(bits, 8);
    };
    exchange(be_record(size, 8), "report: size");
    exchange(be_record(cfg.iters, 8), "report: iterations");
    exchange(dbl(mbps), "report: peak bandwidth");
    exchange(dbl(mbps), "report: average bandwidth");
    exchange(dbl(mpps), "report: message rate");
  }
  exchange(key, "closing record");
  must(data_conn->disconnect(), "disconnect the test QP");
  must(comm_conn->disconnect(), "disconnect");
  std::string peer_version(reinterpret_cast<const char*>(rem_version.data()),
                           strnlen(reinterpret_cast<const char*>(rem_version.data()), rem_version.size()));
  json out = {{"test", cfg.test},         {"peer_format", "perftest"}, {"cm", true},
              {"device", cfg.device},     {"role", "client"},          {"size", size},
              {"ops", completed},         {"bytes", completed * size}, {"seconds", run_s},
              {"mb_per_s", mbps},         {"mtu", mtu_bytes(static_cast<Mtu>(mtu))},
              {"peer_version", peer_version}, {"records", record_sizes},
              {"total_seconds", std::chrono::duration<double>(SteadyClock::now() - t0).count()}};
  if (auto st = soft::stats(*dev))
    out["engine"] = {{"tx_packets", st->tx_packets}, {"retransmits", st->retransmits},
                     {"cm_mads_sent", st->cm_mads_sent}, {"cm_resends", st->cm_resends}};
  std::cout << out.dump() << std::endl;
  return 0;
}

}  // namespace vrdma::perf
