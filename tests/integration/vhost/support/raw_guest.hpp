// A raw guest for vrdmad's tests: our vhost-user frontend with its own memfd RAM and
// virtqueues, sending control commands and doorbells byte for byte as a driver (or a hostile
// one) would. Shared by vrdmad_hostile_test and vrdmad_db_ring_test.
#pragma once
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "check.hpp"
#include "vrdma/vhost/driver_queue.hpp"
#include "vrdma/vhost/frontend.hpp"
#include "vrdma/vhost/guest_ram.hpp"
#include "vrdma/virtio_rdma.hpp"

namespace vrdma::test {

namespace vd = vrdma::vrdma_dev;
using vhost::DriverBuf;
using vhost::DriverQueue;
using vhost::Frontend;
using vhost::GuestRam;
using vhost::ProtocolFeature;
using vhost::VirtioFeature;

// Guest memory: [0, 640K) and [1M, 1M+64M): anything else is a hole or beyond memory.
inline constexpr std::uint64_t kHole = 0xA0000;
inline constexpr std::uint64_t kBeyond = std::uint64_t{1} << 40;

class RawGuest {
 public:
  explicit RawGuest(const std::string& sock) {
    auto fe = Frontend::connect(sock, 5000);
    BOOST_REQUIRE_MESSAGE(fe.ok(), (fe.ok() ? std::string() : fe.error().message));
    fe_ = std::make_unique<Frontend>(std::move(*fe));
    auto ram = GuestRam::create({{0, 640u << 10, 0}, {1u << 20, 64u << 20, 1u << 20}});
    BOOST_REQUIRE(ram.ok());
    ram_ = std::make_unique<GuestRam>(std::move(*ram));
    auto acked = fe_->negotiate({VirtioFeature::version_1, VirtioFeature::protocol_features},
                                {ProtocolFeature::mq, ProtocolFeature::reply_ack, ProtocolFeature::config});
    BOOST_REQUIRE(acked.ok());
    VRDMA_REQUIRE_OK(fe_->set_owner());
    VRDMA_REQUIRE_OK(fe_->set_mem_table(*ram_));
    for (std::uint16_t i = 0; i < vd::kNumQueues; ++i) {
      auto q = DriverQueue::create(*ram_, 256, false, false);
      BOOST_REQUIRE(q.ok());
      qs_.push_back(std::move(*q));
    }
    for (std::uint16_t i = 0; i < vd::kNumQueues; ++i) VRDMA_REQUIRE_OK(fe_->start_queue(i, qs_[i]));
    auto req = ram_->alloc(4096, 4096);
    auto rsp = ram_->alloc(4096, 4096);
    BOOST_REQUIRE(req.ok() && rsp.ok());
    req_ = *req;
    rsp_ = *rsp;
  }

  std::uint8_t* host(std::uint64_t gpa, std::uint64_t len) { return ram_->host(gpa, len); }
  std::uint64_t alloc(std::uint64_t len, std::uint64_t align = 4096) {
    auto a = ram_->alloc(len, align);
    BOOST_REQUIRE(a.ok());
    std::memset(ram_->host(*a, len), 0, len);
    return *a;
  }

  // Sends raw request bytes; returns (status, response body) or nullopt if no answer came.
  std::optional<std::pair<std::uint32_t, std::vector<std::uint8_t>>> raw(const void* req, std::size_t len,
                                                                        std::uint32_t rsp_len = 256) {
    std::memcpy(ram_->host(req_, len), req, len);
    std::memset(ram_->host(rsp_, rsp_len), 0xee, rsp_len);
    const DriverBuf b[2] = {{req_, static_cast<std::uint32_t>(len), false}, {rsp_, rsp_len, true}};
    auto id = qs_[0].add(b);
    if (!id) return std::nullopt;
    qs_[0].publish();
    (void)fe_->kick(0);
    for (int i = 0; i < 500; ++i) {
      if (auto u = qs_[0].get_used()) {
        if (u->len < sizeof(vd::RespHeader)) return std::pair{0xffffffffu, std::vector<std::uint8_t>{}};
        vd::RespHeader h;
        std::memcpy(&h, ram_->host(rsp_, sizeof h), sizeof h);
        const auto* p = ram_->host(rsp_ + sizeof h, u->len - sizeof h);
        return std::pair{h.status, std::vector<std::uint8_t>(p, p + (u->len - sizeof h))};
      }
      (void)fe_->wait_call(0, 10);
    }
    return std::nullopt;
  }
  template <class Req>
  std::pair<std::uint32_t, std::vector<std::uint8_t>> cmd(vd::Cmd c, const Req& r) {
    std::vector<std::uint8_t> b(sizeof(vd::CmdHeader) + sizeof r);
    vd::CmdHeader h{static_cast<std::uint32_t>(c), 0};
    std::memcpy(b.data(), &h, sizeof h);
    std::memcpy(b.data() + sizeof h, &r, sizeof r);
    auto out = raw(b.data(), b.size());
    BOOST_REQUIRE_MESSAGE(out.has_value(), "vrdmad did not answer " << vd::cmd_name(static_cast<std::uint32_t>(c)));
    return *out;
  }
  std::pair<std::uint32_t, std::vector<std::uint8_t>> cmd0(vd::Cmd c) {
    vd::CmdHeader h{static_cast<std::uint32_t>(c), 0};
    auto out = raw(&h, sizeof h);
    BOOST_REQUIRE(out.has_value());
    return *out;
  }
  template <class T>
  static T as(const std::vector<std::uint8_t>& v) {
    T t{};
    std::memcpy(&t, v.data(), std::min(v.size(), sizeof t));
    return t;
  }
  std::uint32_t create(vd::Cmd c, const auto& r) {
    auto [st, body] = cmd(c, r);
    BOOST_REQUIRE_EQUAL(st, 0u);
    return as<vd::HandleResp>(body).handle;
  }
  // A notification of `queue` with nothing new on it (how a process says it wrote into its
  // doorbell ring).
  void notify(std::uint16_t queue) { (void)fe_->kick(queue); }
  // Doorbells go out as one chain of records.
  void doorbells(std::span<const vd::Doorbell> dbs) {
    const auto gpa = alloc(dbs.size_bytes(), 16);
    std::memcpy(ram_->host(gpa, dbs.size_bytes()), dbs.data(), dbs.size_bytes());
    const DriverBuf b{gpa, static_cast<std::uint32_t>(dbs.size_bytes()), false};
    while (qs_[2].get_used()) {
    }
    BOOST_REQUIRE(qs_[2].add(std::span(&b, 1)).ok());
    qs_[2].publish();
    (void)fe_->kick(2);
    for (int i = 0; i < 200 && !qs_[2].get_used(); ++i) (void)fe_->wait_call(2, 10);
  }

