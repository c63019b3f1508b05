// vrdma-perf as the peer of ibv_rc_pingpong, ibv_ud_pingpong and ibv_srq_pingpong, in both roles.
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <thread>

#include "perf_foreign.hpp"

namespace vrdma::perf {
namespace {
// --rate: when message `n` (from 0) may go, `rate` messages a second from `start`.
SteadyClock::time_point paced(SteadyClock::time_point start, std::uint64_t n, double rate) {
  return start + std::chrono::duration_cast<SteadyClock::duration>(
                     std::chrono::duration<double>(static_cast<double>(n) / rate));
}
}  // namespace

// ibv_rc_pingpong and ibv_ud_pingpong (--connection UD): SENDs of --size bytes back and forth,
// --iters each way, after a swap of lid:qpn:psn:gid records (the client's first, then the
// server's, then the client's "done"). The tool sends from the buffer it receives into, so after
// its first message it echoes ours: we check every byte. With -c it zeroes each page's first byte
// before its first send and checks them at the end, so our pattern keeps those bytes zero.
// UD (Q_Key 0x11111111, as the tool's): every receive starts with the 40-byte GRH, and the tool
// sends from its buffer + 40; UD has no retransmission, so both sides post their receives before
// the exchange, and a lost datagram ends the run at the 30 s wait (the rig runs UD without loss).
ForeignOutcome run_pingpong(Ctx& x, int fd, bool is_server) {
  constexpr std::uint32_t kQkey = 0x11111111;
  const bool ud = x.c.connection == "UD";
  const char* tool = ud ? "ibv_ud_pingpong" : "ibv_rc_pingpong";
  const std::uint32_t n = x.c.size, grh = ud ? 40 : 0;
  if (ud && (!mtu_from_bytes(x.c.mtu) || n > x.c.mtu))
    die("ibv_ud_pingpong's messages are single datagrams: --size " + std::to_string(n) + " must fit --mtu " +
        std::to_string(x.c.mtu) + " (256 .. 4096)");
  ForeignOutcome r;
  const std::uint32_t psn = initial_psn();
  const ForeignDest me = my_dest(x, psn);
  const std::uint64_t base = reinterpret_cast<std::uint64_t>(x.buf.data());
  const std::uint8_t* msg = x.buf.data() + grh;  // where a received message's bytes land
  std::uint8_t* tx = x.buf.data() + n + grh;
  for (std::uint32_t i = 0; i < n; i += 4096) tx[i] = 0;
  using M = QpAttrMask;
  if (ud) {  // a UD QP is ready to send and receive without knowing its peer
    QpAttr a;
    a.qp_state = QpState::init;
    a.qkey = kQkey;
    must(x.qp->modify(a, M::state | M::pkey_index | M::port | M::qkey), "UD QP to INIT");
    a.qp_state = QpState::rtr;
    must(x.qp->modify(a, M::state), "UD QP to RTR");
    a.qp_state = QpState::rts;
    a.sq_psn = psn;
    must(x.qp->modify(a, M::state | M::sq_psn), "UD QP to RTS");
  } else {
    qp_to_init(x);
  }
  auto post_recv = [&](std::uint64_t id) {
    Sge s{base, n + grh, x.mr->lkey()};
    RecvWr w{id, std::span<const Sge>(&s, 1)};
    must(x.qp->post_recv(std::span<const RecvWr>(&w, 1)), "post receive");
  };
  for (std::uint64_t i = 0; i < 16; ++i) post_recv(i);
  ForeignDest peer;
  if (!is_server) write_all(fd, pingpong_record(me));
  if (!parse_pingpong_record(read_exact(fd, kPingpongLen), peer))
    die(std::string("the peer's record is not ") + tool + "'s lid:qpn:psn:gid");
  std::shared_ptr<AddressHandle> ah;
  if (ud) {
    AhAttr h;
    h.dgid = peer.gid;
    h.sgid_index = static_cast<std::uint8_t>(x.gid.index);
    h.hop_limit = 1;
    ah = must(x.pd->create_ah(h), "create the address handle");
  } else {
    Remote rem;
    rem.qpn = static_cast<std::uint32_t>(peer.qpn);
    rem.psn = static_cast<std::uint32_t>(peer.psn);
    rem.gid = peer.gid;
    rem.max_rd_atomic = 1;
    rem.min_rnr_timer = 12;
    connect_qp(x, rem, psn);
  }
  if (is_server) {  // connected before our record goes: the client sends as soon as it has it
    write_all(fd, pingpong_record(me));
    read_exact(fd, 5);  // "done"
  } else {
    write_all(fd, std::string_view("done", 5));
  }
  r.records = {kPingpongLen};
  auto first_ok = [&] {  // the tool's own first message: 0x7b, page starts 0 with -c
    for (std::uint32_t i = 0; i < n; ++i)
      if (msg[i] != 0x7b && !(i % 4096 == 0 && msg[i] == 0)) return false;
    return true;
  };
  WorkCompletion wc[8];
  std::uint64_t sends_out = 0;
  auto send = [&](std::uint64_t i) {
    Sge s{base + n + grh, n, x.mr->lkey()};
    SendWr w;
    w.wr_id = i;
    w.opcode = WrOpcode::send;
    w.flags = SendFlags::signaled;
    w.sg_list = std::span<const Sge>(&s, 1);
    if (ud) {
      w.ud.ah = ah.get();
      w.ud.remote_qpn = static_cast<std::uint32_t>(peer.qpn);
      w.ud.remote_qkey = kQkey;
    }
    must(x.qp->post_send(std::span<const SendWr>(&w, 1)), "post send");
    ++sends_out;
  };
  auto wait_recv = [&](std::uint64_t i) {
    auto deadline = SteadyClock::now() + std::chrono::seconds(30);
    for (;;) {
      std::size_t k = poll_some(x, wc, 8);
      bool got = false;
      for (std::size_t j = 0; j < k; ++j) {
        if (wc[j].opcode != WcOpcode::recv) {
          --sends_out;
          continue;
        }
        got = true;
        bool ok = wc[j].byte_len == n + grh && (!ud || wc[j].src_qp == peer.qpn) &&
                  ((is_server && i == 0) ? first_ok() : std::memcmp(msg, tx, n) == 0);
        if (!ok && r.verified)
          std::fprintf(stderr, "vrdma-perf: message %llu from the peer is not what we expect (%u bytes from QP %u)\n",
                       static_cast<unsigned long long>(i), wc[j].byte_len, wc[j].src_qp);
        r.verified = r.verified && ok;
        post_recv(i + 16);
      }
      if (got) return;
      if (SteadyClock::now() > deadline)
        die("timed out waiting for the peer's message " + std::to_string(i) + (ud ? " (UD: lost?)" : ""));
    }
  };
  auto start = SteadyClock::now();
  for (std::uint64_t i = 0; i < x.c.iters; ++i) {
    if (x.c.rate > 0) std::this_thread::sleep_until(paced(start, i, x.c.rate));
    auto t0 = SteadyClock::now();
    if (is_server) {
      wait_recv(i);
      send(i);
    } else {
      send(i);
      wait_recv(i);
    }
    r.o.lat_us.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count() / 2);
  }
  // RC: the tool destroys its QP as soon as its last exchange completes. If the ACK of our last
  // SEND is lost on the way back, its retransmissions reach no QP and it runs out of retries. By
  // then the tool has every message (as server: it received our last one; as client: it answered
  // it, which it does only after receiving it), all checked, so that one completion is no
  // failure. In both roles we also stay a while after the tool's last message: if our ACK of it
  // is lost, the tool's retransmissions (every ~67 ms: its timeout 14, 7 retries) must find our
  // QP alive, or the tool fails its last SEND. (As server we used to leave at once: a Debian 13
  // guest's ibv_rc_pingpong client failed its last SEND so at 2 % loss, 2026-12-07.)
  r.o.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  auto deadline = SteadyClock::now() + std::chrono::seconds(10);
  auto linger_until = SteadyClock::now() + (ud ? std::chrono::milliseconds(0) : std::chrono::milliseconds(1000));
  while ((sends_out > 0 && SteadyClock::now() < deadline) || SteadyClock::now() < linger_until) {
    auto k = x.cq->poll(std::span<WorkCompletion>(wc, 8));
    if (!k) die("poll CQ: " + k.error().message);
    for (std::size_t j = 0; j < *k; ++j) {
      if (wc[j].opcode == WcOpcode::recv) continue;
      --sends_out;
      if (wc[j].status == WcStatus::success) continue;
      if (wc[j].status == WcStatus::retry_exc_err && wc[j].wr_id + 1 == x.c.iters) {
        r.last_ack_lost = true;
        continue;
      }
      die("work request " + std::to_string(wc[j].wr_id) + " failed: " + std::string(to_string(wc[j].status)));
    }
    if (*k == 0) {
      if (sends_out > 0) sched_yield(); else std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  r.o.ops = x.c.iters;
  return r;
}

// ibv_srq_pingpong: `qps` RC QPs a side, each pair playing ping-pong, every receive from one SRQ
// into one buffer; --iters counts messages over all QPs, as the tool's -n. The tool always swaps
// 256 records (its MAX_QP; the unused ones all zero), the client first, and sends from the buffer
// it receives into (zeroed at start), so each byte of a message we receive is ours or a zero (the
// tool's first sends, possibly torn by our first message landing meanwhile). We check that, every
// length, and that all-zero messages are no more than the tool's first ones.
ForeignOutcome run_srq_pingpong(Ctx& x, int fd, bool is_server) {
  constexpr std::size_t kMaxQp = 256;
  constexpr std::uint64_t kRecvs = 128;
  const std::uint32_t nq = x.c.qps, n = x.c.size;
  if (nq < 1 || nq >= kMaxQp) die("--qps must be 1 .. 255 (ibv_srq_pingpong's -q)");
  ForeignOutcome r;
  std::uint8_t* rx = x.buf.data();
  std::uint8_t* tx = x.buf.data() + n;
  fill(std::span(tx, n), 7);
  for (std::uint32_t i = 0; i < n; i += 4096) tx[i] = 0;  // the tool's -c checks page starts
  auto srq = must(x.pd->create_srq(static_cast<std::uint32_t>(kRecvs), 1), "create the SRQ");
  std::vector<std::shared_ptr<QueuePair>> qps;
  std::vector<std::uint32_t> psns;
  for (std::uint32_t i = 0; i < nq; ++i) {
    QpInitAttr ia;
    ia.send_cq = x.cq.get();
    ia.recv_cq = x.cq.get();
    ia.srq = srq.get();
    ia.cap.max_send_wr = 4;
    qps.push_back(must(x.pd->create_qp(ia), "create a QP"));
    psns.push_back((initial_psn() + 4099 * i) & 0xffffff);
  }
  auto post_recv = [&](std::uint64_t id) {
    Sge s = x.sge(0, n);
    RecvWr w{id, std::span<const Sge>(&s, 1)};
    must(srq->post_recv(std::span<const RecvWr>(&w, 1)), "post a receive to the SRQ");
  };
  for (std::uint64_t i = 0; i < kRecvs; ++i) post_recv(i);
  auto records = [&] {
    std::string all;
    for (std::size_t i = 0; i < kMaxQp; ++i) {
      ForeignDest d;  // unused slots: zeros, as the tool's memset leaves them
      if (i < nq) {
        d.qpn = qps[i]->qp_num();
        d.psn = psns[i];
        d.gid = x.gid.gid;
      }
      all += pingpong_record(d);
    }
    return all;
  };
  std::vector<ForeignDest> peer(kMaxQp);
  auto read_records = [&] {
    const std::string all = read_exact(fd, kMaxQp * kPingpongLen);
    for (std::size_t i = 0; i < kMaxQp; ++i)
      if (!parse_pingpong_record(std::string_view(all).substr(i * kPingpongLen, kPingpongLen), peer[i]))
        die("record " + std::to_string(i) + " of the peer's 256 is not ibv_srq_pingpong's lid:qpn:psn:gid");
    for (std::size_t i = nq; i < kMaxQp; ++i)
      if (peer[i].qpn != 0)
        die("the peer runs more than --qps " + std::to_string(nq) + " QPs (its record " + std::to_string(i) +
            " names QPN " + std::to_string(peer[i].qpn) + "): give vrdma-perf its -q");
  };
  if (is_server) {
    read_records();
  } else {
    write_all(fd, records());
    read_records();
  }
  const auto main_qp = x.qp;
  for (std::uint32_t i = 0; i < nq; ++i) {
    if (peer[i].qpn == 0) die("the peer runs fewer QPs than --qps " + std::to_string(nq) + ": give vrdma-perf its -q");
    Remote rem;
    rem.qpn = static_cast<std::uint32_t>(peer[i].qpn);
    rem.psn = static_cast<std::uint32_t>(peer[i].psn);
    rem.gid = peer[i].gid;
    rem.max_rd_atomic = 1;
    rem.min_rnr_timer = 12;
    x.qp = qps[i];
    connect_qp(x, rem, psns[i]);
  }
  x.qp = main_qp;
  if (is_server) {
    write_all(fd, records());
    read_exact(fd, 5);  // "done"
  } else {
    write_all(fd, std::string_view("done", 5));
  }
  r.records = {kMaxQp * kPingpongLen};
  // The tool's loop, mirrored: --iters counts messages over all QPs (its scnt and rcnt); a QP
  // sends again once both its send and its receive completed, while fewer than --iters sends
  // have completed; the client starts with one send on every QP.
  constexpr unsigned kSend = 1, kRecv = 2;
  std::vector<unsigned> pending(nq, kRecv);
  std::uint64_t scnt = 0, rcnt = 0, posted = 0, next_recv = kRecvs, zeros = 0, unanswered = 0;
  std::deque<std::uint32_t> ready;  // QPs whose next send waits for --rate
  auto send = [&](std::uint32_t q) {
    Sge s = x.sge(1, n);
    SendWr w;
    w.wr_id = q;
    w.opcode = WrOpcode::send;
    w.flags = SendFlags::signaled;
    w.sg_list = std::span<const Sge>(&s, 1);
    must(qps[q]->post_send(std::span<const SendWr>(&w, 1)), "post send");
    ++posted;
    pending[q] = kRecv | kSend;
  };
  auto index_of = [&](std::uint32_t qpn) {
    for (std::uint32_t q = 0; q < nq; ++q)
      if (qps[q]->qp_num() == qpn) return q;
    die("a completion for QP " + std::to_string(qpn) + ", which is none of ours");
  };
  WorkCompletion wc[32];
  const auto start = SteadyClock::now();
  auto send_ready = [&] {
    while (!ready.empty() && scnt < x.c.iters && (x.c.rate <= 0 || SteadyClock::now() >= paced(start, posted, x.c.rate))) {
      send(ready.front());
      ready.pop_front();
    }
  };
  if (!is_server)
    for (std::uint32_t q = 0; q < nq; ++q) ready.push_back(q);
  auto last = start;
  while (rcnt < x.c.iters || scnt + unanswered < x.c.iters) {
    send_ready();
    // Once the tool's every message is in, it leaves when it has ours: a SEND of ours whose ACK
    // was lost then runs out of retries against a QP that is gone (counted below, not fatal).
    x.peer_may_leave = rcnt >= x.c.iters;
    const std::size_t k = poll_some(x, wc, 32);
    if (k > 0) last = SteadyClock::now();
    if (SteadyClock::now() - last > std::chrono::seconds(30))
      die("no completion in 30 s, " + std::to_string(rcnt) + " messages received and " + std::to_string(scnt) +
          " sent of " + std::to_string(x.c.iters));
    for (std::size_t j = 0; j < k; ++j) {
      const std::uint32_t q = index_of(wc[j].qp_num);
      if (wc[j].opcode != WcOpcode::recv && wc[j].status != WcStatus::success) {
        ++unanswered;
        pending[q] &= ~kSend;
      } else if (wc[j].opcode != WcOpcode::recv) {
        ++scnt;
        pending[q] &= ~kSend;
      } else {
        ++rcnt;
        pending[q] &= ~kRecv;
        // Byte by byte: ours, or the tool's zeros. One of the tool's first sends can go out while our
        // first message is landing in the buffer it sends from: part zeros, part ours.
        const bool all_zero = std::all_of(rx, rx + n, [](std::uint8_t b) { return b == 0; });
        zeros += all_zero ? 1 : 0;
        bool bytes_ok = true;
        for (std::uint32_t b = 0; b < n && bytes_ok; ++b) bytes_ok = rx[b] == tx[b] || rx[b] == 0;
        const bool ok = wc[j].byte_len == n && bytes_ok;
        if (!ok && r.verified)
          std::fprintf(stderr, "vrdma-perf: message %llu (QP %u) is not what we expect (%u bytes)\n",
                       static_cast<unsigned long long>(rcnt), q, wc[j].byte_len);
        r.verified = r.verified && ok;
        post_recv(next_recv++);
      }
      if (scnt < x.c.iters && pending[q] == 0) {
        pending[q] = kSend;  // queued: not ready again until this send completes
        ready.push_back(q);
      }
    }
  }
  // Sends still out when the counts are reached (the tool may have left: its QPs then answer
  // nothing): give them a second, and count what did not complete rather than fail on it. The
  // QPs stay that second in any case: if our ACK of one of the tool's last SENDs was lost, its
  // retransmissions must find the QP alive (as in run_pingpong).
  const auto drain = SteadyClock::now() + std::chrono::seconds(1);
  while (SteadyClock::now() < drain) {
    auto k = x.cq->poll(std::span<WorkCompletion>(wc, 32));
    if (!k) die("poll CQ: " + k.error().message);
    for (std::size_t j = 0; j < *k; ++j)
      if (wc[j].opcode != WcOpcode::recv) (wc[j].status == WcStatus::success ? scnt : unanswered) += 1;
    if (*k == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (posted > scnt) r.last_ack_lost = true;  // in the JSON: sends the tool no longer answered
  r.o.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  r.o.ops = rcnt;
  if (zeros > nq) {  // only the tool's first message on each QP can be its zeroed buffer
    std::fprintf(stderr, "vrdma-perf: %llu messages held the tool's zeros, more than its %u first ones\n",
                 static_cast<unsigned long long>(zeros), nq);
    r.verified = false;
  }
  return r;
}

}  // namespace vrdma::perf
