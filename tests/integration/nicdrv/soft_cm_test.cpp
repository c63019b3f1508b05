// Connection setup between two soft engines on loopback through our IB CM on QP1 (cm.hpp):
// the attributes each QP ends up with, data in both directions, DREQ from either side, and
// the CM's behaviour under the deterministic fault link: lost REQ, MRA+REP, RTU and DREQ
// resent, every packet duplicated, no answer at all (timeout), REJ with its reason (no
// listener, the application, path MTU), and malformed MADs on QP1 dropped and counted.
#define BOOST_TEST_MODULE soft_cm
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cstring>
#include <future>
#include <thread>

#include "check.hpp"
#include "rdma_pair.hpp"
#include "vrdma/nicdrv/proto/mad.hpp"
#include "vrdma/nicdrv/proto/wire.hpp"
#include "vrdma/common/fd.hpp"
#include "vrdma/nicdrv/cm.hpp"
#include "vrdma/nicdrv/soft.hpp"

using namespace vrdma;
using namespace vrdma::nicdrv;
using namespace std::chrono_literals;
namespace mad = vrdma::nicdrv::soft::mad;
namespace wire = vrdma::nicdrv::soft::wire;

namespace {

constexpr const char* kIpA = "127.0.91.1";  // server (passive)
constexpr const char* kIpB = "127.0.91.2";  // client (active)
std::uint16_t udp_port() { return static_cast<std::uint16_t>(30000 + getpid() % 20000); }
constexpr std::uint16_t kCmPort = 7174;

std::shared_ptr<Device> open_soft(const char* ip, const std::string& extra = "") {
  auto d = open_device("soft:" + std::string(ip) + "?port=" + std::to_string(udp_port()) + extra);
  VRDMA_REQUIRE_OK(d);
  return *d;
}

test::Endpoint endpoint(std::shared_ptr<Device> dev) {
  test::PairOptions o;
  o.buf_bytes = 1 << 16;
  auto e = test::make_endpoint(std::move(dev), o);
  VRDMA_REQUIRE_OK(e);
  return std::move(*e);
}

CmParams fast(std::uint8_t retries = 15) {
  CmParams p;
  p.cm_response_timeout = 14;  // 67 ms between resends
  p.max_cm_retries = retries;
  p.local_ack_timeout = 14;
  p.timeout = 10s;
  return p;
}

void post_recv(test::Endpoint& e, std::uint64_t id, std::uint32_t off = 0, std::uint32_t len = 4096) {
  Sge s{e.mr->addr() + off, len, e.mr->lkey()};
  RecvWr w{id, std::span<const Sge>(&s, 1)};
  VRDMA_REQUIRE_OK(e.qp->post_recv(std::span<const RecvWr>(&w, 1)));
}

void post(test::Endpoint& e, WrOpcode op, std::uint32_t off, std::uint32_t len, const test::Endpoint* peer = nullptr,
          std::uint32_t peer_off = 0) {
  Sge s{e.mr->addr() + off, len, e.mr->lkey()};
  SendWr w;
  w.wr_id = off;
  w.opcode = op;
  w.flags = SendFlags::signaled;
  w.sg_list = std::span<const Sge>(&s, 1);
  if (peer != nullptr) {
    w.rdma.remote_addr = peer->mr->addr() + peer_off;
    w.rdma.rkey = peer->mr->rkey();
  }
  VRDMA_REQUIRE_OK(e.qp->post_send(std::span<const SendWr>(&w, 1)));
}

void expect_ok(CompletionQueue& cq, std::size_t n) {
  auto wcs = test::wait_cq(cq, n);
  BOOST_REQUIRE_EQUAL(wcs.size(), n);
  for (const auto& wc : wcs) BOOST_TEST(wc.status == WcStatus::success);
}

// A server thread that accepts one request on `dev` (or rejects it) with `params`.
struct Server {
  std::unique_ptr<CmListener> listener;
  std::unique_ptr<CmConnection> conn;
  std::future<Status> done;

