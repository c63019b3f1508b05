// Moving a guest's virtio RDMA device between backends on a NIC (vrdmad --engine verbs:rxe0,
// Linux rxe standing in for the hosts' NIC): the QPs are drained, stopped and re-created, and the
// guest keeps its QPNs and keys by translation (migration/src/rebuild.cpp, docs/migration.md
// "On a NIC"). Run inside the reference-peer guest by verbs_guest_test.sh:
//   VRDMA_NIC_MOVE="s0,s1,s2"  vrdmad sockets: s0 runs the device first, s1 and s2 wait with
//                              --incoming guest (the device moves s0 -> s1 -> s2)
//   VRDMA_NIC_PEER_MOVE="t0,t1" the same for the test with a peer outside the guest
//   VRDMA_NIC_PEER="verbs:rxe0" that peer: a QP straight on the NIC, as a plain host's would be
//   VRDMA_NIC_STREAM_MOVE="v0,v1,v2" and VRDMA_NIC_STREAM_TO="tcp:A,tcp:B": moves with the state
//                              streamed between backends, v1 listening on A (--incoming tcp:A),
//                              v2 on B; each control socket is its vhost-user socket's path with
//                              .ctl for .sock
//   VRDMA_NIC_SRQ_MOVE="r0,r1,r2" the same for the SRQ test
//   VRDMA_NIC_GID=1            the RoCEv2 IPv4 GID index
#define BOOST_TEST_MODULE nic_migration
#include <boost/test/unit_test.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "check.hpp"
#include "control_client.hpp"
#include "vrdma/common/fd.hpp"
#include "rdma_pair.hpp"
#include "vrdma/guest/pv.hpp"
#include "vrdma/migration/peer_notice.hpp"

using namespace vrdma;
using namespace vrdma::nicdrv;
using namespace std::chrono_literals;
namespace nt = vrdma::migration::notice;

namespace {

// The comma-separated list in `name`, or empty (and a SKIP line) when it has fewer than `n`.
std::vector<std::string> env_list(const char* name, std::size_t n) {
  std::vector<std::string> out;
  const char* v = std::getenv(name);
  if (v != nullptr) {
    std::stringstream ss(v);
    for (std::string s; std::getline(ss, s, ',');) out.push_back(s);
  }
  if (out.size() < n) {
    BOOST_TEST_MESSAGE("SKIP: " << name << " names fewer than " << n << " vrdmad sockets");
    out.clear();
  }
  return out;
}

test::PairOptions options() {
  test::PairOptions o;
  const char* g = std::getenv("VRDMA_NIC_GID");
  o.gid_index = static_cast<std::uint8_t>(g != nullptr ? std::atoi(g) : 1);
  o.buf_bytes = 1 << 20;
  o.sq_depth = o.rq_depth = 64;
  o.cq_depth = 256;
  o.timeout = 17;  // 0.5 s: rxe under TCG is slow
  return o;
}

std::shared_ptr<Device> open_pv(const std::string& sock) {
  auto d = open_device("pv:" + sock + "?ram_mib=48");
  VRDMA_REQUIRE_OK(d);
  return *d;
}

constexpr std::size_t kSlot = 16 * 1024;   // one receive buffer / one SEND
constexpr std::size_t kSlots = 8;          // receives kept posted at the receiving side
constexpr std::size_t kWrite = 64 * 1024;  // one WRITE
// Where each endpoint's buffer holds what: receive slots, WRITE targets (two), SEND and WRITE
// sources (two each), so that one endpoint can send and receive at once.
constexpr std::size_t kWriteAt = 256 * 1024, kSendSrcAt = 512 * 1024, kWriteSrcAt = 640 * 1024;

void post_recv_slot(test::Endpoint& b, std::uint64_t seq) {
  Sge s{reinterpret_cast<std::uint64_t>(b.buf.data() + (seq % kSlots) * kSlot), kSlot, b.mr->lkey()};
  RecvWr r{seq, {&s, 1}};
  VRDMA_REQUIRE_OK(b.qp->post_recv(std::span<const RecvWr>(&r, 1)));
}

// An endpoint's CQ, which holds the completions of its sends and of its receives (an endpoint
// that sends and receives both): each kind taken on its own.
struct CqSplit {
  CompletionQueue& cq;
  std::deque<WorkCompletion> sends, recvs;
  explicit CqSplit(CompletionQueue& c) : cq(c) {}
  std::vector<WorkCompletion> take(bool recv, std::size_t n, std::chrono::milliseconds timeout) {
    auto& q = recv ? recvs : sends;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (q.size() < n && std::chrono::steady_clock::now() < deadline)
      for (const auto& c : test::wait_cq(cq, 1, 100ms))
        (static_cast<std::uint8_t>(c.opcode) >= 128 ? recvs : sends).push_back(c);
    std::vector<WorkCompletion> out;
    while (!q.empty() && out.size() < n) {
      out.push_back(q.front());
      q.pop_front();
    }
    return out;
  }
};

// The two halves of one direction of checked traffic, each usable on its own (the soft-engine
// peer test runs them in two processes). Sends: endpoint `a` posts a WRITE into the receiving
// side's region (`addr`, `rkey`) and a SEND with fresh data each round; finish_sends() checks
// both completed once, under the QPN the guest was given. Receives: endpoint `b` keeps kSlots
// receives posted; finish_receives() checks the round's receive and the data of both.
// `seed` keeps the two directions' data apart.
struct Sends {
  test::Endpoint& a;
  CqSplit& cq_a;
  std::uint64_t addr = 0;
  std::uint32_t rkey = 0;
  std::uint64_t seed = 0;
  std::uint32_t qpn_a = 0;
  std::set<std::uint64_t> done;

  Sends(test::Endpoint& from, CqSplit& from_cq, std::uint64_t to_addr, std::uint32_t to_rkey, std::uint64_t s)
      : a(from), cq_a(from_cq), addr(to_addr), rkey(to_rkey), seed(s), qpn_a(from.qp->qp_num()) {}
  void post(std::uint64_t r) {
    std::uint8_t* src = a.buf.data() + kSendSrcAt + (r % 2) * kSlot;
    test::fill_pattern(src, kSlot, seed + 1000 + r);
    std::uint8_t* wsrc = a.buf.data() + kWriteSrcAt + (r % 2) * kWrite;
    test::fill_pattern(wsrc, kWrite, seed + 5000 + r);
    Sge ss{reinterpret_cast<std::uint64_t>(src), kSlot, a.mr->lkey()};
    Sge ws{reinterpret_cast<std::uint64_t>(wsrc), kWrite, a.mr->lkey()};
    SendWr w[2];
    w[0].wr_id = 2 * r;
    w[0].opcode = WrOpcode::rdma_write;
    w[0].flags = SendFlags::signaled;
    w[0].sg_list = {&ws, 1};
    w[0].rdma.remote_addr = addr + kWriteAt + (r % 2) * kWrite;
    w[0].rdma.rkey = rkey;
    w[1].wr_id = 2 * r + 1;
    w[1].opcode = WrOpcode::send;
    w[1].flags = SendFlags::signaled;
    w[1].sg_list = {&ss, 1};
    VRDMA_REQUIRE_OK(a.qp->post_send(std::span<const SendWr>(w, 2)));
  }
  void finish(std::uint64_t r) {
    auto sc = cq_a.take(false, 2, 30s);
    BOOST_REQUIRE_MESSAGE(sc.size() == 2u, "round " << r << ": " << sc.size() << " of 2 send completions");
    for (const auto& c : sc) {
      BOOST_TEST(c.status == WcStatus::success, "round " << r << " wr " << c.wr_id << ": " << to_string(c.status));
      BOOST_TEST(c.qp_num == qpn_a);
      BOOST_TEST(done.insert(c.wr_id).second, "send " << c.wr_id << " completed twice");
    }
  }
};

struct Receives {
  test::Endpoint& b;
  CqSplit& cq_b;
  std::uint64_t seed = 0;
  std::uint32_t qpn_b = 0;
  std::uint64_t next_recv = 0;
  std::set<std::uint64_t> done;

