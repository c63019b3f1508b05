// The device's kernel-verbs groundwork through libpvverbs (issue 31): a PD's DMA memory region
// (REG_DMA_MR: the key a guest kernel gives ib_core as local_dma_lkey) and a guest's GSI QP (QP1,
// the connection manager's MADs), each against a plain soft engine, each across a move of the
// device to a new vrdmad. The guest kernel driver's use of them is vm_kmod_test's.
#define BOOST_TEST_MODULE vrdmad_pv_kverbs
#include <boost/test/unit_test.hpp>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <variant>
#include <vector>
#include <nlohmann/json.hpp>

#include "check.hpp"
#include "pv_soft_pair.hpp"
#include "rdma_pair.hpp"
#include "vrdma/guest/pv.hpp"
#include "vrdma/nicdrv/proto/mad.hpp"
#include "vrdma/nicdrv/soft.hpp"

using namespace vrdma;
using namespace vrdma::nicdrv;
using namespace vrdma::test;
namespace mad = vrdma::nicdrv::soft::mad;
using namespace std::chrono_literals;

// A PD's DMA memory region (REG_DMA_MR), what a guest kernel driver gives ib_core as the PD's
// local_dma_lkey: one key over all guest memory, work requests addressing it by guest-physical
// address. SENDs, receives and RDMA READs through it move checked data (from memory no REG_MR
// covers), in both guest memory regions; it is local only and one per PD; it moves with the
// device state to a new vrdmad; an address outside guest memory gets a local protection error.
BOOST_AUTO_TEST_CASE(a_pds_dma_memory_region_reaches_all_guest_memory_by_physical_address) {
  PvAndSoft h("vpd", 239);
  auto da = h.dev;
  auto soft = h.soft;
  PairOptions o;
  auto a = make_endpoint(da, o);
  VRDMA_REQUIRE_OK(a);
  auto b = make_endpoint(soft, o);
  VRDMA_REQUIRE_OK(b);
  VRDMA_REQUIRE_OK(connect(*a, *b, o));

  // Local only, one per PD.
  auto remote = pv::reg_dma_mr(*a->pd, Access::local_write | Access::remote_write);
  BOOST_REQUIRE(!remote.ok());
  BOOST_TEST(remote.error().message.find("local only") != std::string::npos, remote.error().message);
  auto dma = pv::reg_dma_mr(*a->pd, Access::local_write);
  VRDMA_REQUIRE_OK(dma);
  const std::uint32_t lkey = (*dma)->lkey();
  BOOST_TEST(lkey != 0U);
  BOOST_TEST((*dma)->rkey() == 0U);
  BOOST_TEST(lkey != a->mr->lkey());
  auto again = pv::reg_dma_mr(*a->pd, Access::local_write);
  BOOST_REQUIRE(!again.ok());
  BOOST_TEST(again.error().message.find("already has a DMA memory region") != std::string::npos, again.error().message);

  // Memory no REG_MR covers: a buffer of the device's DMA memory, addressed by its gpa.
  auto raw = da->alloc_buffer(64u << 10);
  VRDMA_REQUIRE_OK(raw);
  std::uint8_t* mem = (*raw)->data();
  const auto gpa = pv::gpa_of(*da, mem, (*raw)->size());
  BOOST_REQUIRE(gpa.has_value());
  BOOST_TEST_MESSAGE("DMA lkey " << std::hex << lkey << ", unregistered buffer at gpa " << *gpa);
  std::uint64_t seed = 500;

  auto send_from = [&](std::uint64_t addr, std::uint32_t len, std::uint64_t id) {
    Sge s{addr, len, lkey};
    SendWr w;
    w.wr_id = id;
    w.opcode = WrOpcode::send;
    w.flags = SendFlags::signaled;
    w.sg_list = std::span<const Sge>(&s, 1);
    VRDMA_REQUIRE_OK(a->qp->post_send(std::span(&w, 1)));
    return one(*a, "send through the DMA key");
  };
  auto moves_data = [&](const char* when) {
    BOOST_TEST_CONTEXT(when) {
      // SEND from guest-physical addresses.
      fill_pattern(mem, 8192, ++seed);
      post_recv(*b, 0, 8192, 1);
      BOOST_TEST(send_from(*gpa, 8192, 10).status == WcStatus::success);
      auto rc = one(*b, "the peer's receive");
      BOOST_TEST(rc.status == WcStatus::success);
      BOOST_TEST(rc.byte_len == 8192U);
      BOOST_TEST(check_pattern(b->buf.data(), 8192, seed));
      // A receive into them.
      std::memset(mem + 16384, 0, 4096);
      Sge rs{*gpa + 16384, 4096, lkey};
      RecvWr r{11, std::span<const Sge>(&rs, 1)};
      VRDMA_REQUIRE_OK(a->qp->post_recv(std::span(&r, 1)));
      fill_pattern(b->buf.data() + 65536, 4096, ++seed);
      Sge bs{reinterpret_cast<std::uint64_t>(b->buf.data() + 65536), 4096, b->mr->lkey()};
      SendWr bw;
      bw.wr_id = 12;
      bw.opcode = WrOpcode::send;
      bw.flags = SendFlags::signaled;
      bw.sg_list = std::span<const Sge>(&bs, 1);
      VRDMA_REQUIRE_OK(b->qp->post_send(std::span(&bw, 1)));
      BOOST_TEST(one(*b, "the peer's send").status == WcStatus::success);
      auto ra = one(*a, "the receive through the DMA key");
      BOOST_TEST(ra.status == WcStatus::success);
      BOOST_TEST(ra.wr_id == 11U);
      BOOST_TEST(check_pattern(mem + 16384, 4096, seed));
      // An RDMA READ into them (the engine writes guest memory through the DMA key).
      fill_pattern(b->buf.data() + 131072, 20000, ++seed);
      std::memset(mem + 32768, 0, 20000);
      Sge ls{*gpa + 32768, 20000, lkey};
      SendWr rw;
      rw.wr_id = 13;
      rw.opcode = WrOpcode::rdma_read;
      rw.flags = SendFlags::signaled;
      rw.sg_list = std::span<const Sge>(&ls, 1);
      rw.rdma.remote_addr = b->mr->addr() + 131072;
      rw.rdma.rkey = b->mr->rkey();
      VRDMA_REQUIRE_OK(a->qp->post_send(std::span(&rw, 1)));
      BOOST_TEST(one(*a, "the read through the DMA key").status == WcStatus::success);
      BOOST_TEST(check_pattern(mem + 32768, 20000, seed));
      // The low guest memory region (the first 640 KiB, a second engine region of the key).
      post_recv(*b, 0, 4096, 2);
      BOOST_TEST(send_from(0x1000, 4096, 14).status == WcStatus::success);
      auto low = one(*b, "the peer's receive of low memory");
      BOOST_TEST(low.status == WcStatus::success);
      BOOST_TEST(low.byte_len == 4096U);
    }
  };
  moves_data("on the first vrdmad");
  BOOST_TEST(h.backend->status()["objects"]["mr"].get<int>() == 2);

  // The device state carries it: the same key works on a new vrdmad.
  h.move_to_new_vrdmad("new");
  BOOST_TEST(h.backend->status()["objects"]["mr"].get<int>() == 2);
  moves_data("after the move to a new vrdmad");

  // Outside guest memory (the hole after the first 640 KiB, and far beyond): refused by the
  // engine as a local protection error, never read.
  BOOST_TEST(send_from(0xA0000, 64, 15).status == WcStatus::loc_prot_err);
  BOOST_TEST(h.backend->status()["command_errors"].get<int>() == 0);
}

