// QP1 of the soft engine and its CM agent (see gsi.hpp). Requests that name no listener, carry
// a transport other than RC, or do not address our GID are rejected with the IBA reason the
// kernel's CM uses for the same case; a DREQ for a connection we no longer know still gets a
// DREP, and a REP we never asked for a REJ (IBA 12.9.8, the kernel's cm.c does the same).
#include "soft/gsi.hpp"

#include "soft/engine.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/nicdrv/cm.hpp"

namespace vrdma::nicdrv::soft {

GsiAgent::GsiAgent(SoftDevice& dev) : dev_(dev), rng_(std::random_device{}()) {}

std::uint32_t GsiAgent::new_local_id() {
  for (;;) {
    auto id = static_cast<std::uint32_t>(rng_());
    if (id != 0 && conns.count(id) == 0) return id;
  }
}

GsiAgent::Entry* GsiAgent::find(std::uint32_t local_id) {
  auto it = conns.find(local_id);
  return it == conns.end() ? nullptr : &it->second;
}

void GsiAgent::send(std::uint32_t dst_ip_be, std::uint64_t tid, const mad::Message& m) {
  mad::Header h;
  h.tid = tid;
  const mad::MadBytes b = mad::encode(h, m);
  wire::Headers w;
  w.bth.opcode = wire::Opcode::ud_send_only;
  w.bth.dest_qp = mad::kGsiQpn;
  w.bth.pkey = wire::kDefaultPkey;
  w.bth.psn = psn_;
  psn_ = wire::psn_add(psn_, 1);
  w.deth.qkey = mad::kGsiQkey;
  w.deth.src_qp = mad::kGsiQpn;
  dev_.send_packet(dst_ip_be, w, b);
  dev_.tx_flush();
  ++stats.mads_sent;
}

void GsiAgent::qp_to_error(std::uint32_t qpn) {
  auto it = dev_.qps.find(qpn);
  if (it == dev_.qps.end() || it->second == nullptr) return;
  SoftQp& qp = *it->second;
  const QpState s = qp.state();
  if (s == QpState::reset || s == QpState::err) return;
  qp.set_state(QpState::err);
  dev_.move_to_error(qp);
  dev_.mark_active(qp);
}

void GsiAgent::apply(Entry& e, const cm::Reaction& r) {
  if (r.send) send(e.peer_ip_be, e.tid, *r.send);
  if (r.qp_to_error) qp_to_error(e.conn.local_qpn());
  if (r.changed || r.send) cv.notify_all();
}

void GsiAgent::reply_rej(std::uint32_t dst_ip_be, std::uint64_t tid, std::uint32_t their_id, std::uint8_t msg_rejected,
                         mad::RejReason reason) {
  mad::Rej r;
  r.local_comm_id = 0;
  r.remote_comm_id = their_id;
  r.message_rejected = msg_rejected;
  r.reason = static_cast<std::uint16_t>(reason);
  send(dst_ip_be, tid, r);
}

void GsiAgent::on_packet(const wire::Packet& pkt, std::uint32_t src_ip_be) {
  ++stats.mads_received;
  // IBA 13.5.1: GSI MADs are UD SEND ONLY with the GSI Q_Key and a full 256-byte MAD.
  const bool pkey_ok = wire::pkey_match(pkt.hdr.bth.pkey, dev_.pkey());
  if (pkt.hdr.bth.opcode != wire::Opcode::ud_send_only || pkt.hdr.deth.qkey != mad::kGsiQkey || !pkey_ok ||
      pkt.payload.size() != mad::kMadLen) {
    ++stats.mads_dropped;
    log::debug("soft {}: dropped a QP1 packet (opcode {:#x}, Q_Key {:#x}, {} bytes)", dev_.name(),
               static_cast<unsigned>(pkt.hdr.bth.opcode), pkt.hdr.deth.qkey, pkt.payload.size());
    return;
  }
  mad::Mad m;
  const auto err = mad::parse(pkt.payload, m);
  if (err == mad::ParseError::bad_class_version) {
    // A REQ of a CM class version we do not speak is refused so the peer need not time out.
    if (m.hdr.attr_id == static_cast<std::uint16_t>(mad::Attr::req)) {
      const std::span<const std::uint8_t> d = pkt.payload.subspan(mad::kHdrLen);
      const std::uint32_t their = static_cast<std::uint32_t>(d[0]) << 24 | static_cast<std::uint32_t>(d[1]) << 16 |
                                  static_cast<std::uint32_t>(d[2]) << 8 | d[3];
      reply_rej(src_ip_be, m.hdr.tid, their, 0, mad::RejReason::invalid_class_version);
    }
    ++stats.mads_dropped;
    return;
  }
  if (err != mad::ParseError::none) {
    ++stats.mads_dropped;
    log::debug("soft {}: dropped a MAD: {}", dev_.name(), mad::to_string(err));
    return;
  }
  on_mad(m, src_ip_be, cm::Clock::now());
}

void GsiAgent::on_req(const mad::Mad& m, std::uint32_t src_ip_be, cm::TimePoint now) {
  const auto& req = std::get<mad::Req>(m.msg);
  // A duplicate of a request we already hold: its state machine answers (MRA or REP again).
  for (auto& [id, e] : conns) {
    if (!e.conn.is_active() && e.conn.remote_id() == req.local_comm_id && e.conn.remote_guid() == req.local_ca_guid) {
      apply(e, e.conn.on_message(m.msg, now));
      return;
    }
  }
  auto lit = listeners.find(req.service_id);
  if (lit == listeners.end()) {
    reply_rej(src_ip_be, m.hdr.tid, req.local_comm_id, 0, mad::RejReason::invalid_service_id);
    return;
  }
  if (req.transport_service_type != 0) {  // RC only
    reply_rej(src_ip_be, m.hdr.tid, req.local_comm_id, 0, mad::RejReason::invalid_transport_type);
    return;
  }
  const Gid ours = Gid::from_ipv4(dev_.ip_be()), theirs = Gid::from_ipv4(src_ip_be);
  if (req.primary_remote_gid != ours.raw || req.primary_local_gid != theirs.raw) {
    reply_rej(src_ip_be, m.hdr.tid, req.local_comm_id, 0, mad::RejReason::invalid_gid);
    return;
  }
  // RDMA-CM service IDs carry the cma header: IPv4 and addressed to us (cma.c does the same
  // check, cma_match_private_data).
  auto cma = mad::parse_cma(req.private_data);
  if (!cma || cma->dst_ip_be != dev_.ip_be()) {
    reply_rej(src_ip_be, m.hdr.tid, req.local_comm_id, 0, mad::RejReason::invalid_service_id);
    return;
  }
  if (lit->second.pending.size() >= lit->second.backlog) {
    reply_rej(src_ip_be, m.hdr.tid, req.local_comm_id, 0, mad::RejReason::no_resources);
    return;
  }
  const std::uint32_t id = new_local_id();
  auto& e = conns[id];
  e.conn = cm::Conn::passive(req, id, dev_.node_guid());
  e.peer_ip_be = src_ip_be;
  e.tid = m.hdr.tid;
  e.app_owned = false;  // until get_request hands it out
  lit->second.pending.push_back(id);
  // Ask for time while the application decides (the kernel's cma sends this MRA too).
  apply(e, e.conn.send_mra(kMraServiceTimeout));
}

void GsiAgent::on_mad(const mad::Mad& m, std::uint32_t src_ip_be, cm::TimePoint now) {
  if (std::holds_alternative<mad::Req>(m.msg)) {
    on_req(m, src_ip_be, now);
    return;
  }
  // Every other message names our connection by its remote_comm_id.
  const std::uint32_t ours = std::visit(
      [](const auto& x) -> std::uint32_t {
        if constexpr (requires { x.remote_comm_id; }) return x.remote_comm_id;
        else return 0;
      },
      m.msg);
  Entry* e = find(ours);
  // Messages must come from the peer we talk to.
  if (e != nullptr && e->peer_ip_be != src_ip_be) e = nullptr;
  if (e == nullptr) {
    if (const auto* d = std::get_if<mad::Dreq>(&m.msg)) {
      mad::Drep r;  // the connection is gone: confirm anyway, or the peer waits (12.9.8.3)
      r.local_comm_id = d->remote_comm_id;
      r.remote_comm_id = d->local_comm_id;
      send(src_ip_be, m.hdr.tid, r);
    } else if (const auto* rep = std::get_if<mad::Rep>(&m.msg)) {
      reply_rej(src_ip_be, m.hdr.tid, rep->local_comm_id, 1, mad::RejReason::invalid_comm_id);
    } else {
      ++stats.mads_dropped;
    }
    return;
  }
  // A REP's local_comm_id must stay the same once known (a duplicate or a stray from elsewhere).
  if (const auto* rep = std::get_if<mad::Rep>(&m.msg);
      rep != nullptr && e->conn.remote_id() != 0 && rep->local_comm_id != e->conn.remote_id()) {
    ++stats.mads_dropped;
    return;
  }
  const unsigned before = e->conn.resends();
  apply(*e, e->conn.on_message(m.msg, now));
  stats.resends += e->conn.resends() - before;
}

void GsiAgent::on_timers(cm::TimePoint now) {
  for (auto it = conns.begin(); it != conns.end();) {
    Entry& e = it->second;
    if (now >= e.conn.deadline()) {
      const unsigned before = e.conn.resends();
      apply(e, e.conn.on_timer(now));
      stats.resends += e.conn.resends() - before;
    }
    if (!e.app_owned && e.conn.state() == cm::State::closed) {
      it = conns.erase(it);
      continue;
    }
    ++it;
  }
}

bool GsiAgent::has_timers() const noexcept {
  for (const auto& [id, e] : conns)
    if (e.conn.deadline() != cm::TimePoint::max()) return true;
  return false;
}

void GsiAgent::on_qp_traffic(std::uint32_t qpn) {
  for (auto& [id, e] : conns)
    if (!e.conn.is_active() && e.conn.state() == cm::State::rep_sent && e.conn.local_qpn() == qpn)
      apply(e, e.conn.on_traffic());
}

}  // namespace vrdma::nicdrv::soft