  Receives(test::Endpoint& to, CqSplit& to_cq, std::uint64_t s) : b(to), cq_b(to_cq), seed(s), qpn_b(to.qp->qp_num()) {}
  void post_receives() {
    for (; next_recv < kSlots; ++next_recv) post_recv_slot(b, next_recv);
  }
  void finish(std::uint64_t r) {
    auto rc = cq_b.take(true, 1, 30s);
    BOOST_REQUIRE_MESSAGE(rc.size() == 1u, "round " << r << ": no receive completion");
    const auto& c = rc[0];
    BOOST_TEST(c.status == WcStatus::success, "round " << r << " receive " << c.wr_id << ": " << to_string(c.status));
    BOOST_TEST(c.qp_num == qpn_b);
    BOOST_TEST(c.wr_id == r, "round " << r << ": the receive that completed is " << c.wr_id);
    BOOST_TEST(c.byte_len == kSlot);
    BOOST_TEST(done.insert(c.wr_id).second, "receive " << c.wr_id << " completed twice");
    BOOST_TEST(test::check_pattern(b.buf.data() + (c.wr_id % kSlots) * kSlot, kSlot, seed + 1000 + r),
               "round " << r << ": the SEND's data is wrong");
    BOOST_TEST(test::check_pattern(b.buf.data() + kWriteAt + (r % 2) * kWrite, kWrite, seed + 5000 + r),
               "round " << r << ": the WRITE's data is wrong");
    post_recv_slot(b, next_recv++);
  }
};

// One direction of checked traffic from endpoint `a` to endpoint `b` (both in this process).
struct OneWay {
  Sends sends;
  Receives receives;

  OneWay(test::Endpoint& from, CqSplit& from_cq, test::Endpoint& to, CqSplit& to_cq, std::uint64_t s)
      : sends(from, from_cq, to.mr->addr(), to.mr->rkey(), s), receives(to, to_cq, s) {}
  void post_receives() { receives.post_receives(); }
  void post(std::uint64_t r) { sends.post(r); }
  void finish(std::uint64_t r) {
    sends.finish(r);
    receives.finish(r);
  }
  void check_all(std::uint64_t rounds) {
    BOOST_TEST(sends.done.size() == 2 * rounds);
    BOOST_TEST(receives.done.size() == rounds);
    BOOST_TEST(sends.a.qp->qp_num() == sends.qpn_a);
    BOOST_TEST(receives.b.qp->qp_num() == receives.qpn_b);
  }
};

// A and B, two QPs of one guest device connected to each other, A sending to B.
struct InGuestPair {
  std::shared_ptr<Device> dev;
  test::Endpoint a, b;
  std::unique_ptr<CqSplit> cq_a, cq_b;
  std::unique_ptr<OneWay> ab;

