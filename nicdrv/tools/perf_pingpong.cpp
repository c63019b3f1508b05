// vrdma-perf as ibv_rc_pingpong's and ibv_ud_pingpong's peer, in both roles.
#include <sched.h>

#include <cstdio>
#include <cstring>
#include <thread>

#include "perf_foreign.hpp"

namespace vrdma::perf {

// ibv_rc_pingpong: SENDs of --size bytes back and forth, --iters each way. The tool sends and
// receives in one buffer, so after its first message it echoes ours: we check every byte.
// With -c it zeroes each page's first byte before its first send and checks them at the end,
// so our pattern keeps those bytes zero.
ForeignOutcome run_pingpong(Ctx& x, int fd, bool is_server) {
  ForeignOutcome r;
  const std::uint32_t psn = initial_psn();
  const ForeignDest me = my_dest(x, psn);
  const std::uint32_t n = x.c.size;
  std::uint8_t* rx = x.buf.data();
  std::uint8_t* tx = x.buf.data() + n;
  for (std::uint32_t i = 0; i < n; i += 4096) tx[i] = 0;
  qp_to_init(x);
  for (std::uint64_t i = 0; i < 16; ++i) {
    Sge s = x.sge(0, n);
    RecvWr w{i, std::span<const Sge>(&s, 1)};
    must(x.qp->post_recv(std::span<const RecvWr>(&w, 1)), "post receive");
  }
  ForeignDest peer;
  if (is_server) {
    std::string m = read_exact(fd, kPingpongLen);
    if (!parse_pingpong_record(m, peer)) die("the peer's record is not ibv_rc_pingpong's lid:qpn:psn:gid");
  } else {
    write_all(fd, pingpong_record(me));
    std::string m = read_exact(fd, kPingpongLen);
    if (!parse_pingpong_record(m, peer)) die("the peer's record is not ibv_rc_pingpong's lid:qpn:psn:gid");
  }
  Remote rem;
  rem.qpn = static_cast<std::uint32_t>(peer.qpn);
  rem.psn = static_cast<std::uint32_t>(peer.psn);
  rem.gid = peer.gid;
  rem.max_rd_atomic = 1;
  rem.min_rnr_timer = 12;
  connect_qp(x, rem, psn);
  if (is_server) {
    write_all(fd, pingpong_record(me));
    read_exact(fd, 5);  // "done"
  } else {
    write_all(fd, std::string_view("done", 5));
  }
  r.records = {kPingpongLen};
  auto first_ok = [&] {  // the tool's own first message: 0x7b, page starts 0 with -c
    for (std::uint32_t i = 0; i < n; ++i)
      if (rx[i] != 0x7b && !(i % 4096 == 0 && rx[i] == 0)) return false;
    return true;
  };
  WorkCompletion wc[8];
  std::uint64_t sends_out = 0;
  auto send = [&](std::uint64_t i) {
    Sge s = x.sge(1, n);
    SendWr w;
    w.wr_id = i;
    w.opcode = WrOpcode::send;
    w.flags = SendFlags::signaled;
    w.sg_list = std::span<const Sge>(&s, 1);
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
        bool ok = wc[j].byte_len == n && ((is_server && i == 0) ? first_ok() : std::memcmp(rx, tx, n) == 0);
        if (!ok && r.verified) std::fprintf(stderr, "vrdma-perf: message %llu from the peer is not what we expect\n",
                                            static_cast<unsigned long long>(i));
        r.verified = r.verified && ok;
        Sge s = x.sge(0, n);
        RecvWr w{i + 16, std::span<const Sge>(&s, 1)};
        must(x.qp->post_recv(std::span<const RecvWr>(&w, 1)), "post receive");
      }
      if (got) return;
      if (SteadyClock::now() > deadline) die("timed out waiting for the peer's message " + std::to_string(i));
    }
  };
  auto start = SteadyClock::now();
  for (std::uint64_t i = 0; i < x.c.iters; ++i) {
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
  // The tool destroys its QP as soon as its last exchange completes. If the ACK of our last SEND
  // is lost on the way back, its retransmissions reach no QP and it runs out of retries. By then
  // the tool has every message (as server: it received our last one; as client: it answered it,
  // which it does only after receiving it), all checked, so that one completion is no failure.
  // As client we also stay a while after the tool's last message: if our ACK of it is lost, the
  // tool's retransmissions (every ~67 ms: its timeout 14, 7 retries) must find our QP alive, or
  // the tool fails its last SEND.
  r.o.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  auto deadline = SteadyClock::now() + std::chrono::seconds(10);
  auto linger_until = SteadyClock::now() + (is_server ? std::chrono::milliseconds(0) : std::chrono::milliseconds(1000));
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

// ibv_ud_pingpong: the same records and ping-pong over UD QPs (Q_Key 0x11111111, as the tool's).
// A UD receive starts with the 40-byte GRH, so the tool sends from its buffer + 40, where the
// message it received landed: after its first message it echoes ours, and we check every byte.
// UD has no retransmission: both sides post their receives before the exchange, and a lost
// datagram ends the run at the 30 s wait (the rig runs this without loss).
ForeignOutcome run_ud_pingpong(Ctx& x, int fd, bool is_server) {
  constexpr std::uint32_t kQkey = 0x11111111, kGrh = 40;
  ForeignOutcome r;
  const std::uint32_t psn = initial_psn();
  const ForeignDest me = my_dest(x, psn);
  const std::uint32_t n = x.c.size;
  if (auto mtu = mtu_from_bytes(x.c.mtu); !mtu || n > x.c.mtu)
    die("ibv_ud_pingpong's messages are single datagrams: --size " + std::to_string(n) + " must fit --mtu " +
        std::to_string(x.c.mtu) + " (256 .. 4096)");
  std::uint8_t* rx = x.buf.data();  // GRH, then the message
  std::uint8_t* tx = x.buf.data() + n + kGrh;
  const std::uint64_t base = reinterpret_cast<std::uint64_t>(x.buf.data());
  for (std::uint32_t i = 0; i < n; i += 4096) tx[i] = 0;
  using M = QpAttrMask;
  QpAttr a;
  a.qp_state = QpState::init;
  a.qkey = kQkey;
  must(x.qp->modify(a, M::state | M::pkey_index | M::port | M::qkey), "UD QP to INIT");
  auto post_recv = [&](std::uint64_t id) {
    Sge s{base, n + kGrh, x.mr->lkey()};
    RecvWr w{id, std::span<const Sge>(&s, 1)};
    must(x.qp->post_recv(std::span<const RecvWr>(&w, 1)), "post receive");
  };
  for (std::uint64_t i = 0; i < 16; ++i) post_recv(i);
  a.qp_state = QpState::rtr;
  must(x.qp->modify(a, M::state), "UD QP to RTR");
  a.qp_state = QpState::rts;
  a.sq_psn = psn;
  must(x.qp->modify(a, M::state | M::sq_psn), "UD QP to RTS");
  ForeignDest peer;
  if (!is_server) write_all(fd, pingpong_record(me));
  if (!parse_pingpong_record(read_exact(fd, kPingpongLen), peer))
    die("the peer's record is not ibv_ud_pingpong's lid:qpn:psn:gid");
  AhAttr ah;
  ah.dgid = peer.gid;
  ah.sgid_index = static_cast<std::uint8_t>(x.gid.index);
  ah.hop_limit = 1;
  auto h = must(x.pd->create_ah(ah), "create the address handle");
  if (is_server) {
    write_all(fd, pingpong_record(me));
    read_exact(fd, 5);  // "done"
  } else {
    write_all(fd, std::string_view("done", 5));
  }
  r.records = {kPingpongLen};
  const std::uint8_t* msg = rx + kGrh;
  auto first_ok = [&] {  // the tool's own first message: 0x7b, page starts 0 with -c
    for (std::uint32_t i = 0; i < n; ++i)
      if (msg[i] != 0x7b && !(i % 4096 == 0 && msg[i] == 0)) return false;
    return true;
  };
  WorkCompletion wc[8];
  std::uint64_t sends_out = 0;
  auto send = [&](std::uint64_t i) {
    Sge s{base + n + kGrh, n, x.mr->lkey()};
    SendWr w;
    w.wr_id = i;
    w.opcode = WrOpcode::send;
    w.flags = SendFlags::signaled;
    w.sg_list = std::span<const Sge>(&s, 1);
    w.ud.ah = h.get();
    w.ud.remote_qpn = static_cast<std::uint32_t>(peer.qpn);
    w.ud.remote_qkey = kQkey;
    must(x.qp->post_send(std::span<const SendWr>(&w, 1)), "post send");
    ++sends_out;
  };
  auto wait_recv = [&](std::uint64_t i) {
    const auto deadline = SteadyClock::now() + std::chrono::seconds(30);
    for (;;) {
      const std::size_t k = poll_some(x, wc, 8);
      bool got = false;
      for (std::size_t j = 0; j < k; ++j) {
        if (wc[j].opcode != WcOpcode::recv) {
          --sends_out;
          continue;
        }
        got = true;
        const bool ok = wc[j].byte_len == n + kGrh && wc[j].src_qp == peer.qpn &&
                        ((is_server && i == 0) ? first_ok() : std::memcmp(msg, tx, n) == 0);
        if (!ok && r.verified)
          std::fprintf(stderr, "vrdma-perf: datagram %llu from the peer is not what we expect (%u bytes from QP %u)\n",
                       static_cast<unsigned long long>(i), wc[j].byte_len, wc[j].src_qp);
        r.verified = r.verified && ok;
        post_recv(i + 16);
      }
      if (got) return;
      if (SteadyClock::now() > deadline) die("no datagram " + std::to_string(i) + " from the peer in 30 s (UD: lost?)");
    }
  };
  const auto start = SteadyClock::now();
  for (std::uint64_t i = 0; i < x.c.iters; ++i) {
    const auto t0 = SteadyClock::now();
    if (is_server) {
      wait_recv(i);
      send(i);
    } else {
      send(i);
      wait_recv(i);
    }
    r.o.lat_us.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count() / 2);
  }
  r.o.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  const auto deadline = SteadyClock::now() + std::chrono::seconds(10);
  while (sends_out > 0 && SteadyClock::now() < deadline) sends_out -= poll_checked(x, wc, 8);
  r.o.ops = x.c.iters;
  return r;
}

}  // namespace vrdma::perf
