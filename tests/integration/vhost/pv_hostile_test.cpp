// A hostile guest against vrdmad: a raw frontend (our vhost-user frontend, its own memfd RAM
// and virtqueues) sends garbage and malicious commands, work requests and doorbells. Each gets
// an error status (or an error completion), vrdmad stays up, serves a well-behaved guest
// afterwards, and another guest's vrdmad moving checked data meanwhile is not disturbed.
#define BOOST_TEST_MODULE vrdmad_hostile
#include <boost/test/unit_test.hpp>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include "check.hpp"
#include "netns.hpp"
#include "process.hpp"
#include "raw_guest.hpp"
#include "rdma_pair.hpp"
#include "vrdmad_proc.hpp"
#include "vrdma/vhost/driver_queue.hpp"
#include "vrdma/vhost/frontend.hpp"
#include "vrdma/vhost/guest_ram.hpp"
#include "vrdma/virtio_rdma.hpp"

using namespace vrdma;
using namespace vrdma::vhost;
using namespace vrdma::test;
using namespace std::chrono_literals;
namespace vd = vrdma::vrdma_dev;

BOOST_AUTO_TEST_CASE(hostile_guest_gets_errors_and_harms_no_one) {
  NetnsPair net{"vph", 236};
  BOOST_REQUIRE(net.ok());
  TempDir dir;
  Vrdmad victim(dir, "victim", net.ns_a(), "soft:" + net.ip_a());
  Vrdmad other(dir, "other", net.ns_b(), "soft:" + net.ip_b());

  // Another guest (on vrdmad "other") keeps moving checked data to itself the whole time.
  std::atomic<bool> stop{false};
  std::atomic<int> other_ok{0}, other_bad{0};
  std::thread bystander([&] {
    auto d = nicdrv::open_device("pv:" + other.sock + "?ram_mib=32");
    if (!d) {
      ++other_bad;
      return;
    }
    PairOptions o;
    o.buf_bytes = 1u << 20;
    auto a = make_endpoint(*d, o);
    auto b = make_endpoint(*d, o);
    if (!a || !b || !connect(*a, *b, o).ok()) {
      ++other_bad;
      return;
    }
    for (std::uint64_t seed = 1; !stop && seed < 100000; ++seed) {
      if (write_checked(*a, *b, 65536, seed).ok())
        ++other_ok;
      else
        ++other_bad;
    }
  });

  {
    RawGuest g(victim.sock);
    // 1. Garbage: short, unknown, random bytes (bounded: 3000 requests).
    std::mt19937_64 rng(42);
    std::uint32_t answered = 0, refused = 0;
    for (int i = 0; i < 3000; ++i) {
      std::array<std::uint8_t, 120> junk;
      for (auto& b : junk) b = static_cast<std::uint8_t>(rng());
      const std::size_t len = rng() % junk.size();
      if (i % 3 == 0) {  // a real command number with a garbage body
        const std::uint32_t c = 1 + static_cast<std::uint32_t>(rng() % 17);
        std::memcpy(junk.data(), &c, 4);
      }
      auto r = g.raw(junk.data(), len);
      BOOST_REQUIRE_MESSAGE(r.has_value(), "vrdmad stopped answering after " << i << " garbage requests");
      ++answered;
      if (r->first != kOk) ++refused;
    }
    BOOST_CHECK_EQUAL(answered, 3000u);
    BOOST_CHECK_GT(refused, 2000u);
    BOOST_CHECK_EQUAL(g.raw("\x05", 1)->first, kInval);  // shorter than a header
    BOOST_CHECK_EQUAL(g.cmd0(static_cast<vd::Cmd>(999)).first, static_cast<std::uint32_t>(vd::Status::not_supported));

    // 2. Addresses outside guest memory.
    const auto pd1 = g.create(vd::Cmd::create_pd, vd::HandleReq{});
    const auto pd2 = g.create(vd::Cmd::create_pd, vd::HandleReq{});
    for (std::uint64_t bad : {kHole, kBeyond, ~std::uint64_t{0} - 4095, (std::uint64_t{1} << 20) + (64u << 20) - 4096})
      BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::create_cq, vd::CreateCqReq{256, 0, bad}).first, kFault);
    // A ring larger than memory: 65536 CQEs from the start of the big region run past its end.
    BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::create_cq, vd::CreateCqReq{65536, 0, (1u << 20) + (63u << 20)}).first, kFault);
    const auto pages = g.alloc(4096);
    std::uint64_t list[2] = {kHole & ~std::uint64_t{4095}, kBeyond};
    std::memcpy(g.host(pages, 16), list, 16);
    vd::RegMrReq mr{};
    mr.pd = pd1;
    mr.access = 1;
    mr.iova = 0x10000;
    mr.length = 8192;
    mr.pages_gpa = pages;
    mr.npages = 2;
    mr.page_shift = 12;
    BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::reg_mr, mr).first, kInval);  // pages in a hole / beyond memory
    mr.pages_gpa = kBeyond;
    BOOST_CHECK_NE(g.cmd(vd::Cmd::reg_mr, mr).first, kOk);  // the page list itself is outside
    mr.pages_gpa = pages;
    mr.npages = 0xffffffff;
    BOOST_CHECK_NE(g.cmd(vd::Cmd::reg_mr, mr).first, kOk);  // absurd page count
    mr.npages = 2;
    mr.length = ~std::uint64_t{0};
    BOOST_CHECK_NE(g.cmd(vd::Cmd::reg_mr, mr).first, kOk);  // absurd length

    // 3. Handles that do not exist, and handles of another PD.
    BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::destroy_qp, vd::HandleReq{12345, 0}).first, kNoent);
    BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::destroy_pd, vd::HandleReq{0, 0}).first, kNoent);
    const auto cq_ring = g.alloc(vd::kCqeOffset + 64 * sizeof(vd::Cqe));
    const auto cq = g.create(vd::Cmd::create_cq, vd::CreateCqReq{64, 0, cq_ring});
    const auto srq_ring = g.alloc(64 * vd::recv_stride(1));
    const auto srq_status = g.alloc(64);
    auto [sst, sbody] = g.cmd(vd::Cmd::create_srq, vd::CreateSrqReq{pd1, 64, 1, 0, srq_ring, srq_status});
    BOOST_REQUIRE_EQUAL(sst, kOk);
    const auto srq = RawGuest::as<vd::CreateSrqResp>(sbody).srq;
    vd::CreateQpReq q = qp_request(g, pd2, cq, VIRTIO_RDMA_QPT_UD, 64);
    const auto sq = q.sq_gpa;
    q.srq = srq;  // SRQ of PD 1 for a QP of PD 2
    BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::create_qp, q).first, kPerm);
    q.srq = vd::kNoHandle;
    q.sq_depth = 3;  // not a power of two
    BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::create_qp, q).first, kInval);
    q.sq_depth = 64;
    q.sq_gpa = kHole;
    BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::create_qp, q).first, kFault);
    q.sq_gpa = sq;
    auto [qs, qbody] = g.cmd(vd::Cmd::create_qp, q);
    BOOST_REQUIRE_EQUAL(qs, kOk);
    const auto qp = RawGuest::as<vd::CreateQpResp>(qbody).qp;
    // A CQ in use cannot be destroyed; a PD holding objects neither.
    BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::destroy_cq, vd::HandleReq{cq, 0}).first, static_cast<std::uint32_t>(vd::Status::busy));
    BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::destroy_pd, vd::HandleReq{pd2, 0}).first, static_cast<std::uint32_t>(vd::Status::busy));
    // MODIFY_QP with out-of-range enums and unknown mask bits.
    vd::ModifyQpReq m{};
    m.qp = qp;
    m.mask = 1;
    m.attr.qp_state = 9;
    m.attr.path_mtu = 3;
    BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::modify_qp, m).first, kInval);
    m.attr.qp_state = 1;
    m.mask = 0x80000000u;
    BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::modify_qp, m).first, kInval);
    // Bring the UD QP to RTS (INIT needs pkey, port, qkey).
    m.mask = 1 | (1u << 4) | (1u << 5) | (1u << 6);
    m.attr.qp_state = 1;
    m.attr.port_num = 1;
    m.attr.qkey = 0x1234;
    BOOST_REQUIRE_EQUAL(g.cmd(vd::Cmd::modify_qp, m).first, kOk);
    m.mask = 1;
    m.attr.qp_state = 2;
    BOOST_REQUIRE_EQUAL(g.cmd(vd::Cmd::modify_qp, m).first, kOk);
    m.mask = 1 | (1u << 16);
    m.attr.qp_state = 3;
    BOOST_REQUIRE_EQUAL(g.cmd(vd::Cmd::modify_qp, m).first, kOk);
    // A UD send naming an AH of PD 1 from a QP of PD 2, and one with a bad opcode: error CQEs.
    vd::CreateAhReq ahr{};
    ahr.pd = pd1;
    ahr.ah.port_num = 1;
    ahr.ah.hop_limit = 64;
    ahr.ah.dgid[10] = 0xff;
    ahr.ah.dgid[11] = 0xff;
    ahr.ah.dgid[12] = 10;
    const auto ah = g.create(vd::Cmd::create_ah, ahr);
    const auto stride = vd::send_stride(1, 0);
    vd::SendWqe w{};
    w.wr_id = 0x1111;
    w.opcode = 2;
    w.flags = vd::kSendSignaled;
    w.ah = ah;
    std::memcpy(g.host(sq, sizeof w), &w, sizeof w);
    w.wr_id = 0x2222;
    w.opcode = 200;
    std::memcpy(g.host(sq + stride, sizeof w), &w, sizeof w);
    w.wr_id = 0x3333;
    w.opcode = 2;
    w.num_sge = 200;  // more SGEs than the QP has
    std::memcpy(g.host(sq + 2 * stride, sizeof w), &w, sizeof w);
    w.wr_id = 0x4444;  // an inline address vector (a kernel AH's) that is no RoCEv2 address
    w.num_sge = 0;
    w.flags = vd::kSendSignaled | vd::kSendInlineAv;
    std::memcpy(g.host(sq + 3 * stride, sizeof w), &w, sizeof w);
    std::memset(g.host(sq + 3 * stride + sizeof w, vd::kInlineAvSize), 0, vd::kInlineAvSize);
    const vd::Doorbell ring[] = {
        {qp, static_cast<std::uint16_t>(vd::DoorbellKind::sq), 0, 4, 0},
        {qp, static_cast<std::uint16_t>(vd::DoorbellKind::sq), 0, 100000, 0},   // far beyond the ring
        {777777, static_cast<std::uint16_t>(vd::DoorbellKind::sq), 0, 1, 0},    // no such QP
        {cq, static_cast<std::uint16_t>(vd::DoorbellKind::rq), 0, 1, 0},        // a CQ handle as a QP
        {qp, 99, 0, 1, 0},                                                      // unknown kind
        {999, static_cast<std::uint16_t>(vd::DoorbellKind::cq_arm), 0, 0, 0},   // no such CQ
    };
    g.doorbells(ring);
    // The four WQEs completed in order with errors (loc_qp_op_err) and their wr_ids.
    std::vector<std::uint64_t> ids;
    for (int i = 0; i < 200 && ids.size() < 4; ++i) {
      auto* c = reinterpret_cast<vd::Cqe*>(g.host(cq_ring + vd::kCqeOffset + ids.size() * sizeof(vd::Cqe), sizeof(vd::Cqe)));
      if (c->owner == vd::cqe_phase(static_cast<std::uint32_t>(ids.size()), 64)) {
        BOOST_CHECK_EQUAL(c->status, static_cast<std::uint8_t>(nicdrv::WcStatus::loc_qp_op_err));
        ids.push_back(c->wr_id);
      } else {
        std::this_thread::sleep_for(5ms);
      }
    }
    const std::vector<std::uint64_t> want{0x1111, 0x2222, 0x3333, 0x4444};
    BOOST_CHECK_EQUAL_COLLECTIONS(ids.begin(), ids.end(), want.begin(), want.end());
    // 4. A flood of valid commands, bounded: every one answered.
    for (int i = 0; i < 2000; ++i) BOOST_REQUIRE_EQUAL(g.cmd0(vd::Cmd::query_port).first, kOk);
  }  // the hostile guest disconnects; vrdmad resets its device

  // vrdmad is alive and serves a well-behaved guest with checked data.
  {
    auto d = nicdrv::open_device("pv:" + victim.sock + "?ram_mib=32");
    VRDMA_REQUIRE_OK(d);
    PairOptions o;
    o.buf_bytes = 1u << 20;
    auto a = make_endpoint(*d, o);
    auto b = make_endpoint(*d, o);
    VRDMA_REQUIRE_OK(a);
    VRDMA_REQUIRE_OK(b);
    VRDMA_REQUIRE_OK(connect(*a, *b, o));
    VRDMA_CHECK_OK(write_checked(*a, *b, 4096, 5));
  }
  // The other guest keeps moving data: on a loaded machine the steps above may have taken most
  // of the CPU, so give it (bounded) time to show more than a handful of checked writes.
  for (int i = 0; i < 300 && other_ok.load() <= 10 && other_bad.load() == 0; ++i)
    std::this_thread::sleep_for(100ms);
  stop = true;
  bystander.join();
  BOOST_CHECK_EQUAL(other_bad.load(), 0);
  BOOST_CHECK_GT(other_ok.load(), 10);
  BOOST_TEST_MESSAGE("the other guest moved " << other_ok.load() << " checked 64 KiB writes meanwhile");
  BOOST_CHECK(victim.child->alive());
  const auto log = read_file(victim.log);
  BOOST_CHECK(log.find("refused") != std::string::npos);
  BOOST_CHECK(log.find("doorbell ignored") != std::string::npos);
}

