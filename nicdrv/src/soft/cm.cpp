// The connection API (cm.hpp) on a soft device: the caller's RC QP moved through INIT, RTR and
// RTS by what the REQ and REP carry (IBA 12.7: QPN, starting PSN, responder resources and
// initiator depth, path MTU, retry counts, ACK timeout), and the exchange run by the device's
// CM agent on QP1 (gsi.hpp). API threads wait on the agent's condition variable with the device
// lock; the engine thread moves the state machines.
#include <arpa/inet.h>

#include <algorithm>
#include <mutex>

#include "soft/engine.hpp"
#include "soft/gsi.hpp"
#include "vrdma/nicdrv/soft.hpp"

namespace vrdma::nicdrv::soft {
namespace {

using namespace std::chrono_literals;

std::string ip_str(std::uint32_t ip_be) {
  char b[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &ip_be, b, sizeof b);
  return b;
}

// Waits (device lock held in `lk`) until `done()` or `timeout`; false on timeout.
template <class F>
bool wait_for(GsiAgent& g, std::unique_lock<std::mutex>& lk, std::chrono::milliseconds timeout, F&& done) {
  return g.cv.wait_for(lk, timeout, std::forward<F>(done));
}

class SoftCmConnection final : public CmConnection {
 public:
  SoftCmConnection(std::shared_ptr<SoftDevice> dev, std::uint32_t peer_ip_be, std::uint16_t port, CmParams p,
                   std::uint32_t local_id)
      : dev_(std::move(dev)), peer_(peer_ip_be), port_(port), params_(std::move(p)), id_(local_id) {}

  ~SoftCmConnection() override {
    std::unique_lock lk(dev_->mu_);
    GsiAgent& g = *dev_->gsi;
    GsiAgent::Entry* e = id_ != 0 ? g.find(id_) : nullptr;
    if (e == nullptr) return;
    const auto s = e->conn.state();
    if (s == cm::State::req_rcvd || s == cm::State::mra_sent || s == cm::State::rep_rcvd || s == cm::State::req_sent ||
        s == cm::State::mra_rcvd)
      g.apply(*e, e->conn.reject(mad::RejReason::consumer, "the application dropped the connection"));
    else if (s == cm::State::established || s == cm::State::rep_sent)
      start_disconnect(g, *e);
    e->app_owned = false;  // the agent reaps it once closed (after timewait)
  }

  const std::string& device_name() const noexcept override { return dev_->name(); }