// A guest's GSI QP (QP1, what a guest kernel's ib_mad creates): while it exists the MADs that
// come to the device's QP1 are the guest's, not the engine's own CM agent's. A CM REQ the guest
// sends from QP1 reaches the peer engine's CM, whose REJ (no listener for the service) comes
// back to the guest's QP1 with its GRH; one GSI QP per device.
BOOST_AUTO_TEST_CASE(a_guests_gsi_qp_takes_qp1_and_carries_cm_mads_both_ways) {
  PvAndSoft h("vpg", 241);
  auto da = h.dev;
  auto soft = h.soft;
  auto attr = da->query_device();
  VRDMA_REQUIRE_OK(attr);
  BOOST_TEST(attr->gsi);  // vrdmad offers VIRTIO_RDMA_FEATURE_GSI on the soft engine
  auto pd = da->alloc_pd();
  VRDMA_REQUIRE_OK(pd);
  auto cq = da->create_cq(64);
  VRDMA_REQUIRE_OK(cq);
  QpInitAttr ia;
  ia.type = QpType::gsi;
  ia.send_cq = cq->get();
  ia.recv_cq = cq->get();
  ia.cap.max_send_wr = 16;
  ia.cap.max_recv_wr = 16;
  auto qp = (*pd)->create_qp(ia);
  VRDMA_REQUIRE_OK(qp);
  BOOST_TEST((*qp)->qp_num() == mad::kGsiQpn);
  auto second = (*pd)->create_qp(ia);
  BOOST_REQUIRE(!second.ok());
  BOOST_TEST(second.error().message.find("GSI QP") != std::string::npos, second.error().message);

  // As ib_mad brings QP1 up: no port in the RESET->INIT mask (QP1 is bound to its port).
  QpAttr a;
  a.qp_state = QpState::init;
  a.qkey = mad::kGsiQkey;
  VRDMA_REQUIRE_OK((*qp)->modify(a, QpAttrMask::state | QpAttrMask::pkey_index | QpAttrMask::qkey));
  a.qp_state = QpState::rtr;
  VRDMA_REQUIRE_OK((*qp)->modify(a, QpAttrMask::state));
  a.qp_state = QpState::rts;
  a.sq_psn = 0;
  VRDMA_REQUIRE_OK((*qp)->modify(a, QpAttrMask::state | QpAttrMask::sq_psn));

  constexpr std::size_t kGrh = 40, kSlot = kGrh + mad::kMadLen;
  auto buf = da->alloc_buffer(64u << 10);
  VRDMA_REQUIRE_OK(buf);
  std::uint8_t* mem = (*buf)->data();
  auto mr = (*pd)->reg_mr(mem, (*buf)->size(), Access::local_write);
  VRDMA_REQUIRE_OK(mr);
  for (std::uint64_t i = 0; i < 4; ++i) {
    Sge s{reinterpret_cast<std::uint64_t>(mem + 4096 + i * 512), static_cast<std::uint32_t>(kSlot), (*mr)->lkey()};
    RecvWr r{100 + i, std::span<const Sge>(&s, 1)};
    VRDMA_REQUIRE_OK((*qp)->post_recv(std::span(&r, 1)));
  }

  auto peer_gid = soft->query_gid(0, 1);
  VRDMA_REQUIRE_OK(peer_gid);
  auto my_gid = da->query_gid(0, 1);
  VRDMA_REQUIRE_OK(my_gid);
  AhAttr ah_attr;
  ah_attr.dgid = peer_gid->gid;
  auto ah = (*pd)->create_ah(ah_attr);
  VRDMA_REQUIRE_OK(ah);
  mad::Req req;
  req.local_comm_id = 0x1234567;
  req.service_id = 0x0106000000004242ULL;  // an RDMA-CM TCP port space service nobody listens on
  req.local_ca_guid = 0x5254000000000001ULL;
  req.local_qpn = 0x77;
  req.starting_psn = 1;
  req.path_mtu = 3;
  std::memcpy(req.primary_local_gid.data(), my_gid->gid.raw.data(), 16);
  std::memcpy(req.primary_remote_gid.data(), peer_gid->gid.raw.data(), 16);
  mad::Header hdr;
  hdr.tid = 0xabc0001;
  const auto bytes = mad::encode(hdr, req);
  std::memcpy(mem, bytes.data(), bytes.size());
  Sge s{reinterpret_cast<std::uint64_t>(mem), static_cast<std::uint32_t>(bytes.size()), (*mr)->lkey()};
  SendWr w;
  w.wr_id = 1;
  w.opcode = WrOpcode::send;
  w.flags = SendFlags::signaled;
  w.sg_list = std::span<const Sge>(&s, 1);
  w.ud.ah = ah->get();
  w.ud.remote_qpn = mad::kGsiQpn;
  w.ud.remote_qkey = mad::kGsiQkey;
  VRDMA_REQUIRE_OK((*qp)->post_send(std::span(&w, 1)));

  std::vector<WorkCompletion> got;
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (got.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    auto more = wait_cq(**cq, 1, 1s);
    got.insert(got.end(), more.begin(), more.end());
  }
  BOOST_REQUIRE_EQUAL(got.size(), 2U);
  const WorkCompletion* sent = got[0].opcode == WcOpcode::send ? &got[0] : &got[1];
  const WorkCompletion* rcvd = got[0].opcode == WcOpcode::send ? &got[1] : &got[0];
  BOOST_TEST(sent->status == WcStatus::success);
  BOOST_TEST(sent->wr_id == 1U);
  BOOST_REQUIRE(rcvd->status == WcStatus::success);
  BOOST_TEST(rcvd->opcode == WcOpcode::recv);
  BOOST_TEST(rcvd->qp_num == mad::kGsiQpn);
  BOOST_TEST(rcvd->src_qp == mad::kGsiQpn);
  BOOST_TEST(rcvd->byte_len == kSlot);
  BOOST_TEST(has(rcvd->wc_flags, WcFlags::grh));
  mad::Mad answer;
  const std::uint8_t* slot = mem + 4096 + (rcvd->wr_id - 100) * 512;
  // The GRH ahead of the MAD: for RoCEv2 over IPv4 its last 20 bytes are the IPv4 header, whose
  // source address is the peer's (the CQE carries no GID; the GRH says who sent it).
  BOOST_TEST(std::memcmp(slot + 20 + 12, peer_gid->gid.raw.data() + 12, 4) == 0);
  BOOST_REQUIRE(mad::parse(std::span<const std::uint8_t>(slot + kGrh, mad::kMadLen), answer) == mad::ParseError::none);
  BOOST_TEST(answer.hdr.tid == hdr.tid);
  const auto* rej = std::get_if<mad::Rej>(&answer.msg);
  BOOST_REQUIRE_MESSAGE(rej != nullptr, "the peer's answer is not a REJ");
  BOOST_TEST(rej->remote_comm_id == req.local_comm_id);
  BOOST_TEST(rej->reason == static_cast<std::uint16_t>(mad::RejReason::invalid_service_id));
  auto ps = nicdrv::soft::stats(*soft);
  VRDMA_REQUIRE_OK(ps);
  BOOST_TEST(ps->cm_mads_received == 1U);
  BOOST_TEST(ps->cm_mads_sent == 1U);
  // The second GSI QP is the one command vrdmad refused.
  BOOST_TEST(h.backend->status()["command_errors"].get<int>() == 1);

  // QP1 moves with the device state: on a new vrdmad the guest's GSI QP is QP1 again and the
  // peer's answer to another REQ comes back to it.
  h.move_to_new_vrdmad("b");
  BOOST_TEST(h.backend->status()["objects"]["qp"].get<int>() == 1);
  req.local_comm_id = 0x7654321;
  hdr.tid = 0xabc0002;
  const auto again = mad::encode(hdr, req);
  std::memcpy(mem, again.data(), again.size());
  w.wr_id = 2;
  VRDMA_REQUIRE_OK((*qp)->post_send(std::span(&w, 1)));
  got.clear();
  const auto deadline2 = std::chrono::steady_clock::now() + 20s;
  while (got.size() < 2 && std::chrono::steady_clock::now() < deadline2) {
    auto more = wait_cq(**cq, 1, 1s);
    got.insert(got.end(), more.begin(), more.end());
  }
  BOOST_REQUIRE_EQUAL(got.size(), 2U);
  rcvd = got[0].opcode == WcOpcode::send ? &got[1] : &got[0];
  BOOST_REQUIRE(rcvd->status == WcStatus::success);
  BOOST_TEST(rcvd->src_qp == mad::kGsiQpn);
  const std::uint8_t* slot2 = mem + 4096 + (rcvd->wr_id - 100) * 512;
  mad::Mad second_answer;
  BOOST_REQUIRE(mad::parse(std::span<const std::uint8_t>(slot2 + kGrh, mad::kMadLen), second_answer) ==
                mad::ParseError::none);
  const auto* rej2 = std::get_if<mad::Rej>(&second_answer.msg);
  BOOST_REQUIRE(rej2 != nullptr);
  BOOST_TEST(rej2->remote_comm_id == 0x7654321U);
}