  explicit InGuestPair(const std::string& sock) : dev(open_pv(sock)) {
    const auto o = options();
    auto ea = test::make_endpoint(dev, o);
    auto eb = test::make_endpoint(dev, o);
    VRDMA_REQUIRE_OK(ea);
    VRDMA_REQUIRE_OK(eb);
    a = std::move(*ea);
    b = std::move(*eb);
    VRDMA_REQUIRE_OK(test::connect(a, b, o));
    cq_a = std::make_unique<CqSplit>(*a.cq);
    cq_b = std::make_unique<CqSplit>(*b.cq);
    ab = std::make_unique<OneWay>(a, *cq_a, b, *cq_b, 0);
    ab->post_receives();
  }
  void post(std::uint64_t r) { ab->post(r); }
  void finish(std::uint64_t r) { ab->finish(r); }
  void check_all(std::uint64_t rounds) { ab->check_all(rounds); }
};

// The control socket of the vrdmad serving `sock` (verbs_guest_test.sh names them alike).
std::string ctl_of(const std::string& sock) {
  return sock.ends_with(".sock") ? sock.substr(0, sock.size() - 5) + ".ctl" : sock + ".ctl";
}

// The vrdmad's status once its migration phase is `phase` (10 s at most; the last status else).
nlohmann::json wait_phase(const std::string& sock, const std::string& phase) {
  auto st = test::wait_for_phase(ctl_of(sock), phase, 10s);
  if (test::phase_of(st) != phase)
    BOOST_ERROR("vrdmad " << sock << " did not reach migration phase " << phase << " within 10 s: " << st.dump());
  return st;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The RoCE v2 GID index of `ip` (IPv4 or IPv6) on `dev`, or 0 and a test error.
std::uint8_t gid_index_of(Device& dev, const std::string& ip) {
  const auto a = nt::parse_address(ip);
  BOOST_REQUIRE_MESSAGE(a.has_value(), ip << " is not an IPv4 or IPv6 address");
  auto t = dev.gid_table();
  VRDMA_REQUIRE_OK(t);
  for (const auto& e : *t)
    if (e.gid.raw == *a && e.type == GidType::roce_v2) return static_cast<std::uint8_t>(e.index);
  BOOST_ERROR("the device has no GID for " << ip);
  return 0;
}

// A QP on `mover` (the moving guest's device, GID of the guest's address) connected to a QP on
// `peer` (another guest's, whose backend takes peer notices, on its own address `peer_ip`):
// traffic both ways.
struct CrossPair {
  std::shared_ptr<Device> mdev, pdev;
  test::Endpoint m, p;
  std::unique_ptr<CqSplit> cq_m, cq_p;
  std::unique_ptr<OneWay> mp, pm;

  // `mover_ip`: the mover's GID by address (empty: options()' index, the guest's IPv4 address).
  CrossPair(std::shared_ptr<Device> mover, std::shared_ptr<Device> peer, const std::string& peer_ip,
            const std::string& mover_ip = "")
      : mdev(std::move(mover)), pdev(std::move(peer)) {
    auto om = options();
    auto op = options();
    op.gid_index = gid_index_of(*pdev, peer_ip);
    if (!mover_ip.empty()) om.gid_index = gid_index_of(*mdev, mover_ip);
    auto em = test::make_endpoint(mdev, om);
    auto ep = test::make_endpoint(pdev, op);
    VRDMA_REQUIRE_OK(em);
    VRDMA_REQUIRE_OK(ep);
    m = std::move(*em);
    p = std::move(*ep);
    VRDMA_REQUIRE_OK(test::connect_to(m, test::PeerInfo{p.qp->qp_num(), p.gid, om.psn_b}, om.psn_a, om));
    VRDMA_REQUIRE_OK(test::connect_to(p, test::PeerInfo{m.qp->qp_num(), m.gid, om.psn_a}, om.psn_b, op));
    cq_m = std::make_unique<CqSplit>(*m.cq);
    cq_p = std::make_unique<CqSplit>(*p.cq);
    mp = std::make_unique<OneWay>(m, *cq_m, p, *cq_p, 0);
    pm = std::make_unique<OneWay>(p, *cq_p, m, *cq_m, 1u << 20);
    mp->post_receives();
    pm->post_receives();
  }
  void post(std::uint64_t r) {
    mp->post(r);
    pm->post(r);
  }
  void finish(std::uint64_t r) {
    mp->finish(r);
    pm->finish(r);
  }
  // Moves the moving guest's device from backend `from` to `to` (this round's work in flight) and
  // checks the counters: the source paused the peer once, the destination re-pointed it once,
  // and the peer's backend `peer_sock` has now been paused and re-pointed `peer_count` times,
  // refusing nothing.
  void move(const std::string& from, const std::string& to, const std::string& peer_sock, int peer_count,
            const char* what) {
    const auto t0 = std::chrono::steady_clock::now();
    VRDMA_REQUIRE_OK(pv::migrate(*mdev, to, 20s, pv::StateVia::guest_memory));
    BOOST_TEST_MESSAGE("moved to " << to << what << " in " << ms_since(t0) << " ms");
    const auto src = test::control_request(ctl_of(from), {{"cmd", "status"}});
    const auto dst = test::control_request(ctl_of(to), {{"cmd", "status"}});
    const auto peer = test::control_request(ctl_of(peer_sock), {{"cmd", "status"}});
    BOOST_TEST(src["notices"].value("peers_paused", 0) == 1, src.dump());
    BOOST_TEST(dst["notices"].value("peers_repointed", 0) == 1, dst.dump());
    BOOST_TEST(peer["notices"].value("qps_paused", 0) == peer_count, peer.dump());
    BOOST_TEST(peer["notices"].value("qps_repointed", 0) == peer_count, peer.dump());
    BOOST_TEST(peer["notices"].value("refused", 0) == 0, peer.dump());
  }
  // Every work request completed once both ways, and each guest still sees the other's QPN as it
  // was given (`mover_qpn`, `peer_qpn`), while the wire may have new ones.
  void check_all(std::uint64_t rounds, std::uint32_t mover_qpn, std::uint32_t peer_qpn) {
    mp->check_all(rounds);
    pm->check_all(rounds);
    auto qm = m.qp->query();
    auto qp = p.qp->query();
    VRDMA_REQUIRE_OK(qm);
    VRDMA_REQUIRE_OK(qp);
    BOOST_TEST(qm->dest_qp_num == peer_qpn);
    BOOST_TEST(qp->dest_qp_num == mover_qpn);
  }
};

std::uint32_t ip_be(const std::string& ip) {
  in_addr a{};
  ::inet_pton(AF_INET, ip.c_str(), &a);
  return a.s_addr;
}

}  // namespace

// Both ends move together: SENDs and WRITEs with checked data go on while the device moves
// twice with work in flight; every work request completes exactly once, every completion names
// the QPN the guest was given, and receives the NIC held at the stop are posted again and
// filled at the destination.
BOOST_AUTO_TEST_CASE(qps_connected_inside_the_guest_keep_their_data_across_moves) {
  const auto socks = env_list("VRDMA_NIC_MOVE", 3);
  if (socks.empty()) return;
  InGuestPair p(socks[0]);
  constexpr std::uint64_t kRounds = 24;
  std::size_t moves = 0;
  for (std::uint64_t r = 0; r < kRounds; ++r) {
    p.post(r);
    if (r == 8 || r == 16) {  // with this round's work in flight
      const auto t0 = std::chrono::steady_clock::now();
      VRDMA_REQUIRE_OK(pv::migrate(*p.dev, socks[1 + moves], 20s, pv::StateVia::guest_memory));
      ++moves;
      const double ms = ms_since(t0);
      BOOST_TEST_MESSAGE("moved to " << socks[moves] << " in " << ms << " ms");
    }
    p.finish(r);
  }
  BOOST_TEST(moves == 2u);
  p.check_all(kRounds);
  // A region registered after the moves works beside the translated ones (B READs it from A).
  auto extra = p.dev->alloc_buffer(kSlot);
  VRDMA_REQUIRE_OK(extra);
  auto mr2 = p.a.pd->reg_mr((*extra)->data(), kSlot, Access::local_write | Access::remote_read);
  VRDMA_REQUIRE_OK(mr2);
  test::fill_pattern((*extra)->data(), kSlot, 77);
  Sge dst{reinterpret_cast<std::uint64_t>(p.b.buf.data()), kSlot, p.b.mr->lkey()};
  SendWr rd;
  rd.wr_id = 999;
  rd.opcode = WrOpcode::rdma_read;
  rd.flags = SendFlags::signaled;
  rd.sg_list = {&dst, 1};
  rd.rdma.remote_addr = (*mr2)->addr();
  rd.rdma.rkey = (*mr2)->rkey();
  VRDMA_REQUIRE_OK(p.b.qp->post_send(std::span<const SendWr>(&rd, 1)));
  auto c = test::wait_cq(*p.b.cq, 1, 30s);
  BOOST_REQUIRE(c.size() == 1u);
  BOOST_TEST(c[0].status == WcStatus::success, to_string(c[0].status));
  BOOST_TEST(test::check_pattern(p.b.buf.data(), kSlot, 77));
}

// An SRQ on the NIC moves with its receives (first: the device's GID 0 is rxe0's IPv4 one). The
// device holds a copy of each receive it posted
// to the NIC's SRQ until its completion: a NIC cannot give them back, and the guest may reuse a
// slot of the SRQ's ring once the device took it). Two QPs share one SRQ of 16 receives, each
// with a sender QP of the same device; SEND i goes to QP i % 2 and must fill receive i (the NIC
// takes an SRQ's receives in order) with its wr_id, length and bytes. 8 receives are posted and
// 3 filled before the first move, which has SEND 3 in flight; 4 more receives are posted between
// the moves; every receive is filled once, in order, after the second.
BOOST_AUTO_TEST_CASE(an_srq_on_the_nic_moves_with_its_receives) {
  const auto socks = env_list("VRDMA_NIC_SRQ_MOVE", 3);
  if (socks.empty()) return;
  auto dev = open_pv(socks[0]);
  const auto o = options();
  // The device's GID 0 is its address, rxe0's RoCEv2 IPv4 GID, though rxe lists its link-local
  // IPv6 GID first (a guest kernel driver takes GID 0 as the address to bind a netdev to).
  auto g0 = dev->query_gid(0);
  auto gi = dev->query_gid(o.gid_index);
  VRDMA_REQUIRE_OK(g0);
  VRDMA_REQUIRE_OK(gi);
  BOOST_TEST(g0->gid.is_ipv4_mapped(), "the device's GID 0 is " << g0->gid.str());
  BOOST_TEST((g0->type == GidType::roce_v2));
  BOOST_TEST((g0->gid == gi->gid), g0->gid.str() << " vs GID " << int{o.gid_index} << " " << gi->gid.str());
  auto ea = test::make_endpoint(dev, o);
  auto eb = test::make_endpoint(dev, o);
  VRDMA_REQUIRE_OK(ea);
  VRDMA_REQUIRE_OK(eb);
  test::Endpoint& a = *ea;
  test::Endpoint& b = *eb;
  auto srq = a.pd->create_srq(16, 1);
  VRDMA_REQUIRE_OK(srq);
  std::array<test::Endpoint, 2> on_srq{a, a}, senders{b, b};
  for (int k = 0; k < 2; ++k) {
    QpInitAttr ia;
    ia.send_cq = a.cq.get();
    ia.recv_cq = a.cq.get();
    ia.srq = srq->get();
    ia.cap.max_send_wr = 4;
    auto q = a.pd->create_qp(ia);
    VRDMA_REQUIRE_OK(q);
    QpInitAttr sa;
    sa.send_cq = b.cq.get();
    sa.recv_cq = b.cq.get();
    sa.cap.max_send_wr = 16;
    sa.cap.max_recv_wr = 4;
    auto p = b.pd->create_qp(sa);
    VRDMA_REQUIRE_OK(p);
    on_srq[k].qp = *q;
    senders[k].qp = *p;
    VRDMA_REQUIRE_OK(test::connect(on_srq[k], senders[k], o));
  }
  const std::array<std::uint32_t, 2> qpns{on_srq[0].qp->qp_num(), on_srq[1].qp->qp_num()};
  constexpr std::uint32_t kLen = 3000;
  constexpr std::size_t kBuf = 4096;  // receive i's buffer: A's from i * 4 KiB
  auto post = [&](int i) {
    Sge r{reinterpret_cast<std::uint64_t>(a.buf.data() + kBuf * static_cast<std::size_t>(i)), kBuf, a.mr->lkey()};
    RecvWr rw{200 + static_cast<std::uint64_t>(i), std::span<const Sge>(&r, 1)};
    VRDMA_REQUIRE_OK((*srq)->post_recv(std::span<const RecvWr>(&rw, 1)));
  };
  auto send = [&](int i) {
    std::uint8_t* src = b.buf.data() + kBuf * static_cast<std::size_t>(i);
    test::fill_pattern(src, kLen, 300 + static_cast<std::uint64_t>(i));
    Sge sg{reinterpret_cast<std::uint64_t>(src), kLen, b.mr->lkey()};
    SendWr w;
    w.wr_id = static_cast<std::uint64_t>(i);
    w.opcode = WrOpcode::send;
    w.flags = SendFlags::signaled;
    w.sg_list = {&sg, 1};
    VRDMA_REQUIRE_OK(senders[i % 2].qp->post_send(std::span<const SendWr>(&w, 1)));
  };
  std::set<std::uint64_t> received;
  auto check = [&](int i) {
    const auto sent = test::wait_cq(*b.cq, 1, 30s);
    BOOST_REQUIRE_MESSAGE(sent.size() == 1u, "SEND " << i << " did not complete");
    BOOST_TEST(sent[0].status == WcStatus::success, "SEND " << i << ": " << to_string(sent[0].status));
    BOOST_TEST(sent[0].wr_id == static_cast<std::uint64_t>(i));
    const auto got = test::wait_cq(*a.cq, 1, 30s);
    BOOST_REQUIRE_MESSAGE(got.size() == 1u, "no receive completion for SEND " << i);
    const auto& c = got[0];
    BOOST_TEST(c.status == WcStatus::success, "receive for SEND " << i << ": " << to_string(c.status));
    BOOST_TEST(c.wr_id == 200 + static_cast<std::uint64_t>(i), "SEND " << i << " filled the receive " << c.wr_id);
    BOOST_TEST(c.byte_len == kLen);
    BOOST_TEST(c.qp_num == qpns[i % 2], "SEND " << i << " arrived on QPN " << c.qp_num);
    BOOST_TEST(received.insert(c.wr_id).second, "receive " << c.wr_id << " completed twice");
    BOOST_TEST(test::check_pattern(a.buf.data() + kBuf * static_cast<std::size_t>(i), kLen, 300 + static_cast<std::uint64_t>(i)),
               "receive " << i << " does not hold SEND " << i << "'s bytes");
  };
  for (int i = 0; i < 8; ++i) post(i);
  for (int i = 0; i < 3; ++i) {
    send(i);
    check(i);
  }
  send(3);  // in flight at the stop
  auto t0 = std::chrono::steady_clock::now();
  VRDMA_REQUIRE_OK(pv::migrate(*dev, socks[1], 20s, pv::StateVia::guest_memory));
  BOOST_TEST_MESSAGE("SRQ moved to " << socks[1] << " in " << ms_since(t0) << " ms");
  const auto st = wait_phase(socks[1], "running");
  BOOST_TEST(st["objects"].value("srq", 0) == 1, st.dump());
  check(3);
  for (int i = 4; i < 6; ++i) {
    send(i);
    check(i);
  }
  for (int i = 8; i < 12; ++i) post(i);
  t0 = std::chrono::steady_clock::now();
  VRDMA_REQUIRE_OK(pv::migrate(*dev, socks[2], 20s, pv::StateVia::guest_memory));
  BOOST_TEST_MESSAGE("SRQ moved to " << socks[2] << " in " << ms_since(t0) << " ms");
  for (int i = 6; i < 12; ++i) {
    send(i);
    check(i);
  }
  BOOST_TEST(received.size() == 12u);
  for (int k = 0; k < 2; ++k) BOOST_TEST(on_srq[k].qp->qp_num() == qpns[k]);
}

// The same records streamed from backend to backend ({"cmd":"migrate","to":...}, the way
// containers on libpvverbs move; docs/migration.md "The switchover protocol"): first over RDMA
// on the NIC (both vrdmads have --migration-engine verbs:rxe0, the source RDMA-WRITEs the state
// into the buffer the destination exposed), then over TCP to a destination without a migration
// engine. The destinations build the objects ahead from the layout the source sends (PRESTATE).
// The in-guest pair carries checked data throughout, work in flight at each stop.
BOOST_AUTO_TEST_CASE(the_state_streams_between_backends_over_rdma_on_the_nic_and_over_tcp) {
  const auto socks = env_list("VRDMA_NIC_STREAM_MOVE", 3);
  const auto to = env_list("VRDMA_NIC_STREAM_TO", 2);
  if (socks.empty() || to.empty()) return;
  InGuestPair p(socks[0]);
  const char* via[] = {"rdma", "tcp"};
  constexpr std::uint64_t kRounds = 18;
  std::size_t moves = 0;
  for (std::uint64_t r = 0; r < kRounds; ++r) {
    p.post(r);
    if (r == 6 || r == 12) {
      const std::string& from = socks[moves];
      const auto t0 = std::chrono::steady_clock::now();
      const auto reply = test::control_request(ctl_of(from), {{"cmd", "migrate"}, {"to", to[moves]}});
      BOOST_REQUIRE_MESSAGE(reply.is_object() && reply.value("ok", false), "migrate to " << to[moves] << ": " << reply.dump());
      VRDMA_REQUIRE_OK(pv::migrate(*p.dev, socks[moves + 1], 20s, pv::StateVia::backends));
      ++moves;
      const double ms = ms_since(t0);
      const auto src = wait_phase(from, "migrated");
      const auto dst = wait_phase(socks[moves], "running");
      BOOST_TEST(src["migration"].value("state_via", "") == via[moves - 1], src.dump());
      BOOST_TEST(dst["migration"].value("state_via", "") == via[moves - 1], dst.dump());
      BOOST_TEST(dst["objects"].value("qp", 0) == 2);
      // The destination built the 2 PDs, 2 CQs and 2 QPs from the layout the source sent
      // ahead (PRESTATE) and re-created the QPs in those: only the modify to RTS at the stop.
      BOOST_TEST(dst.value("adopted", 0) == 6, dst.dump());
      BOOST_TEST_MESSAGE("streamed to " << socks[moves] << " over " << via[moves - 1] << " in " << ms << " ms, "
                                        << src["migration"].value("state_bytes", 0) << " bytes of state");
    }
    p.finish(r);
  }
  BOOST_TEST(moves == 2u);
  p.check_all(kRounds);
}

// The destination refuses the state after the source stopped its QPs (here: a vrdmad on our
// soft engine, which cannot take a NIC's re-creation records). The rings start at the source
// again, which re-creates the QPs on its NIC the same way; the in-guest connection, with work
// in flight at the stop, carries on with nothing lost.
BOOST_AUTO_TEST_CASE(a_move_refused_after_the_stop_leaves_the_qps_working_here) {
  const auto socks = env_list("VRDMA_NIC_REFUSED_MOVE", 2);
  if (socks.empty()) return;
  InGuestPair p(socks[0]);
  constexpr std::uint64_t kRounds = 10;
  for (std::uint64_t r = 0; r < kRounds; ++r) {
    p.post(r);
    if (r == 4) {
      auto s = pv::migrate(*p.dev, socks[1], 3s, pv::StateVia::guest_memory);
      BOOST_REQUIRE_MESSAGE(!s.ok(), "the move to a backend that refuses the state succeeded");
      BOOST_TEST_MESSAGE("refused as it should be: " << s.error().message);
    }
    p.finish(r);
  }
  p.check_all(kRounds);
}

// A peer that is another vrdma guest, whose backend takes peer notices (vrdmad --notices): at the
// stop the moving guest's backend asks it to pause and drain its side, and once the QP exists
// again at the destination (new QPN, regions under new keys) tells it where the QP went; the peer
// re-creates its QP toward it and translates the moved guest's rkeys. Checked data both ways,
// work in flight at each stop, two moves and a third refused after the stop (the source then
// re-points the peer to the QP it re-creates), then the peer guest moves too: every work
// request completes once, under the QPNs the guests were given, and each guest still sees the
// other's QPN as it was.
BOOST_AUTO_TEST_CASE(a_vrdma_peer_is_told_where_the_qp_went_and_carries_on) {
  const auto socks = env_list("VRDMA_NIC_NOTICE_MOVE", 3);
  const char* peer_sock = std::getenv("VRDMA_NIC_NOTICE_PEER");
  const char* peer_ip = std::getenv("VRDMA_NIC_PEER_IP");
  if (socks.empty() || peer_sock == nullptr || peer_ip == nullptr) {
    BOOST_TEST_MESSAGE("SKIP: VRDMA_NIC_NOTICE_MOVE / VRDMA_NIC_NOTICE_PEER / VRDMA_NIC_PEER_IP not set");
    return;
  }
  const char* refuser = std::getenv("VRDMA_NIC_NOTICE_REFUSED");
  const char* peer_to = std::getenv("VRDMA_NIC_NOTICE_PEER_MOVE");
  CrossPair x(open_pv(socks[0]), open_pv(peer_sock), peer_ip);
  const auto mover_qpn = x.m.qp->qp_num(), peer_qpn = x.p.qp->qp_num();
  constexpr std::uint64_t kRounds = 30;
  std::size_t moves = 0;
  for (std::uint64_t r = 0; r < kRounds; ++r) {
    x.post(r);
    if (r == 18 && refuser != nullptr) {
      // A move refused after the stop: the source re-creates the QP on its own NIC and
      // re-points the paused peer to it with the same token.
      auto s = pv::migrate(*x.mdev, refuser, 3s, pv::StateVia::guest_memory);
      BOOST_REQUIRE_MESSAGE(!s.ok(), "the move to a backend that refuses the state succeeded");
      const auto src = test::control_request(ctl_of(socks[2]), {{"cmd", "status"}});
      const auto peer = test::control_request(ctl_of(peer_sock), {{"cmd", "status"}});
      BOOST_TEST(src["notices"].value("peers_paused", 0) == 1, src.dump());
      BOOST_TEST(src["notices"].value("peers_repointed", 0) == 2, src.dump());  // as destination, then here
      BOOST_TEST(peer["notices"].value("qps_repointed", 0) == 3, peer.dump());
    }
    if (r == 24 && peer_to != nullptr) {
      // Now the peer guest moves (its backend takes notices too): the moved guest's backend is
      // paused and re-pointed in turn, and the peer's translations of the moved guest's rkeys
      // travel with it (its WRITEs keep landing). On this one host the guest's backends share
      // its address, and the notice port goes to the one the guest runs on within a few tens
      // of milliseconds: the peer moves once that one listens.
      nlohmann::json st;
      for (int i = 0; i < 250; ++i) {
        st = test::control_request(ctl_of(socks[2]), {{"cmd", "status"}});
        if (st["notices"].value("listening", false)) break;
        std::this_thread::sleep_for(20ms);
      }
      BOOST_REQUIRE_MESSAGE(st["notices"].value("listening", false), "the guest's backend does not take notices: " << st.dump());
      const auto t0 = std::chrono::steady_clock::now();
      VRDMA_REQUIRE_OK(pv::migrate(*x.pdev, peer_to, 20s, pv::StateVia::guest_memory));
      BOOST_TEST_MESSAGE("the peer moved to " << peer_to << " in " << ms_since(t0) << " ms");
      const auto psrc = test::control_request(ctl_of(peer_sock), {{"cmd", "status"}});
      const auto pdst = test::control_request(ctl_of(peer_to), {{"cmd", "status"}});
      const auto mover = test::control_request(ctl_of(socks[2]), {{"cmd", "status"}});
      BOOST_TEST(psrc["notices"].value("peers_paused", 0) == 1, psrc.dump());
      BOOST_TEST(pdst["notices"].value("peers_repointed", 0) == 1, pdst.dump());
      BOOST_TEST(mover["notices"].value("qps_paused", 0) == 1, mover.dump());
      BOOST_TEST(mover["notices"].value("qps_repointed", 0) == 1, mover.dump());
    }
    if (r == 6 || r == 12) {  // with this round's work in flight both ways
      ++moves;
      x.move(socks[moves - 1], socks[moves], peer_sock, static_cast<int>(moves), "");
    }
    x.finish(r);
  }
  BOOST_TEST(moves == 2u);
  x.check_all(kRounds, mover_qpn, peer_qpn);
}

// Notices not in order are refused with a sentence and change nothing: bytes that are no
// notice, a QPN the peer does not have, a pause naming another QP or coming from another address
// than the QP's peer, a re-point with a token never given. A pause in order holds the peer's
// sends until a release, or until its hold time (vrdmad --notice-hold-ms) passes without one;
// the sends posted meanwhile then complete, once, with their data. The other end here is a QP
// straight on the NIC (VRDMA_NIC_PEER) on the guest's address; this test speaks for it.
BOOST_AUTO_TEST_CASE(notices_out_of_order_are_refused_and_a_pause_ends_by_release_or_in_time) {
  const char* peer_sock = std::getenv("VRDMA_NIC_NOTICE_PEER2");
  const char* peer_ip = std::getenv("VRDMA_NIC_PEER2_IP");
  const char* other_name = std::getenv("VRDMA_NIC_PEER");
  const char* hold = std::getenv("VRDMA_NIC_NOTICE_HOLD_MS");
  if (peer_sock == nullptr || peer_ip == nullptr || other_name == nullptr || hold == nullptr) {
    BOOST_TEST_MESSAGE("SKIP: VRDMA_NIC_NOTICE_PEER2 / VRDMA_NIC_PEER2_IP / VRDMA_NIC_PEER / VRDMA_NIC_NOTICE_HOLD_MS not set");
    return;
  }
  auto odev = open_device(other_name);
  VRDMA_REQUIRE_OK(odev);
  CrossPair x(*odev, open_pv(peer_sock), peer_ip);
  test::Endpoint* eo = &x.m;
  test::Endpoint* ep = &x.p;
  OneWay& po = *x.pm;  // the peer guest's sends
  OneWay& op_ = *x.mp;
  CqSplit& cq_p = *x.cq_p;
  const auto pip = nt::ipv4_address(ip_be(peer_ip)), oip = nt::ipv4_address(eo->gid.ipv4());
  const auto before = test::control_request(ctl_of(peer_sock), {{"cmd", "status"}})["notices"];
  auto ask = [&](const nt::Message& m, const nt::Address& from) {
    auto a = nt::exchange(from, pip, nt::kDefaultPort, m, 10s);
    VRDMA_REQUIRE_OK(a);
    BOOST_TEST_MESSAGE(nt::to_string(m.kind) << " -> " << nt::to_string(a->kind) << " " << a->reason);
    return *a;
  };
  auto refused_with = [&](const nt::Message& m, const nt::Address& from, const std::string& words) {
    const auto a = ask(m, from);
    BOOST_TEST((a.kind == nt::Kind::refused), nt::to_string(m.kind) << " was answered " << nt::to_string(a.kind));
    BOOST_TEST(a.reason.find(words) != std::string::npos, "'" << a.reason << "' does not say '" << words << "'");
  };
  nt::Message pause;
  pause.kind = nt::Kind::pause;
  pause.peer_qpn = ep->qp->qp_num();  // the peer guest's QP: not moved, its QPN is the NIC's
  pause.mover_qpn = eo->qp->qp_num();
  pause.mover_gid = eo->gid.raw;
  // Bytes that are no notice.
  {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(nt::kDefaultPort);
    a.sin_addr.s_addr = ip_be(peer_ip);
    BOOST_REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    const char junk[] = "GET / HTTP/1.0\r\n\r\n";
    BOOST_REQUIRE(::send(fd.get(), junk, sizeof junk - 1, MSG_NOSIGNAL) > 0);
    auto ans = nt::read_message(fd.get(), 5000ms);
    VRDMA_REQUIRE_OK(ans);
    BOOST_TEST((ans->kind == nt::Kind::refused));
    BOOST_TEST(ans->reason.find("not a vrdma peer notice") != std::string::npos, ans->reason);
  }
  auto m = pause;
  m.peer_qpn = 0xfffff0;
  refused_with(m, oip, "no QP here has QPN");
  m = pause;
  m.mover_qpn = (pause.mover_qpn + 1) & 0xffffff;
  refused_with(m, oip, "is connected to QPN");
  refused_with(pause, pip, "comes from the address its peer has");
  m = pause;
  m.kind = nt::Kind::repoint;
  m.token = 12345;
  refused_with(m, oip, "token");
  m.kind = nt::Kind::paused;
  refused_with(m, oip, "an answer, not a request");
  // Nothing changed: a round both ways.
  std::uint64_t r = 0;
  for (; r < 2; ++r) {
    po.post(r);
    op_.post(r);
    po.finish(r);
    op_.finish(r);
  }
  // A pause in order holds the peer guest's sends; a release lets them go.
  auto paused = ask(pause, oip);
  BOOST_REQUIRE((paused.kind == nt::Kind::paused));
  BOOST_TEST(paused.token != 0u);
  po.post(r);
  BOOST_TEST(cq_p.take(false, 1, 500ms).empty(), "the paused QP sent");
  nt::Message release = pause;
  release.kind = nt::Kind::release;
  release.token = paused.token;
  BOOST_TEST((ask(release, oip).kind == nt::Kind::released));
  po.finish(r++);
  // Held again, and nobody re-points: the hold ends by itself.
  paused = ask(pause, oip);
  BOOST_REQUIRE((paused.kind == nt::Kind::paused));
  const auto t0 = std::chrono::steady_clock::now();
  po.post(r);
  BOOST_TEST(cq_p.take(false, 1, 500ms).empty(), "the paused QP sent");
  po.finish(r++);
  const double held_ms = ms_since(t0);
  BOOST_TEST_MESSAGE("the pause ended by itself after " << held_ms << " ms");
  BOOST_TEST(held_ms >= 0.8 * std::atof(hold));
  po.check_all(r);
  const auto after = test::control_request(ctl_of(peer_sock), {{"cmd", "status"}})["notices"];
  BOOST_TEST(after.value("refused", 0) - before.value("refused", 0) == 5, after.dump());
  BOOST_TEST(after.value("qps_paused", 0) - before.value("qps_paused", 0) == 2, after.dump());
  BOOST_TEST(after.value("qps_repointed", 0) == before.value("qps_repointed", 0), after.dump());
}

// Notices over IPv6: the two guests' QPs use GIDs of global IPv6 addresses (VRDMA_NIC_V6_IP for
// the moving guest, VRDMA_NIC_V6_PEER_IP for the peer, both on eth0), and their backends take
// notices there (vrdmad --notices fd92::2): the pause and the re-point travel over IPv6. The
// moving guest's device moves twice (VRDMA_NIC_V6_MOVE) with checked WRITE+SEND both ways in
// flight; every work request once, QPNs as given, the backends' counters.
BOOST_AUTO_TEST_CASE(a_vrdma_peer_on_an_ipv6_gid_is_told_where_the_qp_went) {
  const auto socks = env_list("VRDMA_NIC_V6_MOVE", 3);
  const char* peer_sock = std::getenv("VRDMA_NIC_V6_PEER");
  const char* mover_ip = std::getenv("VRDMA_NIC_V6_IP");
  const char* peer_ip = std::getenv("VRDMA_NIC_V6_PEER_IP");
  if (socks.empty() || peer_sock == nullptr || mover_ip == nullptr || peer_ip == nullptr) {
    BOOST_TEST_MESSAGE("SKIP: VRDMA_NIC_V6_MOVE / VRDMA_NIC_V6_PEER / VRDMA_NIC_V6_IP / VRDMA_NIC_V6_PEER_IP not set");
    return;
  }
  CrossPair x(open_pv(socks[0]), open_pv(peer_sock), peer_ip, mover_ip);
  BOOST_TEST(!nt::is_ipv4(x.m.gid.raw));
  BOOST_TEST(nt::to_string(x.p.gid.raw) == peer_ip);
  const auto mover_qpn = x.m.qp->qp_num(), peer_qpn = x.p.qp->qp_num();
  const auto listening = test::control_request(ctl_of(peer_sock), {{"cmd", "status"}})["notices"];
  BOOST_TEST(listening.value("listening", false), listening.dump());
  BOOST_TEST(listening["addresses"].dump().find(peer_ip) != std::string::npos, listening.dump());
  constexpr std::uint64_t kRounds = 16;
  std::size_t moves = 0;
  for (std::uint64_t r = 0; r < kRounds; ++r) {
    x.post(r);
    if (r == 5 || r == 10) {  // with this round's work in flight both ways
      ++moves;
      x.move(socks[moves - 1], socks[moves], peer_sock, static_cast<int>(moves), " with a peer on IPv6");
    }
    x.finish(r);
  }
  BOOST_TEST(moves == 2u);
  x.check_all(kRounds, mover_qpn, peer_qpn);
}

// A peer outside the guest (a QP straight on the NIC, as a plain host's or an rxe peer's) keeps
// sending to the QPN the guest had: the NIC the guest moved to does not know it, so the peer's
// retries run out, and the guest's QP, whose ACKs go the same way, sees its own run out too.
// Said plainly in docs/migration.md; this test keeps it true.
BOOST_AUTO_TEST_CASE(a_peer_outside_the_guest_sees_its_retries_run_out_after_a_move) {
  const auto socks = env_list("VRDMA_NIC_PEER_MOVE", 2);
  const char* peer_name = std::getenv("VRDMA_NIC_PEER");
  if (socks.empty() || peer_name == nullptr) {
    BOOST_TEST_MESSAGE("SKIP: VRDMA_NIC_PEER_MOVE / VRDMA_NIC_PEER not set");
    return;
  }
  auto o = options();
  o.timeout = 14;  // 67 ms
  o.retry_cnt = 2;
  auto dev = open_pv(socks[0]);
  auto pdev = open_device(peer_name);
  VRDMA_REQUIRE_OK(pdev);
  auto g = test::make_endpoint(dev, o);
  auto p = test::make_endpoint(*pdev, o);
  VRDMA_REQUIRE_OK(g);
  VRDMA_REQUIRE_OK(p);
  VRDMA_REQUIRE_OK(test::connect(*g, *p, o));
  const std::uint32_t qpn_g = g->qp->qp_num();
  auto send = [&](test::Endpoint& from, test::Endpoint& to, std::uint64_t id) {
    post_recv_slot(to, id);
    Sge s{reinterpret_cast<std::uint64_t>(from.buf.data()), 64, from.mr->lkey()};
    SendWr w;
    w.wr_id = id;
    w.opcode = WrOpcode::send;
    w.flags = SendFlags::signaled;
    w.sg_list = {&s, 1};
    VRDMA_REQUIRE_OK(from.qp->post_send(std::span<const SendWr>(&w, 1)));
    // The send's completion; a receive flushed on the same CQ may come with it.
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < deadline) {
      for (const auto& c : test::wait_cq(*from.cq, 1, 1s)) {
        if (static_cast<std::uint8_t>(c.opcode) >= 128) continue;
        BOOST_TEST(c.wr_id == id);
        BOOST_TEST_MESSAGE("SEND " << id << ": " << to_string(c.status));
        return c;
      }
    }
    BOOST_FAIL("SEND " << id << ": no completion within 30 s");
    return WorkCompletion{};
  };
  // Before the move both ways work.
  BOOST_TEST(send(*g, *p, 1).status == WcStatus::success);
  BOOST_TEST(test::wait_cq(*p->cq, 1, 10s).size() == 1u);
  BOOST_TEST(send(*p, *g, 2).status == WcStatus::success);
  BOOST_TEST(test::wait_cq(*g->cq, 1, 10s).size() == 1u);
  VRDMA_REQUIRE_OK(pv::migrate(*dev, socks[1], 20s, pv::StateVia::guest_memory));
  // The peer's SEND goes to the old QPN: nobody answers.
  const auto pc = send(*p, *g, 3);
  BOOST_TEST(pc.status == WcStatus::retry_exc_err, "the peer's SEND after the move: " << to_string(pc.status));
  // The guest's SEND reaches the peer's QP, now in ERR after its own failure: no ACK comes.
  const auto sc = send(*g, *p, 4);
  BOOST_TEST(sc.status == WcStatus::retry_exc_err, "the guest's SEND after the move: " << to_string(sc.status));
  BOOST_TEST(sc.qp_num == qpn_g);
}

