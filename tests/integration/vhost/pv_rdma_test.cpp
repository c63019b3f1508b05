// The virtio RDMA device end to end: two vrdmad processes, each in its own network namespace
// ("host") with a soft engine on that host's address, and libpvverbs (the pv provider) in this
// process as the frontend of both. Every opcode, sizes 0 B..16 MiB, data checked; a pv
// application against a plain soft engine; per-guest limits; 16,384 QPs and CQs on one device.
#define BOOST_TEST_MODULE vrdmad_pv
#include <boost/test/unit_test.hpp>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <thread>
#include <nlohmann/json.hpp>

#include "check.hpp"
#include "netns.hpp"
#include "process.hpp"
#include "pv_soft_pair.hpp"
#include "rdma_pair.hpp"
#include "vrdmad_proc.hpp"
#include "vrdma/guest/pv.hpp"
#include "vrdma/nicdrv/registry.hpp"
#include "vrdma/nicdrv/soft.hpp"

using namespace vrdma;
using namespace vrdma::nicdrv;
using namespace vrdma::test;
using namespace std::chrono_literals;

namespace {

struct TwoHosts {
  NetnsPair net{"vpv", 231};
  TempDir dir;
  std::unique_ptr<Vrdmad> a, b;
  TwoHosts() {
    BOOST_REQUIRE_MESSAGE(net.ok(), "cannot create network namespaces (needs root)");
    a = std::make_unique<Vrdmad>(dir, "a", net.ns_a(), "soft:" + net.ip_a());
    b = std::make_unique<Vrdmad>(dir, "b", net.ns_b(), "soft:" + net.ip_b());
  }
};


// Every opcode between two endpoints, data checked, for a ladder of sizes.
void every_opcode(Endpoint& a, Endpoint& b, std::size_t max_size) {
  const std::size_t half = a.buf.size() / 2;
  std::uint64_t seed = 1;
  std::vector<std::size_t> sizes{0, 1, 63, 4096, 65537, 1 << 20};
  if (max_size >= (16u << 20)) sizes.push_back(16u << 20);
  for (std::size_t size : sizes) {
    BOOST_TEST_CONTEXT("size " << size) {
      // SEND and SEND_WITH_IMM: a's [0,size) into b's [half, half+size).
      for (bool imm : {false, true}) {
        fill_pattern(a.buf.data(), size, ++seed);
        post_recv(b, half, size, 7);
        Sge s{reinterpret_cast<std::uint64_t>(a.buf.data()), static_cast<std::uint32_t>(size), a.mr->lkey()};
        SendWr w;
        w.wr_id = 1;
        w.opcode = imm ? WrOpcode::send_with_imm : WrOpcode::send;
        w.flags = SendFlags::signaled;
        w.imm_data = 0xabcd1234;
        w.sg_list = std::span<const Sge>(&s, size > 0 ? 1 : 0);
        VRDMA_REQUIRE_OK(a.qp->post_send(std::span(&w, 1)));
        auto sc = one(a, "send");
        BOOST_CHECK_EQUAL(sc.status, WcStatus::success);
        auto rc = one(b, "recv");
        BOOST_CHECK_EQUAL(rc.status, WcStatus::success);
        BOOST_CHECK_EQUAL(rc.byte_len, size);
        BOOST_CHECK_EQUAL(rc.wr_id, 7u);
        BOOST_CHECK(has(rc.wc_flags, WcFlags::with_imm) == imm);
        if (imm) BOOST_CHECK_EQUAL(rc.imm_data, 0xabcd1234u);
        BOOST_CHECK(check_pattern(b.buf.data() + half, size, seed));
      }
      // RDMA WRITE (and WITH_IMM, which consumes a receive).
      for (bool imm : {false, true}) {
        fill_pattern(a.buf.data(), size, ++seed);
        if (imm) post_recv(b, 0, 0, 9);
        Sge s{reinterpret_cast<std::uint64_t>(a.buf.data()), static_cast<std::uint32_t>(size), a.mr->lkey()};
        SendWr w;
        w.wr_id = 2;
        w.opcode = imm ? WrOpcode::rdma_write_with_imm : WrOpcode::rdma_write;
        w.flags = SendFlags::signaled;
        w.imm_data = 77;
        w.sg_list = std::span<const Sge>(&s, size > 0 ? 1 : 0);
        w.rdma.remote_addr = b.mr->addr() + half;
        w.rdma.rkey = b.mr->rkey();
        VRDMA_REQUIRE_OK(a.qp->post_send(std::span(&w, 1)));
        BOOST_CHECK_EQUAL(one(a, "write").status, WcStatus::success);
        if (imm) {
          auto rc = one(b, "write imm");
          BOOST_CHECK_EQUAL(rc.status, WcStatus::success);
          BOOST_CHECK_EQUAL(rc.opcode, WcOpcode::recv_rdma_with_imm);
          BOOST_CHECK_EQUAL(rc.imm_data, 77u);
        }
        BOOST_CHECK(check_pattern(b.buf.data() + half, size, seed));
      }
      // RDMA READ: b's [half, +size) into a's [half, +size).
      {
        fill_pattern(b.buf.data() + half, size, ++seed);
        std::memset(a.buf.data() + half, 0, size);
        Sge s{reinterpret_cast<std::uint64_t>(a.buf.data() + half), static_cast<std::uint32_t>(size), a.mr->lkey()};
        SendWr w;
        w.wr_id = 3;
        w.opcode = WrOpcode::rdma_read;
        w.flags = SendFlags::signaled;
        w.sg_list = std::span<const Sge>(&s, size > 0 ? 1 : 0);
        w.rdma.remote_addr = b.mr->addr() + half;
        w.rdma.rkey = b.mr->rkey();
        VRDMA_REQUIRE_OK(a.qp->post_send(std::span(&w, 1)));
        BOOST_CHECK_EQUAL(one(a, "read").status, WcStatus::success);
        BOOST_CHECK(check_pattern(a.buf.data() + half, size, seed));
      }
    }
  }
  // Atomics on an 8-byte word of b.
  std::uint64_t* word = reinterpret_cast<std::uint64_t*>(b.buf.data() + 64);
  *word = 40;
  auto atomic = [&](WrOpcode op, std::uint64_t cmp_add, std::uint64_t swap) {
    Sge s{reinterpret_cast<std::uint64_t>(a.buf.data() + 128), 8, a.mr->lkey()};
    SendWr w;
    w.wr_id = 4;
    w.opcode = op;
    w.flags = SendFlags::signaled;
    w.sg_list = std::span<const Sge>(&s, 1);
    w.atomic.remote_addr = b.mr->addr() + 64;
    w.atomic.rkey = b.mr->rkey();
    w.atomic.compare_add = cmp_add;
    w.atomic.swap = swap;
    VRDMA_REQUIRE_OK(a.qp->post_send(std::span(&w, 1)));
    BOOST_CHECK_EQUAL(one(a, "atomic").status, WcStatus::success);
    std::uint64_t old;
    std::memcpy(&old, a.buf.data() + 128, 8);
    return old;
  };
  BOOST_CHECK_EQUAL(atomic(WrOpcode::atomic_fetch_and_add, 2, 0), 40u);
  BOOST_CHECK_EQUAL(*word, 42u);
  BOOST_CHECK_EQUAL(atomic(WrOpcode::atomic_cmp_and_swp, 42, 1000), 42u);
  BOOST_CHECK_EQUAL(*word, 1000u);
  BOOST_CHECK_EQUAL(atomic(WrOpcode::atomic_cmp_and_swp, 42, 5), 1000u);
  BOOST_CHECK_EQUAL(*word, 1000u);
}

PairOptions big_pair() {
  PairOptions o;
  o.buf_bytes = 40u << 20;  // two 16 MiB halves and room for atomics
  o.mtu = Mtu::mtu4096;
  return o;
}

}  // namespace

