// The control queue: one command per chain (readable request, writable response). Every
// field is checked before the engine sees it; a refused command gets an errno-valued status and
// one log sentence.
#include <sys/epoll.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <variant>

#include <fmt/format.h>

#include "command_handlers.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/nicdrv/virtio_rdma_conv.hpp"

namespace vrdma::device {

namespace {

using namespace cmd;

// What a command does to the device's objects. A batch of commands that made objects may have
// outgrown the state area (DeviceModel::control tells the hooks).
enum class Effect { reads, makes, changes, destroys };

struct Command {
  vd::Cmd cmd;
  Effect effect;
  Reply (Handlers::*run)();
};

// Every control command, one row each, in the contract's numbering (from 1; checked below). The
// request's size is the contract's own (virtio_rdma_cmd_req_len).
constexpr std::array<Command, VIRTIO_RDMA_CMD_COUNT - 1> kCommands{{
    {vd::Cmd::query_device, Effect::reads, &Handlers::query_device},
    {vd::Cmd::query_port, Effect::reads, &Handlers::query_port},
    {vd::Cmd::query_gid, Effect::reads, &Handlers::query_gid},
    {vd::Cmd::create_pd, Effect::makes, &Handlers::create_pd},
    {vd::Cmd::destroy_pd, Effect::destroys, &Handlers::destroy_pd},
    {vd::Cmd::reg_mr, Effect::makes, &Handlers::reg_mr},
    {vd::Cmd::dereg_mr, Effect::destroys, &Handlers::dereg_mr},
    {vd::Cmd::create_cq, Effect::makes, &Handlers::create_cq},
    {vd::Cmd::destroy_cq, Effect::destroys, &Handlers::destroy_cq},
    {vd::Cmd::create_qp, Effect::makes, &Handlers::create_qp},
    {vd::Cmd::modify_qp, Effect::changes, &Handlers::modify_qp},
    {vd::Cmd::query_qp, Effect::reads, &Handlers::query_qp},
    {vd::Cmd::destroy_qp, Effect::destroys, &Handlers::destroy_qp},
    {vd::Cmd::create_ah, Effect::makes, &Handlers::create_ah},
    {vd::Cmd::destroy_ah, Effect::destroys, &Handlers::destroy_ah},
    {vd::Cmd::create_srq, Effect::makes, &Handlers::create_srq},
    {vd::Cmd::destroy_srq, Effect::destroys, &Handlers::destroy_srq},
    {vd::Cmd::query_config, Effect::reads, &Handlers::query_config},
    {vd::Cmd::reg_dma_mr, Effect::makes, &Handlers::reg_dma_mr},
    {vd::Cmd::alloc_mr, Effect::makes, &Handlers::alloc_mr},
    {vd::Cmd::create_db_ring, Effect::makes, &Handlers::create_db_ring},
    {vd::Cmd::destroy_db_ring, Effect::destroys, &Handlers::destroy_db_ring},
}};
constexpr bool in_contract_order() {
  for (std::size_t i = 0; i < kCommands.size(); ++i)
    if (static_cast<std::uint32_t>(kCommands[i].cmd) != i + 1 ||
        virtio_rdma_cmd_req_len(static_cast<std::uint32_t>(kCommands[i].cmd)) == VIRTIO_RDMA_CMD_NONE)
      return false;
  return true;
}
static_assert(in_contract_order(), "kCommands: one row per contract command, in its numbering");

// The command's row; nullptr for a number that names none.
const Command* command_of(std::uint32_t cmd) {
  return cmd >= 1 && cmd <= kCommands.size() ? &kCommands[cmd - 1] : nullptr;
}

}  // namespace

void DeviceModel::control(vhost::Queue& q) {
  bool grew = false;  // an object was made: the state may outgrow the state area
  // A command sees every doorbell the driver rang before it (the two rings' kicks reach this
  // loop in no particular order): a driver that posted receives and then asks anything knows the
  // device has them.
  if (q.index() == vd::kControlQueue && host != nullptr && host->queue_running(vd::kDoorbellQueue))
    host->run_queue(vd::kDoorbellQueue);
  while (auto chain = q.pop()) {
    ++st.commands;
    std::array<std::uint8_t, kMaxRequest> req{};
    const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(chain->readable, kMaxRequest));
    vhost::ChainReader r(q.memory(), *chain);
    Executed done;
    if (!r.read(req.data(), len).ok()) {
      done.status = vd::Status::fault;
      done.why = "the control request could not be read from guest memory";
      log::warn("virtio-rdma: a control request could not be read from guest memory");
    } else {
      done = execute(q.memory(), std::span(req.data(), len));
      grew |= done.made;
    }
    const vd::Status status = done.status;
    std::vector<std::uint8_t>& body = done.body;
    const std::string& why = done.why;
    vhost::ChainWriter w(q.memory(), *chain);
    vd::RespHeader h{static_cast<std::uint32_t>(status), 0};
    if (status != vd::Status::ok) {
      ++st.command_errors;
      // The sentence goes back to the driver, as much of it as fits.
      const auto room = w.remaining() > sizeof h ? w.remaining() - sizeof h : 0;
      const auto n = std::min<std::uint64_t>({why.size(), room, vd::kMaxErrorMessage});
      body.assign(why.begin(), why.begin() + static_cast<std::ptrdiff_t>(n));
      h.msg_len = static_cast<std::uint32_t>(n);
    }
    std::uint32_t written = 0;
    if (w.remaining() < sizeof h + body.size()) {
      log::warn("virtio-rdma: a control request left {} writable bytes for a {}-byte response; no response written",
                w.remaining(), sizeof h + body.size());
    } else if (w.write(&h, sizeof h).ok() && (body.empty() || w.write(body.data(), body.size()).ok())) {
      written = static_cast<std::uint32_t>(sizeof h + body.size());
    }
    if (!q.push(*chain, written).ok()) break;
  }
  if (grew) {
    if (hooks != nullptr) hooks->objects_added();
    if (!events.empty() && host != nullptr && host->queue_running(vd::kEventQueue)) host->run_queue(vd::kEventQueue);
  }
}