// ---- a peer on our soft engine, on the host ---------------------------------------------------
// Two processes: the host's half (soft_engine_peer_host_half, run by verbs_guest_test.sh in the
// rig's namespace) has a QP on vrdmad --engine soft:HOST --notices HOST; the guest's half has the
// moving QP on rxe0. They agree on each step over TCP, one line at a time.

namespace {

struct Link {
  UniqueFd fd;
  std::string buf;

  void send(const std::string& line) {
    const std::string s = line + "\n";
    BOOST_REQUIRE_MESSAGE(::send(fd.get(), s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size()),
                          "the other half of the test is gone (sending '" << line << "')");
  }
  std::string read(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (auto nl = buf.find('\n'); nl != std::string::npos) {
        std::string line = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd.get(), POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) != 1)
        BOOST_FAIL("the other half of the test said nothing within " << timeout.count() << " ms");
      char tmp[4096];
      const auto n = ::recv(fd.get(), tmp, sizeof tmp, 0);
      if (n <= 0) BOOST_FAIL("the other half of the test closed the connection (its output says why)");
      buf.append(tmp, static_cast<std::size_t>(n));
    }
  }
};

sockaddr_in sockaddr_of(const std::string& ip, const std::string& port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(port)));
  BOOST_REQUIRE_MESSAGE(::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) == 1, ip << " is not an IPv4 address");
  return a;
}