BOOST_AUTO_TEST_CASE(pv_to_pv_every_opcode_across_two_hosts) {
  TwoHosts h;
  auto da = open_dev(h.a->device() + "?ram_mib=192");
  auto db = open_dev(h.b->device() + "?ram_mib=192");
  auto o = big_pair();
  auto a = make_endpoint(da, o);
  VRDMA_REQUIRE_OK(a);
  auto b = make_endpoint(db, o);
  VRDMA_REQUIRE_OK(b);
  VRDMA_REQUIRE_OK(connect(*a, *b, o));
  every_opcode(*a, *b, 16u << 20);
  every_opcode(*b, *a, 1u << 20);
  // The devices really went through vrdmad: its counters saw the work.
  auto st = h.a->status();
  BOOST_REQUIRE(st.is_object());
  BOOST_CHECK_GT(st["send_wqes"].get<std::uint64_t>(), 30u);
  BOOST_CHECK_GT(st["cqes"].get<std::uint64_t>(), 30u);
  BOOST_CHECK_EQUAL(st["objects"]["qp"].get<int>(), 1);
  BOOST_CHECK_EQUAL(st["command_errors"].get<int>(), 0);
}

BOOST_AUTO_TEST_CASE(pv_against_a_plain_soft_engine) {
  PvAndSoft h("vpp", 235);
  auto& v = *h.backend;
  auto& net = h.net;
  auto& dir = h.dir;
  auto da = h.dev;
  auto soft = h.soft;
  PairOptions o;
  o.buf_bytes = 4u << 20;
  auto a = make_endpoint(da, o);
  VRDMA_REQUIRE_OK(a);
  auto b = make_endpoint(soft, o);
  VRDMA_REQUIRE_OK(b);
  VRDMA_REQUIRE_OK(connect(*a, *b, o));
  every_opcode(*a, *b, 1u << 20);
  every_opcode(*b, *a, 1u << 20);

  // What vrdmad says went over the wire is what the peer engine counted, packet for packet and
  // byte for byte (no loss between the namespaces); `vrdmactl list --json` reports the same.
  auto peer = nicdrv::soft::stats(*soft);
  nlohmann::json wire;
  for (int i = 0; i < 100; ++i) {  // the last ACKs may still be on their way
    peer = nicdrv::soft::stats(*soft);
    wire = v.status()["wire"];
    if (peer && wire.is_object() && wire.value("tx_packets", 0ULL) == peer->rx_packets &&
        wire.value("rx_packets", 0ULL) == peer->tx_packets)
      break;
    std::this_thread::sleep_for(50ms);
  }
  BOOST_REQUIRE(peer.ok());
  BOOST_TEST_MESSAGE("vrdmad wire " << wire.dump() << "; peer tx " << peer->tx_packets << " rx " << peer->rx_packets);
  BOOST_TEST(peer->tx_packets > 2000U);  // every opcode both ways, up to 1 MiB at MTU 1024
  BOOST_TEST(wire.value("tx_packets", 0ULL) == peer->rx_packets);
  BOOST_TEST(wire.value("rx_packets", 0ULL) == peer->tx_packets);
  BOOST_TEST(wire.value("tx_bytes", 0ULL) == peer->rx_bytes);
  BOOST_TEST(wire.value("rx_bytes", 0ULL) == peer->tx_bytes);
  auto vrdmactl = [&](const std::string& args) {
    std::string out;
    if (std::FILE* f = ::popen((std::string(VRDMACTL) + " " + args + " --dir " + dir.path()).c_str(), "r")) {
      char buf[4096];
      std::size_t n = 0;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
      BOOST_TEST(::pclose(f) == 0);
    }
    return out;
  };
  const std::string out = vrdmactl("list --json");
  auto listed = nlohmann::json::parse(out, nullptr, false);
  BOOST_REQUIRE_MESSAGE(listed.is_object() && listed["backends"].size() == 1U, "vrdmactl list --json: " + out);
  const auto& st = listed["backends"][0]["status"];
  BOOST_TEST(listed["backends"][0]["control"].get<std::string>() == v.ctl);
  BOOST_TEST(st["wire"]["tx_packets"].get<std::uint64_t>() == peer->rx_packets);
  BOOST_TEST(st["wire"]["rx_bytes"].get<std::uint64_t>() == peer->tx_bytes);
  BOOST_TEST(st["objects"]["qp"].get<int>() == 1);
  BOOST_TEST(st["version"].is_string());
  // The same counter for Prometheus (node_exporter's textfile collector).
  const std::string prom = vrdmactl("list --prometheus");
  const std::string sample = "vrdma_wire_tx_packets_total{domain=\"\",engine=\"soft:" + net.ip_a() + "\",control=\"" +
                             v.ctl + "\"} " + std::to_string(peer->rx_packets) + "\n";
  BOOST_TEST(prom.find("# TYPE vrdma_wire_tx_packets_total counter\n") != std::string::npos, prom);
  BOOST_TEST(prom.find(sample) != std::string::npos, prom);
}

