// Doorbell rings against vrdmad (docs/virtio-rdma.md "Doorbell rings"): a raw guest makes two
// rings as a driver does for two processes, creates a CQ and an RC QP (connected to itself) with
// the first, and rings them by writing records into guest memory and notifying the doorbell
// queue, with nothing on that queue. The data moves; every record another ring writes for
// those objects, every record of an unknown kind, a producer too far ahead, and the commands'
// refusals change nothing and are counted; a ring in use cannot be destroyed; with vrdmad
// polling the rings say NO_KICK and records are taken without a notification.
#define BOOST_TEST_MODULE vrdmad_db_ring
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "check.hpp"
#include "netns.hpp"
#include "process.hpp"
#include "raw_guest.hpp"
#include "vrdmad_proc.hpp"

using namespace vrdma;
using namespace vrdma::test;
using namespace std::chrono_literals;
namespace vd = vrdma::vrdma_dev;

namespace {

constexpr std::uint32_t kDepth = 8;

// A doorbell ring in the raw guest's memory, written as a process writes its own.
struct Ring {
  RawGuest& g;
  std::uint64_t gpa;
  std::uint32_t number = 0, prod = 0;
  vd::DbRingHeader& hdr() { return *reinterpret_cast<vd::DbRingHeader*>(g.host(gpa, sizeof(vd::DbRingHeader))); }
  // Appends a record and stores the producer; notifies the doorbell queue when `notify`.
  void write(std::uint32_t handle, std::uint16_t kind, std::uint32_t value, bool notify = true) {
    const vd::Doorbell d{handle, kind, 0, value, 0};
    std::memcpy(g.host(gpa + vd::kDbRingRecordsOffset + (prod % kDepth) * sizeof d, sizeof d), &d, sizeof d);
    ++prod;
    std::atomic_ref(hdr().producer).store(prod, std::memory_order_release);
    if (notify) g.notify(vd::kDoorbellQueue);
  }
  std::uint32_t consumed() { return std::atomic_ref(hdr().consumed).load(std::memory_order_acquire); }
  std::uint32_t flags() { return std::atomic_ref(hdr().flags).load(std::memory_order_acquire); }
};

Ring make_ring(RawGuest& g) {
  Ring r{g, g.alloc(virtio_rdma_db_ring_bytes(kDepth), 64)};
  auto [st, body] = g.cmd(vd::Cmd::create_db_ring, vd::CreateDbRingReq{r.gpa, kDepth, 0});
  BOOST_REQUIRE_EQUAL(st, kOk);
  r.number = RawGuest::as<vd::HandleResp>(body).handle;
  BOOST_REQUIRE(r.number >= 1 && r.number <= 0xffff);
  return r;
}

template <class Pred>
bool eventually(Pred p, std::chrono::milliseconds limit = 3000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (p()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return p();
}

// A raw guest on a vrdmad with a PD and its DMA region, a CQ and an RC QP connected to itself,
// both created with doorbell ring `a`; SENDs from `src` to receives at `dst`.
struct Setup {
  NetnsPair net;
  TempDir dir;
  std::unique_ptr<Vrdmad> dev;
  std::unique_ptr<RawGuest> g;
  std::uint32_t pd = 0, cq = 0;
  std::uint64_t cq_ring = 0, src = 0, dst = 0;
  vd::RegMrResp dma{};
  vd::CreateQpReq q{};
  vd::CreateQpResp qp{};
  std::uint32_t polled = 0, sent = 0, posted_recvs = 0;

  Setup(const char* prefix, int subnet, std::vector<std::string> args = {}) : net{prefix, subnet} {
    BOOST_REQUIRE(net.ok());
    dev = std::make_unique<Vrdmad>(dir, "ring", net.ns_a(), "soft:" + net.ip_a(), std::move(args));
    g = std::make_unique<RawGuest>(dev->sock);
    pd = g->create(vd::Cmd::create_pd, vd::HandleReq{});
    auto [dst_, dbody] = g->cmd(vd::Cmd::reg_dma_mr, vd::RegDmaMrReq{pd, 1});
    BOOST_REQUIRE_EQUAL(dst_, kOk);
    dma = RawGuest::as<vd::RegMrResp>(dbody);
    src = g->alloc(4096);
    dst = g->alloc(4096 * kDepth);
  }
  void make_objects(const Ring& a) {
    cq_ring = g->alloc(vd::kCqeOffset + 64 * sizeof(vd::Cqe));
    cq = g->create(vd::Cmd::create_cq, vd::CreateCqReq{64, a.number, cq_ring});
    q = qp_request(*g, pd, cq, VIRTIO_RDMA_QPT_RC, kDepth);
    q.db_ring = static_cast<std::uint16_t>(a.number);
    auto [qs, qbody] = g->cmd(vd::Cmd::create_qp, q);
    BOOST_REQUIRE_EQUAL(qs, kOk);
    qp = RawGuest::as<vd::CreateQpResp>(qbody);
    connect_to_itself(*g, qp);
  }
  // A receive WQE and a SEND WQE of `len` bytes (pattern `seed`) written into the rings; the
  // producers to ring are sent / posted_recvs.
  void write_recv() {
    struct {
      vd::RecvWqe w;
      vd::WireSge s;
    } r{};
    r.w.wr_id = 0x1000 + posted_recvs;
    r.w.num_sge = 1;
    r.s = vd::WireSge{dst + (posted_recvs % kDepth) * 4096, 4096, dma.lkey};
    std::memcpy(g->host(q.rq_gpa + (posted_recvs % kDepth) * vd::recv_stride(1), sizeof r), &r, sizeof r);
    ++posted_recvs;
  }
  void write_send(std::uint32_t len, std::uint8_t seed) {
    for (std::uint32_t i = 0; i < len; ++i) g->host(src, len)[i] = static_cast<std::uint8_t>(seed + i * 13);
    struct {
      vd::SendWqe w;
      vd::WireSge s;
    } w{};
    w.w.wr_id = 0x2000 + sent;
    w.w.opcode = 2;  // SEND
    w.w.flags = vd::kSendSignaled;
    w.w.num_sge = 1;
    w.s = vd::WireSge{src, len, dma.lkey};
    std::memcpy(g->host(q.sq_gpa + (sent % kDepth) * vd::send_stride(1, 0), sizeof w), &w, sizeof w);
    ++sent;
  }
  std::optional<vd::Cqe> next_cqe(std::chrono::milliseconds limit = 3000ms) {
    std::optional<vd::Cqe> out;
    (void)eventually([&] {
      vd::Cqe c;
      std::memcpy(&c, g->host(cq_ring + vd::kCqeOffset + (polled % 64) * sizeof c, sizeof c), sizeof c);
      if (c.owner != vd::cqe_phase(polled, 64)) return false;
      ++polled;
      out = c;
      return true;
    }, limit);
    return out;
  }
  std::uint32_t sq_consumed() { return reinterpret_cast<vd::QpStatus*>(g->host(q.status_gpa, 64))->sq_consumed; }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_ring_rings_only_its_own_objects_and_its_errors_cost_only_itself) {
  Setup s("vdr", 238);
  auto& g = *s.g;

  // CREATE_DB_RING's refusals: depths, a ring not wholly in one memory region, misaligned.
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::create_db_ring, vd::CreateDbRingReq{g.alloc(4096), 4, 0}).first, kInval);
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::create_db_ring, vd::CreateDbRingReq{g.alloc(4096), 12, 0}).first, kInval);
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::create_db_ring, vd::CreateDbRingReq{g.alloc(4096), 8192, 0}).first, kInval);
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::create_db_ring, vd::CreateDbRingReq{kHole, 8, 0}).first, kFault);
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::create_db_ring, vd::CreateDbRingReq{(640u << 10) - 128, 8, 0}).first, kFault);
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::create_db_ring, vd::CreateDbRingReq{g.alloc(4096) + 8, 8, 0}).first, kFault);
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::create_db_ring, vd::CreateDbRingReq{kBeyond, 8, 0}).first, kFault);

  Ring a = make_ring(g), b = make_ring(g);
  BOOST_CHECK_NE(a.number, b.number);
  // Objects may name only rings the device has.
  const auto other_cq_ring = g.alloc(vd::kCqeOffset + 64 * sizeof(vd::Cqe));
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::create_cq, vd::CreateCqReq{64, 999, other_cq_ring}).first, kNoent);
  s.make_objects(a);
  auto bad_qp = qp_request(g, s.pd, s.cq, VIRTIO_RDMA_QPT_RC, kDepth);
  bad_qp.db_ring = 999;
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::create_qp, bad_qp).first, kNoent);
  const auto before = s.dev->status();

  // One message through ring a, no record on the doorbell queue: receive first, then the SEND.
  s.write_recv();
  a.write(s.qp.qp, static_cast<std::uint16_t>(vd::DoorbellKind::rq), s.posted_recvs);
  s.write_send(3000, 7);
  a.write(s.qp.qp, static_cast<std::uint16_t>(vd::DoorbellKind::sq), s.sent);
  auto c1 = s.next_cqe(), c2 = s.next_cqe();
  BOOST_REQUIRE(c1 && c2);
  BOOST_CHECK_EQUAL(c1->status, 0);
  BOOST_CHECK_EQUAL(c2->status, 0);
  const auto& recv = c1->opcode >= 128 ? *c1 : *c2;
  BOOST_CHECK_EQUAL(recv.byte_len, 3000u);
  BOOST_CHECK(std::memcmp(g.host(s.dst, 3000), g.host(s.src, 3000), 3000) == 0);
  BOOST_CHECK(eventually([&] { return a.consumed() == a.prod; }));

  // Ring b names ring a's QP and CQ: refused, the WQE stays in the ring unposted.
  s.write_send(100, 9);
  b.write(s.qp.qp, static_cast<std::uint16_t>(vd::DoorbellKind::sq), s.sent);
  b.write(s.cq, static_cast<std::uint16_t>(vd::DoorbellKind::cq_arm), 0);
  b.write(s.qp.qp, 77, 1);  // no such kind
  BOOST_CHECK(eventually([&] { return b.consumed() == b.prod; }));
  BOOST_CHECK(!s.next_cqe(300ms).has_value());
  BOOST_CHECK_EQUAL(s.sq_consumed(), 1u);
  // A producer more than the ring's depth ahead: nothing of ring b is taken while it is.
  std::atomic_ref(b.hdr().producer).store(b.prod + kDepth + 1, std::memory_order_release);
  g.notify(vd::kDoorbellQueue);
  std::this_thread::sleep_for(100ms);
  BOOST_CHECK_EQUAL(b.consumed(), b.prod);
  std::atomic_ref(b.hdr().producer).store(b.prod, std::memory_order_release);

  // The SEND stays posted for ring a's next record: it goes, with its receive, and lands.
  s.write_recv();
  a.write(s.qp.qp, static_cast<std::uint16_t>(vd::DoorbellKind::rq), s.posted_recvs);
  a.write(s.qp.qp, static_cast<std::uint16_t>(vd::DoorbellKind::sq), s.sent);
  auto c3 = s.next_cqe(), c4 = s.next_cqe();
  BOOST_REQUIRE(c3 && c4);
  BOOST_CHECK(std::memcmp(g.host(s.dst + 4096, 100), g.host(s.src, 100), 100) == 0);

  // Arming through ring a: the next completion raises a CQ event (the device queues it).
  a.write(s.cq, static_cast<std::uint16_t>(vd::DoorbellKind::cq_arm), 0);
  const auto after = s.dev->status();
  BOOST_CHECK_EQUAL(after["ring_doorbells"].get<std::uint64_t>() - before["ring_doorbells"].get<std::uint64_t>(), 7u + 1u);
  // b's three records and the producer too far ahead (counted once per notification at least).
  BOOST_CHECK_GE(after["doorbell_errors"].get<std::uint64_t>() - before["doorbell_errors"].get<std::uint64_t>(), 4u);
  BOOST_CHECK_EQUAL(after["objects"]["db_ring"].get<int>(), 2);

  // A ring in use is not destroyed; unused, it is, once.
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::destroy_db_ring, vd::HandleReq{a.number, 0}).first,
                    static_cast<std::uint32_t>(vd::Status::busy));
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::destroy_db_ring, vd::HandleReq{b.number, 0}).first, kOk);
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::destroy_db_ring, vd::HandleReq{b.number, 0}).first, kNoent);
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::destroy_qp, vd::HandleReq{s.qp.qp, 0}).first, kOk);
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::destroy_db_ring, vd::HandleReq{a.number, 0}).first,
                    static_cast<std::uint32_t>(vd::Status::busy));  // the CQ still names it
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::destroy_cq, vd::HandleReq{s.cq, 0}).first, kOk);
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::destroy_db_ring, vd::HandleReq{a.number, 0}).first, kOk);
  BOOST_CHECK_EQUAL(s.dev->status()["objects"]["db_ring"].get<int>(), 0);

  // A guest with many processes: 4,096 rings at once (all over one page: the device does not
  // mind where they lie), the next refused ENOSPC; one given back makes room, under a number no
  // other ring has.
  const auto page = g.alloc(virtio_rdma_db_ring_bytes(kDepth), 64);
  std::set<std::uint32_t> numbers;
  std::uint32_t st = kOk;
  while (numbers.size() < vd::kMaxDbRings + 1) {
    auto [rst, body] = g.cmd(vd::Cmd::create_db_ring, vd::CreateDbRingReq{page, kDepth, 0});
    st = rst;
    if (st != kOk) break;
    BOOST_REQUIRE(numbers.insert(RawGuest::as<vd::HandleResp>(body).handle).second);
  }
  BOOST_CHECK_EQUAL(numbers.size(), vd::kMaxDbRings);
  BOOST_CHECK_EQUAL(st, static_cast<std::uint32_t>(vd::Status::no_space));
  const auto given_back = *numbers.begin();
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::destroy_db_ring, vd::HandleReq{given_back, 0}).first, kOk);
  numbers.erase(given_back);
  auto [rst, body] = g.cmd(vd::Cmd::create_db_ring, vd::CreateDbRingReq{page, kDepth, 0});
  BOOST_CHECK_EQUAL(rst, kOk);
  BOOST_CHECK(!numbers.contains(RawGuest::as<vd::HandleResp>(body).handle));
  // Each notification now reads 4,096 producers: vrdmad still answers at once.
  g.notify(vd::kDoorbellQueue);
  BOOST_CHECK_EQUAL(s.dev->status()["objects"]["db_ring"].get<int>(), static_cast<int>(vd::kMaxDbRings));
}