  Server(std::shared_ptr<Device> dev, test::Endpoint& ep, CmParams params, bool reject = false) {
    auto l = cm_listen(dev, kCmPort);
    VRDMA_REQUIRE_OK(l);
    listener = std::move(*l);
    done = std::async(std::launch::async, [this, &ep, params, reject]() -> Status {
      auto req = listener->get_request(10s);
      if (!req) return req.error();
      conn = std::move(*req);
      if (reject) return conn->reject();
      return conn->accept(*ep.qp, params);
    });
  }
};

// Both sides connected through the CM, with whatever faults the caller set beforehand.
struct Connected {
  std::shared_ptr<Device> da, db;
  test::Endpoint a, b;
  std::unique_ptr<Server> srv;
  std::unique_ptr<CmConnection> cli;

  explicit Connected(const soft::FaultConfig* fa = nullptr, const soft::FaultConfig* fb = nullptr,
                     CmParams pa = fast(), CmParams pb = fast()) {
    da = open_soft(kIpA);
    db = open_soft(kIpB);
    if (fa != nullptr) VRDMA_REQUIRE_OK(soft::set_faults(*da, *fa));
    if (fb != nullptr) VRDMA_REQUIRE_OK(soft::set_faults(*db, *fb));
    a = endpoint(da);
    b = endpoint(db);
    srv = std::make_unique<Server>(da, a, pa);
    auto c = cm_resolve(db, kIpA, kCmPort, pb);
    VRDMA_REQUIRE_OK(c);
    cli = std::move(*c);
    VRDMA_REQUIRE_OK(cli->connect(*b.qp, pb));
    VRDMA_REQUIRE_OK(srv->done.get());
    BOOST_REQUIRE(b.qp->state() == QpState::rts);
    BOOST_REQUIRE(a.qp->state() == QpState::rts);
  }

  // A SEND each way, a WRITE and a READ from the client: the QPs really are connected.
  void exchange() {
    test::fill_pattern(a.buf.data(), 4096, 1);
    test::fill_pattern(b.buf.data(), 4096, 2);
    post_recv(a, 1, 8192);
    post_recv(b, 2, 8192);
    post(b, WrOpcode::send, 0, 3000);
    post(a, WrOpcode::send, 0, 2000);
    expect_ok(*a.cq, 2);
    expect_ok(*b.cq, 2);
    BOOST_TEST(test::check_pattern(a.buf.data() + 8192, 3000, 2));
    BOOST_TEST(test::check_pattern(b.buf.data() + 8192, 2000, 1));
    post(b, WrOpcode::rdma_write, 0, 4096, &a, 16384);
    expect_ok(*b.cq, 1);
    BOOST_TEST(test::check_pattern(a.buf.data() + 16384, 4096, 2));
    post(b, WrOpcode::rdma_read, 20480, 4096, &a, 0);
    expect_ok(*b.cq, 1);
    BOOST_TEST(test::check_pattern(b.buf.data() + 20480, 4096, 1));
  }
};

soft::EngineStats stats(const std::shared_ptr<Device>& d) {
  auto s = soft::stats(*d);
  BOOST_REQUIRE(s.ok());
  return *s;
}

// The peer's DREQ moved this QP to ERR: its posted receive completes flushed.
void expect_flushed(test::Endpoint& e) {
  post_recv(e, 77);  // posting in ERR is allowed and flushes
  auto wcs = test::wait_cq(*e.cq, 1, 5s);
  BOOST_REQUIRE_EQUAL(wcs.size(), 1u);
  BOOST_TEST(wcs[0].status == WcStatus::wr_flush_err);
  BOOST_TEST(e.qp->state() == QpState::err);
}

}  // namespace