BOOST_AUTO_TEST_CASE(per_guest_limits_are_enforced) {
  NetnsPair net{"vpl", 232};
  BOOST_REQUIRE(net.ok());
  TempDir dir;
  Vrdmad v(dir, "lim", net.ns_a(), "soft:" + net.ip_a(),
           {"--max-qp", "3", "--max-cq", "2", "--max-registered-bytes", std::to_string(3u << 20)});
  auto d = open_dev(v.device() + "?ram_mib=64");
  auto pd = d->alloc_pd();
  VRDMA_REQUIRE_OK(pd);
  auto cq1 = d->create_cq(16);
  auto cq2 = d->create_cq(16);
  VRDMA_REQUIRE_OK(cq1);
  VRDMA_REQUIRE_OK(cq2);
  auto cq3 = d->create_cq(16);
  BOOST_REQUIRE(!cq3.ok());
  BOOST_CHECK(cq3.error().is(Errc::limit_exceeded));
  QpInitAttr ia;
  ia.send_cq = cq1->get();
  ia.recv_cq = cq1->get();
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 8;
  std::vector<std::shared_ptr<QueuePair>> qps;
  for (int i = 0; i < 3; ++i) {
    auto q = (*pd)->create_qp(ia);
    VRDMA_REQUIRE_OK(q);
    qps.push_back(*q);
  }
  auto q4 = (*pd)->create_qp(ia);
  BOOST_REQUIRE(!q4.ok());
  BOOST_CHECK(q4.error().is(Errc::limit_exceeded));
  qps.pop_back();  // destroying one frees its slot
  auto q5 = (*pd)->create_qp(ia);
  VRDMA_CHECK_OK(q5);
  auto buf = d->alloc_buffer(4u << 20);
  VRDMA_REQUIRE_OK(buf);
  auto m1 = (*pd)->reg_mr((*buf)->data(), 2u << 20, Access::local_write);
  VRDMA_REQUIRE_OK(m1);
  auto m2 = (*pd)->reg_mr((*buf)->data() + (2u << 20), 2u << 20, Access::local_write);
  BOOST_REQUIRE(!m2.ok());
  BOOST_CHECK(m2.error().is(Errc::limit_exceeded));
  // A CQ still used by QPs cannot go; the device says busy, and the guest's objects stay.
  auto st = v.status();
  BOOST_CHECK_EQUAL(st["objects"]["qp"].get<int>(), 3);
  BOOST_CHECK_EQUAL(st["registered_bytes"].get<std::uint64_t>(), 2u << 20);
}