  Status connect(QueuePair& qp_in, const CmParams& p) override {
    params_ = p;
    if (passive_) return make_error(Errc::bad_state, "connect: this is an incoming request; accept() or reject() it");
    if (id_ != 0) return make_error(Errc::bad_state, "connect: this connection was already used; resolve again");
    auto* qp = check_qp(qp_in, "connect");
    if (qp == nullptr) return last_;
    if (params_.private_data.size() > sizeof(mad::Req{}.private_data) - mad::kCmaHdrLen)
      return make_error(Errc::invalid_argument, "connect: at most 56 bytes of private data fit in a REQ after the RDMA-CM header");
    VRDMA_TRY(to_init(*qp));
    std::unique_lock lk(dev_->mu_);
    GsiAgent& g = *dev_->gsi;
    mad::Req req;
    id_ = g.new_local_id();
    req.local_comm_id = id_;
    req.service_id = rdma_cm_service_id(kRdmaPsTcp, port_);
    req.local_ca_guid = dev_->node_guid();
    req.local_qpn = qp->qp_num();
    req.responder_resources = std::min<std::uint8_t>(params_.responder_resources, 16);
    req.initiator_depth = std::min<std::uint8_t>(params_.initiator_depth, 16);
    req.remote_cm_response_timeout = std::min<std::uint8_t>(params_.cm_response_timeout, 31);
    req.transport_service_type = 0;  // RC
    req.end_to_end_flow_control = true;
    req.starting_psn = g.random_psn();
    req.local_cm_response_timeout = req.remote_cm_response_timeout;
    req.retry_count = std::min<std::uint8_t>(params_.retry_count, 7);
    req.pkey = wire::kDefaultPkey;
    req.path_mtu = static_cast<std::uint8_t>(dev_->active_mtu());
    req.rnr_retry_count = std::min<std::uint8_t>(params_.rnr_retry_count, 7);
    req.max_cm_retries = std::min<std::uint8_t>(params_.max_cm_retries, 15);
    req.srq = qp->srq != nullptr;
    // RoCE has no LIDs: the permissive LID, as the kernel's CM sends over routed paths.
    req.primary_local_lid = req.primary_remote_lid = 0xffff;
    req.primary_local_gid = Gid::from_ipv4(dev_->ip_be()).raw;
    req.primary_remote_gid = Gid::from_ipv4(peer_).raw;
    req.primary_packet_rate = 3;  // 10 Gb/s (IBA table 223); informational on RoCE
    req.primary_hop_limit = 64;
    req.primary_local_ack_timeout = std::min<std::uint8_t>(params_.local_ack_timeout, 31);
    mad::CmaHeader cma;
    cma.src_port = src_port_ = static_cast<std::uint16_t>(0xc000 | (g.new_local_id() & 0x3fff));
    cma.src_ip_be = dev_->ip_be();
    cma.dst_ip_be = peer_;
    mad::encode_cma(cma, req.private_data);
    std::copy(params_.private_data.begin(), params_.private_data.end(), req.private_data.begin() + mad::kCmaHdrLen);
    auto& e = g.conns[id_];
    e.conn = cm::Conn::active(req, cm::Clock::now());
    e.peer_ip_be = peer_;
    e.tid = g.new_tid();
    e.app_owned = true;
    g.send(peer_, e.tid, req);
    dev_->kick();
    const std::string what = "connect to " + peer() + " from " + dev_->name();
    if (!wait_for(g, lk, params_.timeout, [&] {
          auto s = g.find(id_)->conn.state();
          return s == cm::State::rep_rcvd || s == cm::State::closed;
        })) {
      GsiAgent::Entry& en = *g.find(id_);
      g.apply(en, en.conn.reject(mad::RejReason::timeout, "no reply"));
      return make_error(Errc::timeout, what + ": the peer's connection manager did not reply within " +
                                           std::to_string(params_.timeout.count()) + " ms (" +
                                           std::to_string(en.conn.resends()) + " REQs resent)");
    }
    GsiAgent::Entry& en = *g.find(id_);
    if (en.conn.state() == cm::State::closed) return failed(en, what);
    const mad::Rep rep = en.conn.rep();
    lk.unlock();
    // RTR then RTS with the REP's values (IBA 12.7.2, the kernel's cm_init_qp_rtr/rts_attr).
    // Each side's Starting PSN is the one it expects to receive: we send from the REP's.
    Path path;
    path.mtu = static_cast<Mtu>(req.path_mtu);
    path.dest_qpn = rep.local_qpn;
    path.rq_psn = req.starting_psn;
    path.sq_psn = rep.starting_psn;
    path.responder = std::max<std::uint8_t>(req.responder_resources, 1);
    path.initiator = std::max<std::uint8_t>(std::min(req.initiator_depth, rep.responder_resources), 1);
    path.timeout = req.primary_local_ack_timeout;
    path.retry_cnt = req.retry_count;
    path.rnr_retry = rep.rnr_retry_count;
    Status st = to_rts(*qp, path);
    lk.lock();
    GsiAgent::Entry* ep = g.find(id_);
    if (ep == nullptr) return make_error(Errc::connection_lost, what + ": the connection vanished");
    if (!st) {
      g.apply(*ep, ep->conn.reject(mad::RejReason::consumer, st.error().message));
      return make_error(st.error().code == make_error_code(Errc::invalid_argument) ? Errc::invalid_argument : Errc::io_error,
                        what + ": " + st.error().message);
    }
    if (ep->conn.state() != cm::State::rep_rcvd) return failed(*ep, what);
    g.apply(*ep, ep->conn.ready_to_use());
    return {};
  }