BOOST_AUTO_TEST_CASE(connect_carries_qpns_psns_and_limits_then_moves_data_and_disconnects) {
  CmParams srv = fast(), cli = fast();
  srv.responder_resources = 4;
  srv.initiator_depth = 2;
  srv.rnr_retry_count = 5;  // what the client's QP will use (REP)
  cli.responder_resources = 8;
  cli.initiator_depth = 3;
  cli.retry_count = 6;
  cli.rnr_retry_count = 4;  // what the server's QP will use (REQ)
  Connected c(nullptr, nullptr, srv, cli);
  auto qa = c.a.qp->query();
  auto qb = c.b.qp->query();
  VRDMA_REQUIRE_OK(qa);
  VRDMA_REQUIRE_OK(qb);
  BOOST_TEST(qa->dest_qp_num == c.b.qp->qp_num());
  BOOST_TEST(qb->dest_qp_num == c.a.qp->qp_num());
  BOOST_TEST(qa->sq_psn == qb->rq_psn);  // each side's first PSN is what the other expects
  BOOST_TEST(qb->sq_psn == qa->rq_psn);
  BOOST_TEST(qa->ah_attr.dgid.ipv4() == ::inet_addr(kIpB));
  BOOST_TEST(qb->ah_attr.dgid.ipv4() == ::inet_addr(kIpA));
  BOOST_TEST((qa->path_mtu == Mtu::mtu4096));  // loopback: the port's active MTU, chosen by the client
  BOOST_TEST((qb->path_mtu == Mtu::mtu4096));
  BOOST_TEST(qa->max_dest_rd_atomic == 4);  // server's responder resources
  BOOST_TEST(qb->max_rd_atomic == 3);       // client's initiator depth <= server's 4
  BOOST_TEST(qa->max_rd_atomic == 2);       // server's initiator depth <= client's 8
  BOOST_TEST(qb->max_dest_rd_atomic == 8);
  BOOST_TEST(qb->retry_cnt == 6);
  BOOST_TEST(qa->retry_cnt == 6);  // from the REQ
  BOOST_TEST(qb->rnr_retry == 5);  // from the REP
  BOOST_TEST(qa->rnr_retry == 4);  // from the REQ
  BOOST_TEST(qa->timeout == 14);
  BOOST_TEST(qb->timeout == 14);
  c.exchange();
  VRDMA_REQUIRE_OK(c.cli->disconnect());
  expect_flushed(c.a);
  BOOST_TEST(c.b.qp->state() == QpState::err);
  const auto sa = stats(c.da), sb = stats(c.db);
  BOOST_TEST(sb.cm_mads_sent == 3u);  // REQ, RTU, DREQ
  BOOST_TEST(sa.cm_mads_sent == 3u);  // MRA, REP, DREP
  BOOST_TEST(sa.cm_resends + sb.cm_resends == 0u);
  BOOST_TEST(sa.cm_mads_dropped + sb.cm_mads_dropped == 0u);
}

BOOST_AUTO_TEST_CASE(server_disconnects_and_the_client_qp_flushes) {
  Connected c;
  c.exchange();
  VRDMA_REQUIRE_OK(c.srv->conn->disconnect());
  expect_flushed(c.b);
}

BOOST_AUTO_TEST_CASE(a_lost_req_is_resent) {
  soft::FaultConfig f;
  f.drop_seq = {0};  // the client's first packet: the REQ
  Connected c(nullptr, &f);
  BOOST_TEST(stats(c.db).cm_resends >= 1u);
  BOOST_TEST(stats(c.db).faults_dropped == 1u);
  c.exchange();
}

BOOST_AUTO_TEST_CASE(lost_mra_and_rep_are_answered_again) {
  soft::FaultConfig f;
  f.drop_seq = {0, 1};  // the server's MRA and REP
  Connected c(&f, nullptr);
  BOOST_TEST(stats(c.da).cm_resends + stats(c.db).cm_resends >= 1u);
  c.exchange();
}

BOOST_AUTO_TEST_CASE(a_lost_rtu_is_made_up_for) {
  soft::FaultConfig f;
  f.drop_seq = {1};  // the client's second packet: the RTU
  Connected c(nullptr, &f);  // the server's accept returns only once it knows: REP resent, RTU again
  BOOST_TEST(stats(c.da).cm_resends >= 1u);
  c.exchange();
}

BOOST_AUTO_TEST_CASE(a_lost_dreq_is_resent) {
  soft::FaultConfig f;
  f.drop_seq = {2};  // REQ, RTU, then the DREQ (no data on the QP yet)
  Connected c(nullptr, &f);
  VRDMA_REQUIRE_OK(c.cli->disconnect());
  BOOST_TEST(stats(c.db).cm_resends >= 1u);
  expect_flushed(c.a);
}