Status DeviceModel::add_cq(const vhost::GuestView& g, std::uint32_t h, std::uint32_t depth, std::uint64_t ring_gpa,
                                bool zero_ring, std::shared_ptr<nicdrv::CompletionQueue> made) {
  auto cq = made ? Result<std::shared_ptr<nicdrv::CompletionQueue>>(std::move(made)) : engine->create_cq(depth);
  if (!cq) return std::move(cq).error();
  if (zero_ring) {
    std::vector<std::uint8_t> zeros(vd::kCqeOffset + std::size_t{depth} * sizeof(vd::Cqe), 0);
    if (!g.write(ring_gpa, zeros.data(), zeros.size()).ok())
      return make_error(Errc::invalid_argument, "the CQ ring cannot be written");
  }
  CqObj c;
  c.depth = depth;
  c.ring_gpa = ring_gpa;
  c.eng = std::move(*cq);
  const int fd = c.eng->event_fd();
  VRDMA_TRY(loop.add(fd, EPOLLIN, [this, h](std::uint32_t) {
    auto it = cqs.find(h);
    if (it == cqs.end()) return;
    it->second.eng->ack_events();
    drain_cq(h);
  }));
  (void)c.eng->req_notify(false);
  cq_by_fd[fd] = h;
  cqs.emplace(h, std::move(c));
  return {};
}

DeviceModel::Executed DeviceModel::execute(const vhost::GuestView& g, std::span<const std::uint8_t> req) {
  Executed out;
  if (req.size() < sizeof(vd::CmdHeader)) {
    out.status = vd::Status::invalid;
    out.why = fmt::format("a control request of {} bytes is shorter than its {}-byte header", req.size(),
                          sizeof(vd::CmdHeader));
    log::warn("virtio-rdma: {}", out.why);
    return out;
  }
  const auto hdr = req_as<vd::CmdHeader>(req);
  const auto body = req.subspan(sizeof(vd::CmdHeader));
  const auto* row = command_of(hdr.cmd);
  const std::uint32_t need = row != nullptr ? virtio_rdma_cmd_req_len(hdr.cmd) : 0;
  Reply result = row == nullptr
                     ? Reply(refuse(vd::Status::not_supported, fmt::format("unknown control command {}", hdr.cmd)))
                 : body.size() < need
                     ? Reply(refuse(vd::Status::invalid, fmt::format("{} needs a {}-byte body but has {} bytes",
                                                                     vd::cmd_name(hdr.cmd), need, body.size())))
                     : (Handlers{*this, g, body.first(need), opts.limits}.*(row->run))();
  if (auto* ref = std::get_if<Refusal>(&result)) {
    out.status = ref->status;
    out.why = fmt::format("{}: {}", vd::cmd_name(hdr.cmd), ref->why);
    if (should_log_refusal(Refused::command))
      log::warn("virtio-rdma: {} refused ({}): {}", vd::cmd_name(hdr.cmd), static_cast<std::uint32_t>(ref->status),
                ref->why);
    return out;
  }
  out.body = std::move(std::get<std::vector<std::uint8_t>>(result));
  out.made = row->effect == Effect::makes;
  return out;
}

// ---- the handlers: queries, PDs, MRs, CQs (QPs, AHs and SRQs: commands_qp.cpp) ------------------------------------------------------------------------------