BOOST_AUTO_TEST_CASE(a_polling_vrdmad_takes_records_without_a_notification) {
  Setup s("vdp", 239, {"--poll-us", "300000"});
  auto& g = *s.g;
  Ring a = make_ring(g);
  s.make_objects(a);
  // The commands were work: vrdmad polls (NO_KICK) until 300 ms pass without any.
  BOOST_CHECK(eventually([&] { return a.flags() == 0; }, 3000ms));
  // The first message is notified; vrdmad then polls for 300 ms after each piece of work.
  s.write_recv();
  a.write(s.qp.qp, static_cast<std::uint16_t>(vd::DoorbellKind::rq), s.posted_recvs);
  s.write_send(512, 3);
  a.write(s.qp.qp, static_cast<std::uint16_t>(vd::DoorbellKind::sq), s.sent);
  BOOST_REQUIRE(s.next_cqe() && s.next_cqe());
  BOOST_CHECK(eventually([&] { return (a.flags() & vd::kDbRingNoKick) != 0; }, 200ms));
  // While the flag is up, records are taken without a notification.
  for (int i = 0; i < 5; ++i) {
    BOOST_REQUIRE((a.flags() & vd::kDbRingNoKick) != 0);
    s.write_recv();
    a.write(s.qp.qp, static_cast<std::uint16_t>(vd::DoorbellKind::rq), s.posted_recvs, false);
    s.write_send(512, static_cast<std::uint8_t>(10 + i));
    a.write(s.qp.qp, static_cast<std::uint16_t>(vd::DoorbellKind::sq), s.sent, false);
    BOOST_REQUIRE(s.next_cqe() && s.next_cqe());
    BOOST_CHECK(std::memcmp(g.host(s.dst + ((s.posted_recvs - 1) % kDepth) * 4096, 512), g.host(s.src, 512), 512) == 0);
  }
  // Idle: vrdmad stops polling and asks for notifications again.
  BOOST_CHECK(eventually([&] { return a.flags() == 0; }, 3000ms));
  s.write_recv();
  a.write(s.qp.qp, static_cast<std::uint16_t>(vd::DoorbellKind::rq), s.posted_recvs);
  s.write_send(64, 99);
  a.write(s.qp.qp, static_cast<std::uint16_t>(vd::DoorbellKind::sq), s.sent);
  BOOST_REQUIRE(s.next_cqe() && s.next_cqe());
  BOOST_CHECK_EQUAL(s.dev->status()["doorbell_errors"].get<std::uint64_t>(), 0u);
}