Link accept_one(const std::string& ip, const std::string& port, std::chrono::seconds timeout) {
  UniqueFd l(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int one = 1;
  ::setsockopt(l.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const auto a = sockaddr_of(ip, port);
  BOOST_REQUIRE_MESSAGE(::bind(l.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0 && ::listen(l.get(), 1) == 0,
                        "cannot listen on " << ip << ":" << port << ": " << std::strerror(errno));
  pollfd p{l.get(), POLLIN, 0};
  BOOST_REQUIRE_MESSAGE(::poll(&p, 1, static_cast<int>(timeout.count() * 1000)) == 1,
                        "the guest's half of the test did not connect within " << timeout.count() << " s");
  Link k;
  k.fd = UniqueFd(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
  BOOST_REQUIRE(k.fd.valid());
  return k;
}

Link dial(const std::string& ip, const std::string& port, std::chrono::seconds timeout) {
  const auto a = sockaddr_of(ip, port);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    Link k;
    k.fd = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (::connect(k.fd.get(), reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) return k;
    if (std::chrono::steady_clock::now() > deadline)
      BOOST_FAIL("the host's half of the test does not listen on " << ip << ":" << port);
    std::this_thread::sleep_for(200ms);
  }
}

// "ep QPN GID PSN ADDR RKEY": what the other half needs to connect to an endpoint and write
// into its buffer.
struct Remote {
  std::uint32_t qpn = 0, psn = 0, rkey = 0;
  Gid gid{};
  std::uint64_t addr = 0;
};

std::string describe(const test::Endpoint& e, std::uint32_t psn) {
  std::ostringstream o;
  o << "ep " << e.qp->qp_num() << ' ';
  for (auto b : e.gid.raw) o << fmt::format("{:02x}", b);
  o << ' ' << psn << ' ' << e.mr->addr() << ' ' << e.mr->rkey();
  return o.str();
}

Remote parse_remote(const std::string& line) {
  std::istringstream in(line);
  std::string tag, gid;
  Remote r;
  in >> tag >> r.qpn >> gid >> r.psn >> r.addr >> r.rkey;
  BOOST_REQUIRE_MESSAGE(tag == "ep" && !in.fail() && gid.size() == 32, "not an endpoint: '" << line << "'");
  for (std::size_t i = 0; i < 16; ++i) r.gid.raw[i] = static_cast<std::uint8_t>(std::stoul(gid.substr(2 * i, 2), nullptr, 16));
  return r;
}

}  // namespace

// The host's half: a QP on vrdmad --engine soft (VRDMA_NIC_SOFT_PEER_SERVE: its socket, then the
// one of the vrdmad it moves to), on the address VRDMA_NIC_SOFT_PEER_IP, serving the guest's half
// on VRDMA_NIC_SOFT_PEER_PORT. Each "round R" it sends its round (WRITE + SEND) and checks the
// guest's; "round R move" moves its own device with that round in flight (a soft engine keeps its
// QPNs: no notices; the translations its re-point left travel in the device state); "status"
// answers its backend's notice counters; "check R" checks every work request once and that its
// guest still sees the moved QP's QPN as given.
BOOST_AUTO_TEST_CASE(soft_engine_peer_host_half) {
  const auto socks = env_list("VRDMA_NIC_SOFT_PEER_SERVE", 2);
  const char* ip = std::getenv("VRDMA_NIC_SOFT_PEER_IP");
  const char* port = std::getenv("VRDMA_NIC_SOFT_PEER_PORT");
  if (socks.empty() || ip == nullptr || port == nullptr) {
    BOOST_TEST_MESSAGE("SKIP: VRDMA_NIC_SOFT_PEER_SERVE / VRDMA_NIC_SOFT_PEER_IP / VRDMA_NIC_SOFT_PEER_PORT not set");
    return;
  }
  auto dev = open_pv(socks[0]);
  auto o = options();
  o.gid_index = gid_index_of(*dev, ip);
  auto e = test::make_endpoint(dev, o);
  VRDMA_REQUIRE_OK(e);
  const std::uint32_t own_qpn = e->qp->qp_num();
  Link link = accept_one(ip, port, 200s);
  link.send(describe(*e, o.psn_b));
  const auto guest = parse_remote(link.read(30s));
  VRDMA_REQUIRE_OK(test::connect_to(*e, test::PeerInfo{guest.qpn, guest.gid, guest.psn}, o.psn_b, o));
  CqSplit cq(*e->cq);
  Sends out(*e, cq, guest.addr, guest.rkey, 1u << 20);
  Receives in(*e, cq, 0);
  in.post_receives();
  link.send("ready");
  std::string current = socks[0];
  for (;;) {
    const auto line = link.read(120s);
    std::istringstream cmd(line);
    std::string verb, extra;
    std::uint64_t r = 0;
    cmd >> verb;
    if (verb == "round") {
      cmd >> r >> extra;
      out.post(r);
      if (extra == "move") {
        const auto t0 = std::chrono::steady_clock::now();
        VRDMA_REQUIRE_OK(pv::migrate(*dev, socks[1], 20s, pv::StateVia::guest_memory));
        current = socks[1];
        BOOST_TEST_MESSAGE("the soft-engine peer moved to " << current << " in " << ms_since(t0) << " ms");
      }
      out.finish(r);
      in.finish(r);
      link.send(fmt::format("done {}", r));
    } else if (verb == "status") {
      link.send(test::control_request(ctl_of(current), {{"cmd", "status"}})["notices"].dump());
    } else if (verb == "check") {
      cmd >> r;
      BOOST_TEST(out.done.size() == 2 * r);
      BOOST_TEST(in.done.size() == r);
      auto q = e->qp->query();
      VRDMA_REQUIRE_OK(q);
      BOOST_TEST(q->dest_qp_num == guest.qpn, "the soft-engine peer's QP says its peer is QPN " << q->dest_qp_num);
      BOOST_TEST(e->qp->qp_num() == own_qpn);
      link.send("checked");
    } else {
      BOOST_TEST(verb == "bye", "unknown step '" << line << "'");
      break;
    }
  }
}

// A peer on our soft engine (a host without an RDMA NIC, its guest on vrdmad --engine soft
// --notices) is paused and re-pointed like one on a NIC: it keeps its QP and QPN (ERR -> RESET
// -> RTS toward the new QPN, its posted receives posted again) and translates the moved guest's
// rkeys. The guest moves y0 -> y1, the peer then moves to another soft vrdmad (its re-point's
// translations travel in its device state), the guest moves y1 -> y2: checked data both ways
// every round, work in flight at each move, every work request once.
BOOST_AUTO_TEST_CASE(a_peer_on_the_soft_engine_is_told_where_the_qp_went_and_carries_on) {
  const auto socks = env_list("VRDMA_NIC_SOFT_MOVE", 3);
  const char* host = std::getenv("VRDMA_NIC_SOFT_PEER");
  if (socks.empty() || host == nullptr) {
    BOOST_TEST_MESSAGE("SKIP: VRDMA_NIC_SOFT_MOVE / VRDMA_NIC_SOFT_PEER (the host half's IP:PORT) not set");
    return;
  }
  const std::string hp(host);
  const auto colon = hp.find(':');
  BOOST_REQUIRE(colon != std::string::npos);
  auto dev = open_pv(socks[0]);
  const auto o = options();
  auto e = test::make_endpoint(dev, o);
  VRDMA_REQUIRE_OK(e);
  const std::uint32_t own_qpn = e->qp->qp_num();
  Link link = dial(hp.substr(0, colon), hp.substr(colon + 1), 60s);
  const auto peer = parse_remote(link.read(30s));
  link.send(describe(*e, o.psn_a));
  VRDMA_REQUIRE_OK(test::connect_to(*e, test::PeerInfo{peer.qpn, peer.gid, peer.psn}, o.psn_a, o));
  CqSplit cq(*e->cq);
  Sends out(*e, cq, peer.addr, peer.rkey, 0);
  Receives in(*e, cq, 1u << 20);
  in.post_receives();
  BOOST_REQUIRE(link.read(30s) == "ready");
  auto peer_status = [&] {
    link.send("status");
    return nlohmann::json::parse(link.read(10s));
  };
  constexpr std::uint64_t kRounds = 24;
  std::size_t moves = 0;
  for (std::uint64_t r = 0; r < kRounds; ++r) {
    link.send(r == 12 ? fmt::format("round {} move", r) : fmt::format("round {}", r));
    out.post(r);
    if (r == 6 || r == 18) {  // with this round's work in flight both ways
      const auto t0 = std::chrono::steady_clock::now();
      VRDMA_REQUIRE_OK(pv::migrate(*dev, socks[1 + moves], 20s, pv::StateVia::guest_memory));
      ++moves;
      BOOST_TEST_MESSAGE("moved to " << socks[moves] << " with a soft-engine peer in " << ms_since(t0) << " ms");
    }
    out.finish(r);
    in.finish(r);
    BOOST_REQUIRE_EQUAL(link.read(60s), fmt::format("done {}", r));
    if (r == 6 || r == 18) {
      const auto src = test::control_request(ctl_of(socks[moves - 1]), {{"cmd", "status"}});
      const auto dst = test::control_request(ctl_of(socks[moves]), {{"cmd", "status"}});
      const auto p = peer_status();  // the peer's backend: the first one, then the one it moved to
      BOOST_TEST(src["notices"].value("peers_paused", 0) == 1, src.dump());
      BOOST_TEST(dst["notices"].value("peers_repointed", 0) == 1, dst.dump());
      BOOST_TEST(p.value("qps_paused", 0) == 1, p.dump());
      BOOST_TEST(p.value("qps_repointed", 0) == 1, p.dump());
      BOOST_TEST(p.value("refused", 0) == 0, p.dump());
    }
  }
  BOOST_TEST(moves == 2u);
  link.send(fmt::format("check {}", kRounds));
  BOOST_TEST(link.read(30s) == "checked");
  link.send("bye");
  BOOST_TEST(out.done.size() == 2 * kRounds);
  BOOST_TEST(in.done.size() == kRounds);
  BOOST_TEST(e->qp->qp_num() == own_qpn);
  auto q = e->qp->query();
  VRDMA_REQUIRE_OK(q);
  BOOST_TEST(q->dest_qp_num == peer.qpn);
}