Reply Handlers::query_device() {
  auto a = d.engine->query_device();
  if (!a) return refuse(status_of(a.error()), a.error().message);
  // The engine's attributes within this device's limits.
  nicdrv::DeviceAttr r = *a;
  auto cap = [](std::uint32_t mine, std::uint32_t eng) { return eng != 0 ? std::min(mine, eng) : mine; };
  r.max_qp = cap(lim.max_qp, a->max_qp);
  r.max_qp_wr = cap(lim.max_qp_wr, a->max_qp_wr);
  r.max_sge = cap(lim.max_sge, a->max_sge);
  r.max_cq = cap(lim.max_cq, a->max_cq);
  r.max_cqe = cap(lim.max_cqe, a->max_cqe);
  r.max_mr = cap(lim.max_mr, a->max_mr);
  r.max_pd = cap(lim.max_pd, a->max_pd);
  r.max_ah = cap(lim.max_ah, a->max_ah);
  r.max_srq = cap(lim.max_srq, a->max_srq);
  r.max_srq_wr = cap(lim.max_qp_wr, a->max_srq_wr);
  r.max_inline_data = cap(lim.max_inline, a->max_inline_data);
  r.fw_ver = fmt::format("vrdmad {} over {}", "0.1", a->fw_ver);
  return bytes_of(nicdrv::device_attr_to_wire(r));
}

Reply Handlers::query_port() {
  auto p = d.engine->query_port(1);
  if (!p) return refuse(status_of(p.error()), p.error().message);
  return bytes_of(nicdrv::port_attr_to_wire(*p));
}

Reply Handlers::query_gid() {
  const auto r = req_as<vd::QueryGidReq>(body);
  auto gid = d.engine->query_gid(r.index == 0 ? d.gid0_index : r.index, 1);
  if (!gid) return refuse(vd::Status::invalid, gid.error().message);
  vd::GidResp out{};
  std::memcpy(out.gid, gid->gid.raw.data(), sizeof out.gid);
  out.type = static_cast<std::uint32_t>(gid->type);
  return bytes_of(out);
}

Reply Handlers::create_pd() {
  if (auto e = room(d.pds.size(), lim.max_pd, "PDs")) return *e;
  auto pd = d.engine->alloc_pd();
  if (!pd) return refuse(status_of(pd.error()), pd.error().message);
  const auto h = d.new_handle();
  d.pds[h] = PdObj{std::move(*pd), 0, {}};
  return bytes_of(vd::HandleResp{h, 0});
}

Reply Handlers::destroy_pd() {
  auto it = to_destroy(d.pds, "PD", "MRs, QPs, AHs or SRQs");
  if (auto* no = std::get_if<Refusal>(&it)) return *no;
  d.pds.erase(std::get<0>(it));
  return std::vector<std::uint8_t>{};
}

Reply Handlers::reg_mr() {
  const auto r = req_as<vd::RegMrReq>(body);
  auto pit = d.pds.find(r.pd);
  if (pit == d.pds.end()) return refuse(vd::Status::not_found, fmt::format("REG_MR names no PD {}", r.pd));
  if (auto e = mr_room()) return *e;
  if (r.length > lim.max_registered_bytes || d.st.registered_bytes + r.length > lim.max_registered_bytes)
    return refuse(vd::Status::no_space,
                  fmt::format("registering {} more bytes would exceed the guest's limit of {} registered bytes "
                              "({} already)", r.length, lim.max_registered_bytes, d.st.registered_bytes));
  MrObj mr;
  // After a move onto a NIC, a key the NIC hands out may be a moved region's name in the
  // guest: such a registration is set aside (and released) and another one made.
  std::vector<MrObj> set_aside;
  for (int tries = 0;; ++tries) {
    if (auto s = d.register_mr(g, r, 0, mr); !s.ok()) return refuse(status_of(s.error()), s.error().message);
    if (d.lkey_to_engine.empty() ||
        (!d.guest_name_taken(mr.eng->lkey(), false) && !d.guest_name_taken(mr.eng->rkey(), false)))
      break;
    if (tries == 7) return refuse(vd::Status::busy, "the NIC kept handing out memory keys the guest already uses");
    set_aside.push_back(std::move(mr));
    mr = MrObj{};
  }
  mr.guest_lkey = mr.eng->lkey();
  mr.guest_rkey = mr.eng->rkey();
  const auto h = d.new_handle();
  vd::RegMrResp out{h, mr.eng->lkey(), mr.eng->rkey(), 0};
  d.st.registered_bytes += r.length;
  ++pit->second.users;
  d.mrs.emplace(h, std::move(mr));
  return bytes_of(out);
}