BOOST_AUTO_TEST_CASE(one_device_serves_16384_qps_and_cqs) {
  NetnsPair net{"vps", 234};
  BOOST_REQUIRE(net.ok());
  TempDir dir;
  Vrdmad v(dir, "scale", net.ns_a(), "soft:" + net.ip_a());
  auto d = open_dev(v.device() + "?ram_mib=768");  // the objects take ~512 MiB, a state area up to 64
  auto pd = d->alloc_pd();
  VRDMA_REQUIRE_OK(pd);
  constexpr int kN = 16384;
  std::vector<std::shared_ptr<CompletionQueue>> cqs;
  std::vector<std::shared_ptr<QueuePair>> qps;
  cqs.reserve(kN);
  qps.reserve(kN);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kN; ++i) {
    auto cq = d->create_cq(4);
    VRDMA_REQUIRE_OK(cq);
    QpInitAttr ia;
    ia.send_cq = cq->get();
    ia.recv_cq = cq->get();
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
    auto qp = (*pd)->create_qp(ia);
    VRDMA_REQUIRE_OK(qp);
    cqs.push_back(*cq);
    qps.push_back(*qp);
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST_MESSAGE("created " << kN << " CQs and " << kN << " QPs in " << ms << " ms");
  auto st = v.status();
  BOOST_CHECK_EQUAL(st["objects"]["qp"].get<int>(), kN);
  BOOST_CHECK_EQUAL(st["objects"]["cq"].get<int>(), kN);
  // The last QP works: loop it back to itself over the engine (RC to its own QPN).
  QpAttr a;
  using M = QpAttrMask;
  auto& qp = qps.back();
  a.qp_state = QpState::init;
  a.qp_access_flags = Access::local_write | Access::remote_write;
  VRDMA_REQUIRE_OK(qp->modify(a, M::state | M::pkey_index | M::port | M::access_flags));
  a.qp_state = QpState::rtr;
  a.dest_qp_num = qp->qp_num();
  auto gid = d->query_gid(0);
  VRDMA_REQUIRE_OK(gid);
  a.ah_attr.dgid = gid->gid;
  VRDMA_REQUIRE_OK(qp->modify(a, M::state | M::av | M::path_mtu | M::dest_qpn | M::rq_psn | M::max_dest_rd_atomic |
                                     M::min_rnr_timer));
  a.qp_state = QpState::rts;
  VRDMA_REQUIRE_OK(qp->modify(a, M::state | M::sq_psn | M::timeout | M::retry_cnt | M::rnr_retry | M::max_qp_rd_atomic));
  auto buf = d->alloc_buffer(8192);
  VRDMA_REQUIRE_OK(buf);
  auto mr = (*pd)->reg_mr((*buf)->data(), 8192, Access::local_write | Access::remote_write);
  VRDMA_REQUIRE_OK(mr);
  fill_pattern((*buf)->data(), 4096, 99);
  Sge s{reinterpret_cast<std::uint64_t>((*buf)->data()), 4096, (*mr)->lkey()};
  SendWr w;
  w.opcode = WrOpcode::rdma_write;
  w.flags = SendFlags::signaled;
  w.sg_list = std::span<const Sge>(&s, 1);
  w.rdma.remote_addr = (*mr)->addr() + 4096;
  w.rdma.rkey = (*mr)->rkey();
  VRDMA_REQUIRE_OK(qp->post_send(std::span(&w, 1)));
  auto wcs = wait_cq(*cqs.back(), 1, 30s);
  BOOST_REQUIRE_EQUAL(wcs.size(), 1u);
  BOOST_CHECK_EQUAL(wcs[0].status, WcStatus::success);
  BOOST_CHECK(check_pattern((*buf)->data() + 4096, 4096, 99));
}