// Fast registration from a raw guest (docs/virtio-rdma.md "Fast registration"): ALLOC_MR's
// refusals; a REG_MR WQE whose pages are scattered (listed out of order) is mapped into the
// region's window, and a WRITE through the new key (an RC QP connected to itself) lands in
// exactly those pages at the right offsets; hostile REG_MR WQEs complete with errors in order
// and change nothing; LOCAL_INV ends the key (a WRITE through it fails and writes nothing); the
// windows' address space is bounded.
BOOST_AUTO_TEST_CASE(fast_registration_maps_scattered_pages_and_refuses_hostile_wqes) {
  NetnsPair net{"vpf", 237};
  BOOST_REQUIRE(net.ok());
  TempDir dir;
  Vrdmad dev(dir, "fast", net.ns_a(), "soft:" + net.ip_a());
  RawGuest g(dev.sock);
  const auto pd = g.create(vd::Cmd::create_pd, vd::HandleReq{});
  const auto pd2 = g.create(vd::Cmd::create_pd, vd::HandleReq{});
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::alloc_mr, vd::AllocMrReq{pd, 0}).first, kInval);
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::alloc_mr, vd::AllocMrReq{pd, 100000}).first, kInval);
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::alloc_mr, vd::AllocMrReq{4242, 8}).first, kNoent);
  auto [ast, abody] = g.cmd(vd::Cmd::alloc_mr, vd::AllocMrReq{pd, 8});
  BOOST_REQUIRE_EQUAL(ast, kOk);
  const auto fast = RawGuest::as<vd::RegMrResp>(abody);
  BOOST_CHECK_EQUAL(fast.lkey, fast.rkey);
  auto [ost, obody] = g.cmd(vd::Cmd::alloc_mr, vd::AllocMrReq{pd2, 8});
  BOOST_REQUIRE_EQUAL(ost, kOk);
  const auto other_pd_region = RawGuest::as<vd::RegMrResp>(obody).mr;
  auto [dst, dbody] = g.cmd(vd::Cmd::reg_dma_mr, vd::RegDmaMrReq{pd, 1});
  BOOST_REQUIRE_EQUAL(dst, kOk);
  const auto dma = RawGuest::as<vd::RegMrResp>(dbody);

  // An RC QP connected to itself.
  const auto cq_ring = g.alloc(vd::kCqeOffset + 64 * sizeof(vd::Cqe));
  const auto cq = g.create(vd::Cmd::create_cq, vd::CreateCqReq{64, 0, cq_ring});
  const auto stride = vd::send_stride(1, 0);
  const vd::CreateQpReq q = qp_request(g, pd, cq, VIRTIO_RDMA_QPT_RC, 16);
  const auto sq = q.sq_gpa;
  auto [qs, qbody] = g.cmd(vd::Cmd::create_qp, q);
  BOOST_REQUIRE_EQUAL(qs, kOk);
  const auto qp = RawGuest::as<vd::CreateQpResp>(qbody);
  connect_to_itself(g, qp);

  std::uint32_t posted = 0, polled = 0;
  auto post = [&](const void* wqe, std::size_t len) {
    std::memcpy(g.host(sq + (posted % 16) * stride, len), wqe, len);
    ++posted;
    const vd::Doorbell db{qp.qp, static_cast<std::uint16_t>(vd::DoorbellKind::sq), 0, posted, 0};
    g.doorbells(std::span(&db, 1));
  };
  auto next_cqe = [&]() -> std::optional<vd::Cqe> {
    for (int i = 0; i < 400; ++i) {
      vd::Cqe c;
      std::memcpy(&c, g.host(cq_ring + vd::kCqeOffset + (polled % 64) * sizeof c, sizeof c), sizeof c);
      if (c.owner == vd::cqe_phase(polled, 64)) {
        ++polled;
        return c;
      }
      std::this_thread::sleep_for(5ms);
    }
    return std::nullopt;
  };

  // Three pages apart from one another, listed out of order; the region starts 0x300 bytes into
  // the first listed and ends 0x100 bytes before the end of the last.
  const std::uint64_t p0 = g.alloc(4096), gap0 = g.alloc(4096), p1 = g.alloc(4096), gap1 = g.alloc(4096);
  const std::uint64_t p2 = g.alloc(4096);
  (void)gap0, (void)gap1;
  for (auto p : {p0, p1, p2}) std::memset(g.host(p, 4096), 0xaa, 4096);
  const std::uint64_t list = g.alloc(64);
  const std::uint64_t pages[3] = {p2, p0, p1};
  std::memcpy(g.host(list, sizeof pages), pages, sizeof pages);
  const std::uint64_t iova = 0x50000000 + 0x300;
  const std::uint32_t len = 3 * 4096 - 0x300 - 0x100;
  const std::uint32_t key = (fast.lkey & ~0xffu) | 0x5a;
  auto reg_wqe = [&](std::uint64_t id) {
    vd::RegMrWqe r{};
    r.wr_id = id;
    r.opcode = vd::kWrRegMr;
    r.flags = vd::kSendSignaled;
    r.key = key;
    r.iova = iova;
    r.mr = fast.mr;
    r.access = 1 | 2;  // local write, remote write
    r.length = len;
    r.pages_gpa = list;
    r.npages = 3;
    r.page_shift = 12;
    return r;
  };
  auto reg = reg_wqe(0x100);
  post(&reg, sizeof reg);
  auto c = next_cqe();
  BOOST_REQUIRE(c.has_value());
  BOOST_CHECK_EQUAL(c->wr_id, 0x100u);
  BOOST_CHECK_EQUAL(c->status, 0);
  BOOST_CHECK_EQUAL(c->opcode, 10);  // IB_WC_REG_MR

  // The WRITE's source: a buffer addressed through the PD's DMA region.
  const std::uint64_t src = g.alloc(3 * 4096);
  std::vector<std::uint8_t> data(len);
  for (std::size_t i = 0; i < len; ++i) data[i] = static_cast<std::uint8_t>(i * 7 + i / 251);
  std::memcpy(g.host(src, len), data.data(), len);
  struct {
    vd::SendWqe w;
    vd::WireSge s;
  } wr{};
  wr.w.wr_id = 0x200;
  wr.w.opcode = 0;  // RDMA WRITE
  wr.w.flags = vd::kSendSignaled;
  wr.w.num_sge = 1;
  wr.w.remote_addr = iova;
  wr.w.rkey = key;
  wr.s = vd::WireSge{src, len, dma.lkey};
  post(&wr, sizeof wr);
  c = next_cqe();
  BOOST_REQUIRE(c.has_value());
  BOOST_CHECK_EQUAL(c->wr_id, 0x200u);
  BOOST_CHECK_EQUAL(c->status, 0);
  // Page p2 from 0x300, all of p0, p1 up to 0x100 before its end; the rest untouched.
  const std::uint32_t first = 4096 - 0x300;
  BOOST_CHECK(std::memcmp(g.host(p2 + 0x300, first), data.data(), first) == 0);
  BOOST_CHECK(std::memcmp(g.host(p0, 4096), data.data() + first, 4096) == 0);
  BOOST_CHECK(std::memcmp(g.host(p1, 4096 - 0x100), data.data() + first + 4096, 4096 - 0x100) == 0);
  BOOST_CHECK(std::all_of(g.host(p2, 0x300), g.host(p2, 0x300) + 0x300, [](std::uint8_t b) { return b == 0xaa; }));
  BOOST_CHECK(std::all_of(g.host(p1 + 4096 - 0x100, 0x100), g.host(p1 + 4096 - 0x100, 0x100) + 0x100,
                          [](std::uint8_t b) { return b == 0xaa; }));
  BOOST_CHECK(std::all_of(g.host(gap0, 4096), g.host(gap0, 4096) + 4096, [](std::uint8_t b) { return b == 0; }));

  // Hostile REG_MR WQEs: each completes with a local QP operation error, in order.
  std::vector<vd::RegMrWqe> bad;
  bad.push_back(reg_wqe(0x301));
  bad.back().mr = other_pd_region;  // another PD's fast region
  bad.push_back(reg_wqe(0x302));
  bad.back().mr = dma.mr;  // not a fast region
  bad.push_back(reg_wqe(0x303));
  bad.back().npages = 9;  // more than ALLOC_MR asked for
  bad.push_back(reg_wqe(0x304));
  bad.back().num_sge = 1;
  bad.push_back(reg_wqe(0x305));
  bad.back().page_shift = 22;
  bad.push_back(reg_wqe(0x306));
  bad.back().pages_gpa = kBeyond;  // the list outside guest memory
  const std::uint64_t hole_list = g.alloc(64);
  const std::uint64_t holes[3] = {p2, kHole, p1};
  std::memcpy(g.host(hole_list, sizeof holes), holes, sizeof holes);
  bad.push_back(reg_wqe(0x307));
  bad.back().pages_gpa = hole_list;  // a page in the hole below 1 MiB
  for (const auto& b : bad) post(&b, sizeof b);
  for (const auto& b : bad) {
    c = next_cqe();
    BOOST_REQUIRE(c.has_value());
    BOOST_CHECK_EQUAL(c->wr_id, b.wr_id);
    BOOST_CHECK_EQUAL(c->status, static_cast<std::uint8_t>(nicdrv::WcStatus::loc_qp_op_err));
  }
  // Nothing above changed the pages.
  BOOST_CHECK(std::memcmp(g.host(p0, 4096), data.data() + first, 4096) == 0);

  // LOCAL_INV ends the key: a WRITE through it is refused by the responder.
  vd::SendWqe inv{};
  inv.wr_id = 0x400;
  inv.opcode = vd::kWrLocalInv;
  inv.flags = vd::kSendSignaled;
  inv.imm_data = key;
  post(&inv, sizeof inv);
  c = next_cqe();
  BOOST_REQUIRE(c.has_value());
  BOOST_CHECK_EQUAL(c->wr_id, 0x400u);
  BOOST_CHECK_EQUAL(c->status, 0);
  BOOST_CHECK_EQUAL(c->opcode, 6);  // IBV_WC_LOCAL_INV
  std::memset(g.host(p0, 4096), 0x33, 4096);
  wr.w.wr_id = 0x500;
  post(&wr, sizeof wr);
  c = next_cqe();
  BOOST_REQUIRE(c.has_value());
  BOOST_CHECK_EQUAL(c->wr_id, 0x500u);
  // The responder refuses the key and goes to ERR (IBA 9.9.3.1.1): here it is the same QP, so the
  // WRITE is flushed unless the NAK came first.
  const auto st = static_cast<nicdrv::WcStatus>(c->status);
  BOOST_CHECK_MESSAGE(st == nicdrv::WcStatus::rem_access_err || st == nicdrv::WcStatus::wr_flush_err,
                      "a WRITE through an invalidated key completed " << nicdrv::to_string(st));
  BOOST_CHECK(std::all_of(g.host(p0, 4096), g.host(p0, 4096) + 4096, [](std::uint8_t b) { return b == 0x33; }));
  // ALLOC_MR until the backend's address space for windows is spent (16 TiB: 16384 regions of
  // 512 pages, less the 16 pages' worth above): refused with ENOSPC by name, and a region given
  // back makes room again.
  std::vector<std::uint32_t> made;
  std::pair<std::uint32_t, std::vector<std::uint8_t>> last;
  for (int i = 0; i < 17000; ++i) {
    last = g.cmd(vd::Cmd::alloc_mr, vd::AllocMrReq{pd2, 512});
    if (last.first != kOk) break;
    made.push_back(RawGuest::as<vd::RegMrResp>(last.second).mr);
  }
  BOOST_CHECK_EQUAL(made.size(), 16383u);
  BOOST_CHECK_EQUAL(last.first, static_cast<std::uint32_t>(vd::Status::no_space));
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::dereg_mr, vd::HandleReq{made.back(), 0}).first, kOk);
  BOOST_CHECK_EQUAL(g.cmd(vd::Cmd::alloc_mr, vd::AllocMrReq{pd2, 512}).first, kOk);
  BOOST_CHECK(dev.child->alive());
  const auto log = read_file(dev.log);
  BOOST_CHECK(log.find("REG_MR") != std::string::npos);
  BOOST_CHECK(log.find("fast regions already hold") != std::string::npos);
}