 private:
  std::unique_ptr<Frontend> fe_;
  std::unique_ptr<GuestRam> ram_;
  std::vector<DriverQueue> qs_;
  std::uint64_t req_ = 0, rsp_ = 0;
};

// A CREATE_QP request with its rings and status block in fresh guest memory, one SGE each way.
inline vd::CreateQpReq qp_request(RawGuest& g, std::uint32_t pd, std::uint32_t cq, std::uint8_t type, std::uint32_t depth) {
  vd::CreateQpReq q{};
  q.pd = pd;
  q.send_cq = cq;
  q.recv_cq = cq;
  q.qp_type = type;
  q.sq_depth = depth;
  q.rq_depth = depth;
  q.max_send_sge = 1;
  q.max_recv_sge = 1;
  q.sq_gpa = g.alloc(depth * vd::send_stride(1, 0));
  q.rq_gpa = g.alloc(depth * vd::recv_stride(1));
  q.status_gpa = g.alloc(64);
  return q;
}

// QP `qp` (RC, in RESET) connected to itself through INIT, RTR and RTS on the device's GID 0.
inline void connect_to_itself(RawGuest& g, const vd::CreateQpResp& qp) {
  auto [gs, gbody] = g.cmd(vd::Cmd::query_gid, vd::QueryGidReq{0, 0});
  BOOST_REQUIRE_EQUAL(gs, 0u);
  const auto gid = RawGuest::as<vd::GidResp>(gbody);
  vd::ModifyQpReq m{};
  m.qp = qp.qp;
  m.mask = 1 | 8 | 16 | 32;  // INIT: state, access, pkey, port
  m.attr.qp_state = 1;
  m.attr.path_mtu = 3;  // every enum on the wire must be one, masked or not
  m.attr.port_num = 1;
  m.attr.qp_access_flags = 1 | 2 | 4;
  BOOST_REQUIRE_EQUAL(g.cmd(vd::Cmd::modify_qp, m).first, 0u);
  m.mask = 1 | 128 | 256 | 4096 | 32768 | 131072 | 1048576;  // RTR: av, mtu, rq_psn, rnr, dest rd, dest qpn
  m.attr.qp_state = 2;
  m.attr.rq_psn = 100;
  m.attr.min_rnr_timer = 1;
  m.attr.max_dest_rd_atomic = 1;
  m.attr.dest_qp_num = qp.qp_num;
  std::memcpy(m.attr.ah.dgid, gid.gid, 16);
  m.attr.ah.hop_limit = 64;
  m.attr.ah.port_num = 1;
  BOOST_REQUIRE_EQUAL(g.cmd(vd::Cmd::modify_qp, m).first, 0u);
  m.mask = 1 | 512 | 1024 | 2048 | 8192 | 65536;  // RTS: timeout, retry, rnr retry, rd atomic, sq_psn
  m.attr.qp_state = 3;
  m.attr.timeout = 14;
  m.attr.retry_cnt = 7;
  m.attr.rnr_retry = 7;
  m.attr.max_rd_atomic = 1;
  m.attr.sq_psn = 100;
  BOOST_REQUIRE_EQUAL(g.cmd(vd::Cmd::modify_qp, m).first, 0u);
}

inline constexpr auto kOk = 0u;
inline constexpr auto kInval = static_cast<std::uint32_t>(vd::Status::invalid);
inline constexpr auto kFault = static_cast<std::uint32_t>(vd::Status::fault);
inline constexpr auto kNoent = static_cast<std::uint32_t>(vd::Status::not_found);
inline constexpr auto kPerm = static_cast<std::uint32_t>(vd::Status::perm);


}  // namespace vrdma::test