// The device moves to a new vrdmad while an RC connection to a plain soft engine carries SENDs
// both ways: the application suspends its pv device (rings stopped, device state taken), the
// old vrdmad dies, a new one starts on the same host address, the device resumes there with the
// same QPN, keys and PSNs. Every SEND on both sides completes exactly once, in order, with its
// data; the peer only saw a pause and retransmissions. The guest rings through a doorbell ring
// (as a process under the guest kernel driver does), which moves with the device: the new vrdmad
// takes its records from where the old one stopped.
BOOST_AUTO_TEST_CASE(device_state_moves_to_a_new_vrdmad_with_the_connection_open) {
  PvAndSoft h("vpm", 237, "ram_mib=64&doorbells=ring");
  auto dev = h.dev;
  auto soft = h.soft;
  PairOptions o;
  o.buf_bytes = 2u << 20;
  // ~34 ms: retransmissions start soon after the pause, and the peer's 8 tries (~270 ms) outlast a
  // move under ASan+UBSan on a loaded machine (120-150 ms alone; at 12, ~134 ms, one run failed)
  o.timeout = 13;
  auto a = make_endpoint(dev, o);
  VRDMA_REQUIRE_OK(a);
  auto b = make_endpoint(soft, o);
  VRDMA_REQUIRE_OK(b);
  VRDMA_REQUIRE_OK(connect(*a, *b, o));
  const std::uint32_t qpn = a->qp->qp_num();
  const std::uint32_t rkey = a->mr->rkey();

  constexpr std::size_t kSlot = 4096, kSlots = 64, kMsgs = 400;
  const std::size_t rx_base = 1u << 20;  // receive slots in the upper half, send sources in the lower
  for (auto* e : {&*a, &*b})
    for (std::size_t s = 0; s < kSlots; ++s) post_recv(*e, rx_base + s * kSlot, kSlot, s);
  std::size_t sent[2] = {0, 0}, send_done[2] = {0, 0}, recvd[2] = {0, 0};
  bool migrated = false;
  Endpoint* ep[2] = {&*a, &*b};
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while ((send_done[0] < kMsgs || send_done[1] < kMsgs || recvd[0] < kMsgs || recvd[1] < kMsgs) &&
         std::chrono::steady_clock::now() < deadline) {
    for (int side = 0; side < 2; ++side) {
      Endpoint& e = *ep[side];
      // Keep up to 16 SENDs in flight (the peer has 64 receives posted, re-posted as they complete).
      while (sent[side] < kMsgs && sent[side] - send_done[side] < 16 && sent[side] - recvd[1 - side] < kSlots - 8) {
        const std::size_t i = sent[side];
        std::uint8_t* src = e.buf.data() + (i % 64) * kSlot;
        fill_pattern(src, kSlot, 1000 * static_cast<std::uint64_t>(side) + i);
        Sge s{reinterpret_cast<std::uint64_t>(src), static_cast<std::uint32_t>(kSlot), e.mr->lkey()};
        SendWr w;
        w.wr_id = i;
        w.opcode = WrOpcode::send_with_imm;
        w.flags = SendFlags::signaled;
        w.imm_data = static_cast<std::uint32_t>(i);
        w.sg_list = std::span<const Sge>(&s, 1);
        VRDMA_REQUIRE_OK(e.qp->post_send(std::span(&w, 1)));
        ++sent[side];
      }
      std::array<WorkCompletion, 32> wcs;
      auto n = e.cq->poll(wcs);
      VRDMA_REQUIRE_OK(n);
      for (std::size_t k = 0; k < *n; ++k) {
        const auto& wc = wcs[k];
        BOOST_REQUIRE_MESSAGE(wc.status == WcStatus::success, "side " << side << " wr " << wc.wr_id << ": " << wc.status);
        if (wc.opcode == WcOpcode::send) {
          BOOST_REQUIRE_EQUAL(wc.wr_id, send_done[side]);  // each SEND completes once, in order
          ++send_done[side];
        } else {
          BOOST_REQUIRE_EQUAL(wc.imm_data, recvd[side]);   // each message arrives once, in order
          const std::uint8_t* slot = e.buf.data() + rx_base + wc.wr_id * kSlot;
          BOOST_REQUIRE_MESSAGE(check_pattern(slot, kSlot, 1000 * static_cast<std::uint64_t>(1 - side) + recvd[side]),
                                "side " << side << " message " << recvd[side] << " corrupted");
          ++recvd[side];
          post_recv(e, rx_base + wc.wr_id * kSlot, kSlot, wc.wr_id);
        }
      }
    }
    if (!migrated && sent[0] >= kMsgs / 2) {
      // Mid-stream, with SENDs in flight both ways.
      migrated = true;
      const auto t0 = std::chrono::steady_clock::now();
      const auto bytes = h.move_to_new_vrdmad("new");
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
      BOOST_TEST_MESSAGE("moved to a new vrdmad in " << ms << " ms with " << sent[0] - send_done[0] << " + "
                                                     << sent[1] - send_done[1] << " SENDs in flight; state " << bytes
                                                     << " bytes");
      auto st = h.backend->status();
      BOOST_CHECK_EQUAL(st["objects"]["qp"].get<int>(), 1);
      BOOST_CHECK_EQUAL(st["objects"]["db_ring"].get<int>(), 1);
    }
  }
  BOOST_CHECK(migrated);
  // Every doorbell after the move came through the moved ring, and none was refused.
  const auto after = h.backend->status();
  BOOST_CHECK_GT(after["ring_doorbells"].get<std::uint64_t>(), 0u);
  BOOST_CHECK_EQUAL(after["ring_doorbells"].get<std::uint64_t>(), after["doorbells"].get<std::uint64_t>());
  BOOST_CHECK_EQUAL(after["doorbell_errors"].get<std::uint64_t>(), 0u);
  BOOST_CHECK_EQUAL(send_done[0], kMsgs);
  BOOST_CHECK_EQUAL(send_done[1], kMsgs);
  BOOST_CHECK_EQUAL(recvd[0], kMsgs);
  BOOST_CHECK_EQUAL(recvd[1], kMsgs);
  BOOST_CHECK_EQUAL(a->qp->qp_num(), qpn);  // the same handles on the new backend
  BOOST_CHECK_EQUAL(a->mr->rkey(), rkey);
}