Reply Handlers::reg_dma_mr() {
  const auto r = req_as<vd::RegDmaMrReq>(body);
  auto pit = d.pds.find(r.pd);
  if (pit == d.pds.end()) return refuse(vd::Status::not_found, fmt::format("REG_DMA_MR names no PD {}", r.pd));
  if ((r.access & ~VIRTIO_RDMA_ACCESS_LOCAL_WRITE) != 0)
    return refuse(vd::Status::invalid,
                  fmt::format("access {:#x}: a DMA memory region is local only (0 or LOCAL_WRITE); remote access "
                              "to all guest memory is never granted",
                              r.access));
  if (auto dh = d.dma_mr_of_pd(r.pd))
    return refuse(vd::Status::busy, fmt::format("PD {} already has a DMA memory region (MR {}, lkey {:#x})", r.pd,
                                                *dh, d.dma_mrs.at(*dh).guest_lkey));
  if (auto e = mr_room()) return *e;
  DmaMrObj mr;
  mr.pd = r.pd;
  mr.access = r.access;
  if (auto s = d.map_dma_mr(g, mr, false); !s.ok()) return refuse(status_of(s.error()), s.error().message);
  const auto h = d.new_handle();
  vd::RegMrResp out{h, mr.guest_lkey, 0, 0};
  d.add_dma_mr(h, std::move(mr));
  return bytes_of(out);
}

Reply Handlers::alloc_mr() {
  const auto r = req_as<vd::AllocMrReq>(body);
  auto pit = d.pds.find(r.pd);
  if (pit == d.pds.end()) return refuse(vd::Status::not_found, fmt::format("ALLOC_MR names no PD {}", r.pd));
  if (auto e = mr_room()) return *e;
  auto mr = d.new_fast_mr(r.pd, r.max_pages);
  if (!mr) return refuse(status_of(mr.error()), "ALLOC_MR: " + mr.error().message);
  nicdrv::MrOptions mo;
  if (d.engine_reports_writes) mo.observer = mr->observer;
  auto eng = pit->second.eng->alloc_mr(r.max_pages, mo);
  if (!eng) return refuse(status_of(eng.error()), eng.error().message);
  mr->eng = std::move(*eng);
  const auto h = d.new_handle();
  vd::RegMrResp out{h, mr->eng->lkey(), mr->eng->rkey(), 0};
  d.add_fast_mr(h, std::move(*mr));
  return bytes_of(out);
}

Reply Handlers::dereg_mr() {
  const auto h = req_as<vd::HandleReq>(body).handle;
  if (d.dma_mrs.count(h) != 0) {
    d.forget_dma_mr(h);
    return std::vector<std::uint8_t>{};
  }
  if (d.fast_mrs.count(h) != 0) {
    d.forget_fast_mr(h);
    return std::vector<std::uint8_t>{};
  }
  auto found = to_destroy(d.mrs, "MR");
  if (auto* no = std::get_if<Refusal>(&found)) return *no;
  const auto it = std::get<0>(found);
  d.st.registered_bytes -= it->second.length;
  --d.pds[it->second.pd].users;
  d.forget_names(h);
  d.mrs.erase(it);
  return std::vector<std::uint8_t>{};
}

Reply Handlers::create_cq() {
  const auto r = req_as<vd::CreateCqReq>(body);
  if (auto e = room(d.cqs.size(), lim.max_cq, "CQs")) return *e;
  if (!pow2(r.depth) || r.depth > lim.max_cqe)
    return refuse(vd::Status::invalid, fmt::format("CQ depth {} is not a power of two up to {}", r.depth, lim.max_cqe));
  const std::uint64_t bytes = vd::kCqeOffset + std::uint64_t{r.depth} * sizeof(vd::Cqe);
  if (auto why = check_area(g, r.ring_gpa, bytes, 4096, "the CQ ring")) return refuse(vd::Status::fault, *why);
  if (auto e = db_ring_known(r.db_ring, "CREATE_CQ")) return *e;
  const auto h = d.new_handle();
  if (auto s = d.add_cq(g, h, r.depth, r.ring_gpa, true); !s.ok()) return refuse(status_of(s.error()), s.error().message);
  d.cqs[h].db_ring = r.db_ring;
  d.count_db_ring_user(r.db_ring, +1);
  return bytes_of(vd::HandleResp{h, 0});
}

Reply Handlers::destroy_cq() {
  auto found = to_destroy(d.cqs, "CQ", "QPs");
  if (auto* no = std::get_if<Refusal>(&found)) return *no;
  const auto it = std::get<0>(found);
  const int fd = it->second.eng->event_fd();
  d.loop.remove(fd);
  d.cq_by_fd.erase(fd);
  d.count_db_ring_user(it->second.db_ring, -1);
  d.cqs.erase(it);
  return std::vector<std::uint8_t>{};
}

Reply Handlers::query_config() {
  const vd::Config c = d.config_space();
  std::vector<std::uint8_t> out(sizeof c);
  std::memcpy(out.data(), &c, sizeof c);
  return out;
}

}  // namespace vrdma::device