  Status accept(QueuePair& qp_in, const CmParams& p) override {
    params_ = p;
    if (!passive_) return make_error(Errc::bad_state, "accept: this is an outgoing connection; use connect()");
    auto* qp = check_qp(qp_in, "accept");
    if (qp == nullptr) return last_;
    if (params_.private_data.size() > sizeof(mad::Rep{}.private_data))
      return make_error(Errc::invalid_argument, "accept: at most 196 bytes of private data fit in a REP");
    std::unique_lock lk(dev_->mu_);
    GsiAgent& g = *dev_->gsi;
    GsiAgent::Entry* e = g.find(id_);
    const std::string what = "accept from " + peer() + " on " + dev_->name();
    if (e == nullptr) return make_error(Errc::connection_lost, what + ": the request is gone");
    if (e->conn.state() != cm::State::req_rcvd && e->conn.state() != cm::State::mra_sent)
      return failed(*e, what);
    const mad::Req req = e->conn.req();
    lk.unlock();
    // The passive side takes the path from the REQ (IBA 12.7.1): the initiator sends packets of
    // its path MTU, so one above what our port runs cannot be taken (REJ "invalid MTU").
    if (req.path_mtu < 1 || req.path_mtu > static_cast<std::uint8_t>(dev_->active_mtu())) {
      lk.lock();
      if ((e = g.find(id_)) != nullptr)
        g.apply(*e, e->conn.reject(mad::RejReason::invalid_mtu, "path MTU too large"));
      return make_error(Errc::invalid_argument,
                        what + ": the initiator's path MTU (enum " + std::to_string(req.path_mtu) + ") is above " +
                            dev_->name() + "'s active MTU " + std::to_string(mtu_bytes(dev_->active_mtu())) +
                            "; rejected (raise the interface MTU or the device's mtu= cap)");
    }
    VRDMA_TRY(to_init(*qp));
    const auto mtu = static_cast<Mtu>(req.path_mtu);
    const std::uint8_t responder = std::max<std::uint8_t>(std::min<std::uint8_t>(params_.responder_resources, 16), 1);
    const std::uint8_t initiator = std::max<std::uint8_t>(std::min<std::uint8_t>({params_.initiator_depth, req.responder_resources, 16}), 1);
    std::uint32_t psn = 0;  // what we expect to receive: the REP's Starting PSN
    {
      std::lock_guard lk2(dev_->mu_);
      psn = g.random_psn();
    }
    // RTS before the REP, as librdmacm's rdma_accept does: the initiator may send as soon as it
    // has our REP. Its retry counts come from its REQ; it expects its sq_psn (cm.c).
    Path path;
    path.mtu = mtu;
    path.dest_qpn = req.local_qpn;
    path.rq_psn = psn;
    path.sq_psn = req.starting_psn;
    path.responder = responder;
    path.initiator = initiator;
    path.timeout = std::max<std::uint8_t>(req.primary_local_ack_timeout, params_.local_ack_timeout);
    path.retry_cnt = req.retry_count;
    path.rnr_retry = req.rnr_retry_count;
    Status st = to_rts(*qp, path);
    lk.lock();
    e = g.find(id_);
    if (e == nullptr) return make_error(Errc::connection_lost, what + ": the request is gone");
    if (!st) {
      g.apply(*e, e->conn.reject(mad::RejReason::consumer, st.error().message));
      return make_error(Errc::invalid_argument, what + ": " + st.error().message);
    }
    mad::Rep rep;
    rep.local_qpn = qp->qp_num();
    rep.starting_psn = psn;
    rep.responder_resources = responder;
    rep.initiator_depth = initiator;
    rep.target_ack_delay = 0;
    rep.failover_accepted = 0;
    rep.end_to_end_flow_control = true;
    rep.rnr_retry_count = std::min<std::uint8_t>(params_.rnr_retry_count, 7);
    rep.srq = qp->srq != nullptr;
    std::copy(params_.private_data.begin(), params_.private_data.end(), rep.private_data.begin());
    qp->cm_wait_rtu = true;
    g.apply(*e, e->conn.accept(rep, cm::Clock::now()));
    dev_->kick();
    if (!wait_for(g, lk, params_.timeout, [&] {
          auto s = g.find(id_)->conn.state();
          return s == cm::State::established || s == cm::State::closed || s == cm::State::timewait;
        }))
      return make_error(Errc::timeout, what + ": no ready-to-use (RTU) message and no traffic within " +
                                           std::to_string(params_.timeout.count()) + " ms");
    e = g.find(id_);
    if (e->conn.state() == cm::State::closed && !e->conn.was_established()) return failed(*e, what);
    return {};
  }

  Status reject() override {
    if (!passive_) return make_error(Errc::bad_state, "reject: this is an outgoing connection");
    std::lock_guard lk(dev_->mu_);
    GsiAgent::Entry* e = dev_->gsi->find(id_);
    if (e == nullptr) return make_error(Errc::connection_lost, "reject: the request from " + peer() + " is gone");
    dev_->gsi->apply(*e, e->conn.reject(mad::RejReason::consumer, "rejected by us"));
    return {};
  }

  Status disconnect() override {
    std::unique_lock lk(dev_->mu_);
    GsiAgent& g = *dev_->gsi;
    GsiAgent::Entry* e = id_ != 0 ? g.find(id_) : nullptr;
    if (e == nullptr) return {};
    const auto s = e->conn.state();
    if (s != cm::State::established && s != cm::State::rep_sent && s != cm::State::rep_rcvd) return {};
    start_disconnect(g, *e);
    // DREP (or the DREQ's resends running out) ends in timewait; don't wait longer than asked.
    wait_for(g, lk, params_.timeout, [&] {
      auto st = g.find(id_)->conn.state();
      return st == cm::State::timewait || st == cm::State::closed;
    });
    return {};
  }

