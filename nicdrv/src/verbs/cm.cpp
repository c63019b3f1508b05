// Connection setup through librdmacm, synchronously, with the caller's own QP (librdmacm's
// "external QP" flow, rdma_cm(7)): rdma_init_qp_attr gives the attributes for each transition,
// which we apply to the QP. RoCE/IB: the client moves to RTR/RTS on CONNECT_RESPONSE and calls
// rdma_establish; the server moves to RTR before rdma_accept and to RTS on ESTABLISHED.
// iWARP: the kernel's iWARP CM moves the QP to RTS itself once MPA completes (RFC 5044), so
// only INIT is ours.
#include <arpa/inet.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "verbs_internal.hpp"
#include "vrdma/nicdrv/verbs.hpp"

namespace vrdma::nicdrv::verbs {
namespace {

struct Channel {
  rdma_event_channel* ch = nullptr;
  Channel() = default;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  ~Channel() {
    if (ch != nullptr) rdma_destroy_event_channel(ch);
  }
};

Result<std::unique_ptr<Channel>> make_channel() {
  auto c = std::make_unique<Channel>();
  c->ch = rdma_create_event_channel();
  if (c->ch == nullptr) {
    const int e = errno;
    return make_error(e == ENODEV || e == ENOENT || e == ENOSYS ? Errc::no_device : Errc::io_error,
                      "the RDMA connection manager is not available on this host (" + std::string(std::strerror(e)) +
                          "): load the kernel's rdma_ucm module and check /dev/infiniband/rdma_cm");
  }
  return c;
}

struct Event {
  rdma_cm_event_type type{};
  int status = 0;
  rdma_cm_id* id = nullptr;
};

// Waits for the next CM event on `ch`, copies what we need and acknowledges it.
Result<Event> next_event(rdma_event_channel* ch, std::chrono::milliseconds timeout, const std::string& what) {
  pollfd p{ch->fd, POLLIN, 0};
  const int r = ::poll(&p, 1, static_cast<int>(timeout.count()));
  if (r < 0) return errno_error(errno, what + ": waiting for a CM event");
  if (r == 0) return make_error(Errc::timeout, what + ": no answer from the peer's connection manager within " +
                                                  std::to_string(timeout.count()) + " ms");
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(ch, &ev) != 0) return errno_error(errno, what + ": reading a CM event");
  Event out{ev->event, ev->status, ev->id};
  rdma_ack_cm_event(ev);
  return out;
}

Status expect(const Result<Event>& ev, rdma_cm_event_type want, const std::string& what) {
  if (!ev) return ev.error();
  if (ev->type != want)
    return make_error(ev->type == RDMA_CM_EVENT_REJECTED ? Errc::connection_lost : Errc::protocol_error,
                      what + ": the connection manager reported " + rdma_event_str(ev->type) + " (status " +
                          std::to_string(ev->status) + ") instead of " + rdma_event_str(want));
  return {};
}

Result<sockaddr_storage> parse_addr(std::string_view ip, std::uint16_t port) {
  sockaddr_storage ss{};
  const std::string s(ip);
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (s.empty()) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
  } else if (::inet_pton(AF_INET, s.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
  } else if (::inet_pton(AF_INET6, s.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
  } else {
    return make_error(Errc::invalid_argument, "'" + s + "' is not an IPv4 or IPv6 address");
  }
  return ss;
}

class Connection final : public CmConnection {
 public:
  Connection(std::unique_ptr<Channel> ch, rdma_cm_id* id, CmParams p, bool server)
      : ch_(std::move(ch)), id_(id), params_(p), server_(server) {
    name_ = "verbs:" + std::string(id_->verbs != nullptr ? ibv_get_device_name(id_->verbs->device) : "?");
  }
  ~Connection() override {
    if (connected_) (void)disconnect();
    rdma_destroy_id(id_);
  }
  const std::string& device_name() const noexcept override { return name_; }

  Status connect(QueuePair& qp, const CmParams& p) override {
    if (server_) return make_error(Errc::bad_state, "connect: this is an incoming request; accept() or reject() it");
    params_ = p;
    auto* q = dynamic_cast<VerbsQp*>(&qp);
    VRDMA_TRY(to_init(q));
    rdma_conn_param cp = conn_param(*q);
    if (rdma_connect(id_, &cp) != 0) return errno_error(errno, "connect to " + peer() + " through " + name_);
    auto ev = next_event(ch_->ch, params_.timeout, "connect to " + peer());
    if (!ev) return ev.error();
    if (ev->type == RDMA_CM_EVENT_ESTABLISHED && iwarp()) {
      q->note_state(QpState::rts);  // the kernel's iWARP CM moved it after MPA
      connected_ = true;
      return {};
    }
    VRDMA_TRY(expect(ev, RDMA_CM_EVENT_CONNECT_RESPONSE, "connect to " + peer()));
    VRDMA_TRY(step(*q, IBV_QPS_RTR));
    VRDMA_TRY(step(*q, IBV_QPS_RTS));
    if (rdma_establish(id_) != 0) return errno_error(errno, "connect to " + peer() + ": sending the ready-to-use message");
    connected_ = true;
    return {};
  }

  Status accept(QueuePair& qp, const CmParams& p) override {
    if (!server_) return make_error(Errc::bad_state, "accept: this is an outgoing connection; use connect()");
    params_ = p;
    auto* q = dynamic_cast<VerbsQp*>(&qp);
    VRDMA_TRY(to_init(q));
    if (!iwarp()) VRDMA_TRY(step(*q, IBV_QPS_RTR));
    rdma_conn_param cp = conn_param(*q);
    if (rdma_accept(id_, &cp) != 0) return errno_error(errno, "accept from " + peer());
    VRDMA_TRY(expect(next_event(ch_->ch, params_.timeout, "accept from " + peer()), RDMA_CM_EVENT_ESTABLISHED,
                     "accept from " + peer()));
    if (!iwarp()) VRDMA_TRY(step(*q, IBV_QPS_RTS));
    else q->note_state(QpState::rts);
    connected_ = true;
    return {};
  }

  Status reject() override {
    if (!server_) return make_error(Errc::bad_state, "reject: this is an outgoing connection");
    if (rdma_reject(id_, nullptr, 0) != 0) return errno_error(errno, "reject the request from " + peer());
    return {};
  }

  Status disconnect() override {
    if (!connected_) return {};
    connected_ = false;
    if (rdma_disconnect(id_) != 0) return errno_error(errno, "disconnect from " + peer());
    return {};
  }

 private:
  bool iwarp() const { return id_->verbs->device->transport_type == IBV_TRANSPORT_IWARP; }

  std::string peer() const {
    char buf[INET6_ADDRSTRLEN] = "?";
    const sockaddr* sa = rdma_get_peer_addr(id_);
    if (sa->sa_family == AF_INET)
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
    else if (sa->sa_family == AF_INET6)
      ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(ntohs(rdma_get_dst_port(id_)));
  }

  Status to_init(VerbsQp* q) {
    if (q == nullptr) return make_error(Errc::invalid_argument, "the QP is not a verbs QP; create it on " + name_);
    if (q->dev().ibdev() != ibv_get_device_name(id_->verbs->device))
      return make_error(Errc::invalid_argument, "the route to " + peer() + " uses " + name_ + ", but " + q->what() +
                                                    "; create the QP on " + name_);
    if (q->type() != QpType::rc) return make_error(Errc::invalid_argument, "the connection manager connects RC QPs only");
    if (q->state() != QpState::reset) return make_error(Errc::bad_state, q->what() + " must be in RESET to be connected");
    return step(*q, IBV_QPS_INIT);
  }

  Status step(VerbsQp& q, ibv_qp_state s) {
    ibv_qp_attr a{};
    int mask = 0;
    a.qp_state = s;
    if (rdma_init_qp_attr(id_, &a, &mask) != 0)
      return errno_error(errno, q.what() + ": the connection manager has no attributes for state " + std::to_string(s));
    if (s == IBV_QPS_RTR) a.max_dest_rd_atomic = params_.responder_resources;
    if (s == IBV_QPS_RTS) a.max_rd_atomic = params_.initiator_depth;
    return q.modify_raw(a, mask, s == IBV_QPS_INIT ? "CM INIT" : s == IBV_QPS_RTR ? "CM RTR" : "CM RTS");
  }

  rdma_conn_param conn_param(const VerbsQp& q) const {
    rdma_conn_param cp{};
    cp.responder_resources = params_.responder_resources;
    cp.initiator_depth = params_.initiator_depth;
    cp.retry_count = params_.retry_count;
    cp.rnr_retry_count = params_.rnr_retry_count;
    cp.qp_num = q.qp_num();
    return cp;
  }

  std::unique_ptr<Channel> ch_;
  rdma_cm_id* id_;
  CmParams params_;
  bool server_;
  bool connected_ = false;
  std::string name_;
};

class Listener final : public CmListener {
 public:
  Listener(std::unique_ptr<Channel> ch, rdma_cm_id* id) : ch_(std::move(ch)), id_(id) {}
  ~Listener() override { rdma_destroy_id(id_); }
  std::uint16_t port() const noexcept override { return ntohs(rdma_get_src_port(id_)); }

  Result<std::unique_ptr<CmConnection>> get_request(std::chrono::milliseconds timeout) override {
    const std::string what = "waiting for a connection on port " + std::to_string(port());
    auto ev = next_event(ch_->ch, timeout, what);
    VRDMA_TRY(expect(ev, RDMA_CM_EVENT_CONNECT_REQUEST, what));
    // Each connection gets its own channel, so its events never mix with new requests.
    auto ch = make_channel();
    if (!ch) {
      rdma_destroy_id(ev->id);
      return std::move(ch).error();
    }
    if (rdma_migrate_id(ev->id, (*ch)->ch) != 0) {
      const int e = errno;
      rdma_destroy_id(ev->id);
      return errno_error(e, what + ": moving the request to its own event channel");
    }
    return std::unique_ptr<CmConnection>(std::make_unique<Connection>(std::move(*ch), ev->id, CmParams{}, true));
  }

 private:
  std::unique_ptr<Channel> ch_;
  rdma_cm_id* id_;
};

}  // namespace

Result<std::unique_ptr<CmConnection>> cm_resolve(std::string_view dst_ip, std::uint16_t port, std::string_view src_ip,
                                                 const CmParams& params) {
  auto dst = parse_addr(dst_ip, port);
  if (!dst) return std::move(dst).error();
  std::optional<sockaddr_storage> src;
  if (!src_ip.empty()) {
    auto s = parse_addr(src_ip, 0);
    if (!s) return std::move(s).error();
    src = *s;
  }
  auto ch = make_channel();
  if (!ch) return std::move(ch).error();
  rdma_cm_id* id = nullptr;
  if (rdma_create_id((*ch)->ch, &id, nullptr, RDMA_PS_TCP) != 0) return errno_error(errno, "create an RDMA CM id");
  const std::string what = "resolve " + std::string(dst_ip) + ":" + std::to_string(port);
  auto fail = [&](Error e) -> Result<std::unique_ptr<CmConnection>> {
    rdma_destroy_id(id);
    return e;
  };
  const int ms = static_cast<int>(params.timeout.count());
  if (rdma_resolve_addr(id, src ? reinterpret_cast<sockaddr*>(&*src) : nullptr, reinterpret_cast<sockaddr*>(&*dst), ms) != 0)
    return fail(errno_error(errno, what));
  if (auto st = expect(next_event((*ch)->ch, params.timeout, what), RDMA_CM_EVENT_ADDR_RESOLVED,
                       what + " (no RDMA device has a route to that address?)");
      !st)
    return fail(std::move(st).error());
  if (rdma_resolve_route(id, ms) != 0) return fail(errno_error(errno, what + ": route"));
  if (auto st = expect(next_event((*ch)->ch, params.timeout, what), RDMA_CM_EVENT_ROUTE_RESOLVED, what + ": route"); !st)
    return fail(std::move(st).error());
  return std::unique_ptr<CmConnection>(std::make_unique<Connection>(std::move(*ch), id, params, false));
}

Result<std::unique_ptr<CmListener>> cm_listen(std::string_view ip, std::uint16_t port, int backlog) {
  auto addr = parse_addr(ip, port);
  if (!addr) return std::move(addr).error();
  auto ch = make_channel();
  if (!ch) return std::move(ch).error();
  rdma_cm_id* id = nullptr;
  if (rdma_create_id((*ch)->ch, &id, nullptr, RDMA_PS_TCP) != 0) return errno_error(errno, "create an RDMA CM id");
  const std::string what = "listen on " + std::string(ip.empty() ? "*" : ip) + ":" + std::to_string(port);
  if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&*addr)) != 0 || rdma_listen(id, backlog) != 0) {
    const int e = errno;
    rdma_destroy_id(id);
    return errno_error(e, what + " (is the address on an RDMA-capable interface?)");
  }
  return std::unique_ptr<CmListener>(std::make_unique<Listener>(std::move(*ch), id));
}

}  // namespace vrdma::nicdrv::verbs