BOOST_AUTO_TEST_CASE(every_packet_duplicated) {
  soft::FaultConfig f;
  f.duplicate_ppm = 1000000;
  Connected c(&f, &f);
  c.exchange();
  VRDMA_REQUIRE_OK(c.cli->disconnect());
  expect_flushed(c.a);
}

BOOST_AUTO_TEST_CASE(no_answer_ends_in_a_timeout) {
  auto da = open_soft(kIpA), db = open_soft(kIpB);
  soft::FaultConfig f;
  f.drop_ppm = 1000000;  // the server hears everything and says nothing
  VRDMA_REQUIRE_OK(soft::set_faults(*da, f));
  auto a = endpoint(da), b = endpoint(db);
  Server srv(da, a, fast());
  auto c = cm_resolve(db, kIpA, kCmPort, fast(2));
  VRDMA_REQUIRE_OK(c);
  const auto t0 = std::chrono::steady_clock::now();
  auto st = (*c)->connect(*b.qp, fast(2));
  BOOST_REQUIRE(!st);
  BOOST_TEST(st.error().is(Errc::timeout));
  BOOST_TEST_MESSAGE(st.error().message);
  BOOST_TEST(st.error().message.find("did not answer") != std::string::npos);
  BOOST_TEST(stats(db).cm_resends == 2u);
  BOOST_TEST((std::chrono::steady_clock::now() - t0 < 5s));
  (void)srv.done.get();  // it accepted; its REP resends run out in turn
}

BOOST_AUTO_TEST_CASE(rejections_carry_their_reason) {
  auto da = open_soft(kIpA), db = open_soft(kIpB);
  auto a = endpoint(da), b = endpoint(db);
  {  // nobody listens on the port
    auto c = cm_resolve(db, kIpA, 9, fast());
    VRDMA_REQUIRE_OK(c);
    auto st = (*c)->connect(*b.qp, fast());
    BOOST_REQUIRE(!st);
    BOOST_TEST(st.error().is(Errc::connection_lost));
    BOOST_TEST(st.error().message.find("invalid service ID") != std::string::npos, st.error().message);
  }
  b = endpoint(db);  // the failed attempt left that QP in INIT
  {  // the application says no
    Server srv(da, a, fast(), true);
    auto c = cm_resolve(db, kIpA, kCmPort, fast());
    VRDMA_REQUIRE_OK(c);
    auto st = (*c)->connect(*b.qp, fast());
    BOOST_REQUIRE(!st);
    BOOST_TEST(st.error().message.find("rejected by the application") != std::string::npos, st.error().message);
    VRDMA_REQUIRE_OK(srv.done.get());
  }
}

BOOST_AUTO_TEST_CASE(a_path_mtu_above_ours_is_rejected) {
  auto da = open_soft(kIpA, "&mtu=1024"), db = open_soft(kIpB);
  auto a = endpoint(da), b = endpoint(db);
  Server srv(da, a, fast());
  auto c = cm_resolve(db, kIpA, kCmPort, fast());
  VRDMA_REQUIRE_OK(c);
  auto st = (*c)->connect(*b.qp, fast());
  BOOST_REQUIRE(!st);
  BOOST_TEST(st.error().message.find("invalid path MTU") != std::string::npos, st.error().message);
  auto s = srv.done.get();
  BOOST_REQUIRE(!s);
  BOOST_TEST(s.error().message.find("active MTU 1024") != std::string::npos, s.error().message);
}

BOOST_AUTO_TEST_CASE(api_misuse_is_refused_with_a_sentence) {
  auto da = open_soft(kIpA), db = open_soft(kIpB);
  auto a = endpoint(da), b = endpoint(db);
  BOOST_TEST(!cm_resolve(db, "not-an-ip", kCmPort).ok());
  BOOST_TEST(!cm_resolve(db, kIpB, kCmPort).ok());  // ourselves
  BOOST_TEST(!cm_resolve(db, kIpA, 0).ok());
  auto l1 = cm_listen(da, kCmPort);
  VRDMA_REQUIRE_OK(l1);
  auto l2 = cm_listen(da, kCmPort);
  BOOST_REQUIRE(!l2);
  BOOST_TEST(l2.error().is(Errc::busy));
  auto none = (*l1)->get_request(50ms);
  BOOST_REQUIRE(!none);
  BOOST_TEST(none.error().is(Errc::timeout));
  auto c = cm_resolve(db, kIpA, kCmPort, fast());
  VRDMA_REQUIRE_OK(c);
  auto st = (*c)->connect(*a.qp, fast());  // a QP of the other device
  BOOST_REQUIRE(!st);
  BOOST_TEST(st.error().is(Errc::invalid_argument));
  BOOST_TEST((*c)->accept(*b.qp, fast()).error().is(Errc::bad_state));
  BOOST_TEST(!cm_listen(nullptr, 1).ok());
}