  // Listener side.
  void make_passive(std::uint32_t id) {
    passive_ = true;
    id_ = id;
  }

 private:
  std::string peer() const { return ip_str(peer_) + ":" + std::to_string(port_); }

  // Our side of rdma_disconnect: QP to ERR (its work flushes), then DREQ.
  void start_disconnect(GsiAgent& g, GsiAgent::Entry& e) {
    auto it = dev_->qps.find(e.conn.local_qpn());
    if (it != dev_->qps.end() && it->second != nullptr && it->second->state() != QpState::reset &&
        it->second->state() != QpState::err) {
      it->second->set_state(QpState::err);
      dev_->move_to_error(*it->second);
      dev_->mark_active(*it->second);
    }
    g.apply(e, e.conn.disconnect(cm::Clock::now()));
    dev_->kick();
  }

  Status failed(const GsiAgent::Entry& e, const std::string& what) {
    const auto r = e.conn.rej_reason();
    const std::string why = e.conn.failure().empty() ? "the connection is " + std::string(to_string(e.conn.state()))
                                                     : e.conn.failure();
    return make_error(r && *r == mad::RejReason::timeout ? Errc::timeout : Errc::connection_lost, what + ": " + why);
  }

  SoftQp* check_qp(QueuePair& q, const char* op) {
    auto* qp = dynamic_cast<SoftQp*>(&q);
    const std::string w = std::string(op) + " (" + peer() + "): ";
    if (qp == nullptr || &qp->dev != dev_.get()) {
      last_ = make_error(Errc::invalid_argument, w + "the QP is not a QP of " + dev_->name() + "; create it there");
      return nullptr;
    }
    if (qp->type() != QpType::rc) {
      last_ = make_error(Errc::invalid_argument, w + "the connection manager connects RC QPs only");
      return nullptr;
    }
    if (qp->state() != QpState::reset && qp->state() != QpState::init) {
      last_ = make_error(Errc::bad_state, w + "QP " + std::to_string(qp->qp_num()) + " is in " +
                                              std::string(to_string(qp->state())) + "; it must be in RESET or INIT");
      return nullptr;
    }
    return qp;
  }

  // What the CM exchange settled for one side's QP (IBA 12.7: the REQ's and REP's fields).
  struct Path {
    Mtu mtu = Mtu::mtu1024;
    std::uint32_t dest_qpn = 0, rq_psn = 0, sq_psn = 0;
    std::uint8_t responder = 1, initiator = 1;  // max_dest_rd_atomic, max_rd_atomic
    std::uint8_t timeout = 0, retry_cnt = 0, rnr_retry = 0;
  };

  // INIT -> RTR -> RTS toward the peer along `p`.
  Status to_rts(SoftQp& qp, const Path& p) {
    QpAttr a;
    a.qp_state = QpState::rtr;
    a.path_mtu = p.mtu;
    a.dest_qp_num = p.dest_qpn;
    a.rq_psn = p.rq_psn;
    a.max_dest_rd_atomic = p.responder;
    a.min_rnr_timer = 12;
    a.ah_attr.dgid = Gid::from_ipv4(peer_);
    using M = QpAttrMask;
    VRDMA_TRY(qp.modify(a, M::state | M::av | M::path_mtu | M::dest_qpn | M::rq_psn | M::max_dest_rd_atomic | M::min_rnr_timer));
    a.qp_state = QpState::rts;
    a.sq_psn = p.sq_psn;
    a.timeout = p.timeout;
    a.retry_cnt = p.retry_cnt;
    a.rnr_retry = p.rnr_retry;
    a.max_rd_atomic = p.initiator;
    return qp.modify(a, M::state | M::sq_psn | M::timeout | M::retry_cnt | M::rnr_retry | M::max_qp_rd_atomic);
  }

  Status to_init(SoftQp& qp) {
    QpAttr a;
    a.qp_state = QpState::init;
    // Remote write always; remote read and atomics when we take READs (cm_init_qp_init_attr).
    a.qp_access_flags = Access::local_write | Access::remote_write;
    if (params_.responder_resources > 0) a.qp_access_flags = a.qp_access_flags | Access::remote_read | Access::remote_atomic;
    using M = QpAttrMask;
    if (qp.state() == QpState::init) return qp.modify(a, M::state | M::access_flags);
    return qp.modify(a, M::state | M::pkey_index | M::port | M::access_flags);
  }

