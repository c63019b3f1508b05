// Two soft engines on loopback (127.0.0.1 and 127.0.0.2, a test-private UDP port), connected,
// and the small helpers the soft engine's integration tests share (soft_rc_test,
// soft_fastreg_test).
#pragma once

#include <unistd.h>

#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "check.hpp"
#include "rdma_pair.hpp"
#include "vrdma/nicdrv/soft.hpp"

namespace vrdma::test::soft_pair {

using namespace vrdma::nicdrv;

inline std::vector<std::weak_ptr<Device>> g_devs;  // for diagnostics when a test times out
inline std::string port_opt() { return "?port=" + std::to_string(20000 + getpid() % 20000); }

struct Pair {
  Endpoint a, b;
  PairOptions o;
  // `opts_a`/`opts_b`: more device options for each side ("&rx=udp", "&gso=0").
  explicit Pair(PairOptions opts = {}, const std::string& opts_a = "", const std::string& opts_b = "")
      : Pair(opts, opts, opts_a, opts_b) {}
  // Sides set up apart: B's QP (its path MTU, its queues) from `ob`; the PSNs from `oa`.
  Pair(PairOptions oa, const PairOptions& ob, const std::string& opts_a, const std::string& opts_b) : o(oa) {
    auto da = open_device("soft:127.0.0.1" + port_opt() + opts_a);
    VRDMA_REQUIRE_OK(da);
    auto db = open_device("soft:127.0.0.2" + port_opt() + opts_b);
    VRDMA_REQUIRE_OK(db);
    auto ea = test::make_endpoint(*da, o);
    VRDMA_REQUIRE_OK(ea);
    auto eb = test::make_endpoint(*db, ob);
    VRDMA_REQUIRE_OK(eb);
    a = std::move(*ea);
    b = std::move(*eb);
    g_devs = {a.dev, b.dev};
    VRDMA_REQUIRE_OK(test::connect_to(a, test::PeerInfo{b.qp->qp_num(), b.gid, o.psn_b}, o.psn_a, o));
    VRDMA_REQUIRE_OK(test::connect_to(b, test::PeerInfo{a.qp->qp_num(), a.gid, o.psn_a}, o.psn_b, ob));
  }
  Sge sge(Endpoint& e, std::size_t off, std::size_t len) {
    return Sge{reinterpret_cast<std::uint64_t>(e.buf.data() + off), static_cast<std::uint32_t>(len), e.mr->lkey()};
  }
};

inline SendWr wr_of(WrOpcode op, std::uint64_t id, const Sge* sge, std::size_t n) {
  SendWr w;
  w.wr_id = id;
  w.opcode = op;
  w.flags = SendFlags::signaled;
  w.sg_list = std::span<const Sge>(sge, n);
  return w;
}

inline void post_recv(Endpoint& e, std::uint64_t id, Sge s) {
  RecvWr r{id, std::span<const Sge>(&s, 1)};
  auto st = e.qp->post_recv(std::span<const RecvWr>(&r, 1));
  VRDMA_REQUIRE_OK(st);
}

inline void post_send(Endpoint& e, const SendWr& w) {
  auto st = e.qp->post_send(std::span<const SendWr>(&w, 1));
  VRDMA_REQUIRE_OK(st);
}

inline std::string stats_line(const Device& d) {
  auto s = soft::stats(d);
  if (!s) return "?";
  std::ostringstream o;
  o << d.name() << ": tx " << s->tx_packets << " rx " << s->rx_packets << " icrc-drop " << s->rx_dropped_icrc
    << " malformed " << s->rx_dropped_malformed << " longer-than-mtu " << s->rx_longer_than_mtu << " no-qp " << s->rx_dropped_no_qp << " retx " << s->retransmits
    << " timeouts " << s->timeouts << " rnr-sent " << s->rnr_naks_sent << " seq-nak-sent " << s->seq_naks_sent
    << " seq-nak-rcvd " << s->seq_naks_received << " dups " << s->duplicates_received << " acks " << s->acks_sent;
  return o.str();
}

inline WorkCompletion one(Endpoint& e) {
  auto wcs = test::wait_cq(*e.cq, 1);
  std::string diag;
  for (auto& w : g_devs)
    if (auto d = w.lock()) diag += stats_line(*d) + "; ";
  BOOST_REQUIRE_MESSAGE(wcs.size() == 1u, (wcs.empty() ? std::string("no completion within 20 s; ")
                                                         : std::to_string(wcs.size()) + " completions where one was awaited; ") +
                                               diag + " (this: " + e.dev->name() + ")");
  return wcs[0];
}

}  // namespace vrdma::test::soft_pair