// Malformed or foreign packets to QP1 are dropped and counted; the CM keeps working.
BOOST_AUTO_TEST_CASE(bad_mads_on_qp1_are_dropped) {
  auto da = open_soft(kIpA);
  UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  BOOST_REQUIRE(s);
  int pmtu = IP_PMTUDISC_DO;  // DF, IP ID 0: the ICRC we compute matches what is sent
  ::setsockopt(s.get(), IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
  sockaddr_in me{};
  me.sin_family = AF_INET;
  me.sin_addr.s_addr = ::inet_addr("127.0.91.3");
  BOOST_REQUIRE_EQUAL(::bind(s.get(), reinterpret_cast<sockaddr*>(&me), sizeof me), 0);
  socklen_t len = sizeof me;
  ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&me), &len);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(udp_port());
  to.sin_addr.s_addr = ::inet_addr(kIpA);
  auto send_ud = [&](std::uint32_t qkey, std::span<const std::uint8_t> payload) {
    wire::Headers h;
    h.bth.opcode = wire::Opcode::ud_send_only;
    h.bth.dest_qp = 1;
    h.deth.qkey = qkey;
    h.deth.src_qp = 1;
    std::vector<std::uint8_t> pkt(64 + payload.size());
    const std::size_t hl = wire::encode_headers(h, payload.size(), pkt);
    BOOST_REQUIRE(hl > 0);
    std::copy(payload.begin(), payload.end(), pkt.begin() + static_cast<std::ptrdiff_t>(hl));
    wire::Ipv4Context ip;
    ip.src_be = me.sin_addr.s_addr;
    ip.dst_be = to.sin_addr.s_addr;
    ip.udp_src_port = ntohs(me.sin_port);
    ip.udp_dst_port = udp_port();
    pkt.resize(wire::finish_packet(ip, pkt, hl + payload.size()));
    BOOST_REQUIRE(::sendto(s.get(), pkt.data(), pkt.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to) > 0);
  };
  mad::Header hdr;
  mad::MadBytes good = mad::encode(hdr, mad::Rtu{});  // a well-formed RTU for no connection
  std::vector<std::uint8_t> short_mad(good.begin(), good.begin() + 100);
  mad::MadBytes not_cm = good;
  not_cm[1] = 0x04;
  mad::MadBytes lap = good;
  lap[17] = 0x19;
  send_ud(0x12345678, good);  // wrong Q_Key
  send_ud(mad::kGsiQkey, short_mad);
  send_ud(mad::kGsiQkey, not_cm);
  send_ud(mad::kGsiQkey, lap);
  send_ud(mad::kGsiQkey, good);  // unknown connection: ignored
  for (int i = 0; i < 200 && stats(da).cm_mads_received < 5; ++i) std::this_thread::sleep_for(10ms);
  const auto st = stats(da);
  BOOST_TEST(st.cm_mads_received == 5u);
  BOOST_TEST(st.cm_mads_dropped == 5u);
  BOOST_TEST(st.cm_mads_sent == 0u);
  BOOST_TEST(st.rx_dropped_icrc == 0u);
  // A CM still works afterwards.
  auto db = open_soft(kIpB);
  auto a = endpoint(da), b = endpoint(db);
  Server srv(da, a, fast());
  auto c = cm_resolve(db, kIpA, kCmPort, fast());
  VRDMA_REQUIRE_OK(c);
  VRDMA_REQUIRE_OK((*c)->connect(*b.qp, fast()));
  VRDMA_REQUIRE_OK(srv.done.get());
}