  std::shared_ptr<SoftDevice> dev_;
  std::uint32_t peer_;
  std::uint16_t port_;
  std::uint16_t src_port_ = 0;
  CmParams params_;
  std::uint32_t id_ = 0;
  bool passive_ = false;
  Error last_;
};

class SoftCmListener final : public CmListener {
 public:
  SoftCmListener(std::shared_ptr<SoftDevice> dev, std::uint16_t port) : dev_(std::move(dev)), port_(port) {}
  ~SoftCmListener() override {
    std::lock_guard lk(dev_->mu_);
    GsiAgent& g = *dev_->gsi;
    auto it = g.listeners.find(sid());
    if (it == g.listeners.end()) return;
    for (std::uint32_t id : it->second.pending)
      if (GsiAgent::Entry* e = g.find(id)) g.apply(*e, e->conn.reject(mad::RejReason::consumer, "the listener closed"));
    g.listeners.erase(it);
  }
  std::uint16_t port() const noexcept override { return port_; }

  Result<std::unique_ptr<CmConnection>> get_request(std::chrono::milliseconds timeout) override {
    std::unique_lock lk(dev_->mu_);
    GsiAgent& g = *dev_->gsi;
    auto& l = g.listeners.at(sid());
    for (;;) {
      if (!wait_for(g, lk, timeout, [&] { return !l.pending.empty(); }))
        return make_error(Errc::timeout, "no connection request on " + dev_->name() + " port " + std::to_string(port_) +
                                             " within " + std::to_string(timeout.count()) + " ms");
      const std::uint32_t id = l.pending.front();
      l.pending.pop_front();
      GsiAgent::Entry* e = g.find(id);
      if (e == nullptr || e->conn.state() == cm::State::closed) continue;  // the peer gave up meanwhile
      e->app_owned = true;
      auto c = std::make_unique<SoftCmConnection>(dev_, e->peer_ip_be, port_, CmParams{}, id);
      c->make_passive(id);
      return std::unique_ptr<CmConnection>(std::move(c));
    }
  }

 private:
  std::uint64_t sid() const { return rdma_cm_service_id(kRdmaPsTcp, port_); }
  std::shared_ptr<SoftDevice> dev_;
  std::uint16_t port_;
};

std::shared_ptr<SoftDevice> as_soft(const std::shared_ptr<Device>& dev) {
  return std::dynamic_pointer_cast<SoftDevice>(dev);
}

}  // namespace

Result<std::unique_ptr<CmConnection>> cm_resolve(const std::shared_ptr<Device>& dev, std::string_view dst_ip,
                                                 std::uint16_t port, const CmParams& params) {
  auto d = as_soft(dev);
  if (!d) return make_error(Errc::invalid_argument, "cm_resolve: " + (dev ? dev->name() : std::string("(null)")) + " is not a soft device");
  in_addr a{};
  if (::inet_pton(AF_INET, std::string(dst_ip).c_str(), &a) != 1)
    return make_error(Errc::invalid_argument, "cm_resolve: '" + std::string(dst_ip) + "' is not an IPv4 address (soft devices speak RoCEv2 over IPv4)");
  if (port == 0) return make_error(Errc::invalid_argument, "cm_resolve: port 0 names no service");
  if (a.s_addr == d->ip_be())
    return make_error(Errc::invalid_argument, "cm_resolve: " + std::string(dst_ip) + " is " + d->name() +
                                                  "'s own address; connect to another device");
  // RoCE needs no path query: the kernel's IP route and neighbour table carry the packets.
  return std::unique_ptr<CmConnection>(std::make_unique<SoftCmConnection>(d, a.s_addr, port, params, 0));
}

Result<std::unique_ptr<CmListener>> cm_listen(const std::shared_ptr<Device>& dev, std::uint16_t port, int backlog) {
  auto d = as_soft(dev);
  if (!d) return make_error(Errc::invalid_argument, "cm_listen: " + (dev ? dev->name() : std::string("(null)")) + " is not a soft device");
  std::lock_guard lk(d->mu_);
  GsiAgent& g = *d->gsi;
  if (port == 0) {  // any free port, from the range librdmacm's kernel side uses for binds
    for (std::uint16_t p = 32768; p != 0 && port == 0; ++p)
      if (g.listeners.count(rdma_cm_service_id(kRdmaPsTcp, p)) == 0) port = p;
  }
  const std::uint64_t sid = rdma_cm_service_id(kRdmaPsTcp, port);
  if (g.listeners.count(sid) != 0)
    return make_error(Errc::busy, "cm_listen: " + d->name() + " already listens on port " + std::to_string(port));
  g.listeners[sid].backlog = static_cast<std::size_t>(std::clamp(backlog, 1, 1024));
  return std::unique_ptr<CmListener>(std::make_unique<SoftCmListener>(d, port));
}

}  // namespace vrdma::nicdrv::soft