// One message in flight at a time, many times: every completion must wake its poller (a lost
// wakeup between vrdmad's last poll of an engine CQ and its re-arm once stalled this after a few
// thousand round trips).
BOOST_AUTO_TEST_CASE(twenty_thousand_pv_ping_pongs_never_stall) {
  PvAndSoft h("vpq", 238);
  auto dev = h.dev;
  auto soft = h.soft;
  PairOptions o;
  o.buf_bytes = 1u << 20;
  auto a = make_endpoint(dev, o);
  auto b = make_endpoint(soft, o);
  VRDMA_REQUIRE_OK(a);
  VRDMA_REQUIRE_OK(b);
  VRDMA_REQUIRE_OK(connect(*a, *b, o));
  constexpr int kRounds = 20000;
  post_recv(*a, 4096, 64, 0);
  post_recv(*b, 4096, 64, 0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i) {
    for (auto [from, to] : {std::pair{&*a, &*b}, std::pair{&*b, &*a}}) {
      Sge s{reinterpret_cast<std::uint64_t>(from->buf.data()), 64, from->mr->lkey()};
      SendWr w;
      w.wr_id = static_cast<std::uint64_t>(i);
      w.opcode = WrOpcode::send_with_imm;
      w.imm_data = static_cast<std::uint32_t>(i);
      w.flags = SendFlags::signaled;
      w.sg_list = std::span<const Sge>(&s, 1);
      VRDMA_REQUIRE_OK(from->qp->post_send(std::span(&w, 1)));
      auto rc = wait_cq(*to->cq, 1, 5s);
      BOOST_REQUIRE_MESSAGE(rc.size() == 1, "round " << i << ": the message never arrived");
      BOOST_REQUIRE_EQUAL(rc[0].imm_data, static_cast<std::uint32_t>(i));
      post_recv(*to, 4096, 64, 0);
      auto sc = wait_cq(*from->cq, 1, 5s);
      BOOST_REQUIRE_MESSAGE(sc.size() == 1 && sc[0].status == WcStatus::success, "round " << i << ": no send completion");
    }
  }
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST_MESSAGE(kRounds << " ping-pongs over pv in " << us / 1000 << " ms (" << us / kRounds << " us per round trip)");
}
