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

#include "vrdma/device/model.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/nicdrv/virtio_rdma_conv.hpp"

namespace vrdma::device {

namespace {

inline constexpr std::size_t kMaxRequest = 256;

// A refusal: the status for the guest and the sentence for the operator's log.
struct Refusal {
  vd::Status status;
  std::string why;
};
template <class T>
using CmdResult = std::variant<T, Refusal>;

Refusal refuse(vd::Status s, std::string why) { return {s, std::move(why)}; }

// The command's status: the errno of the error's kind (common/result.hpp), when the contract has
// that status; EIO otherwise.
vd::Status status_of(const Error& e) {
  const int n = errno_of(e.errc());
  switch (n) {
    case VIRTIO_RDMA_S_PERM: case VIRTIO_RDMA_S_NOT_FOUND: case VIRTIO_RDMA_S_NO_MEMORY: case VIRTIO_RDMA_S_FAULT:
    case VIRTIO_RDMA_S_BUSY: case VIRTIO_RDMA_S_INVALID: case VIRTIO_RDMA_S_NO_SPACE: case VIRTIO_RDMA_S_NOT_SUPPORTED:
      return static_cast<vd::Status>(n);
    default: return vd::Status::io;
  }
}

bool pow2(std::uint32_t v) { return v != 0 && std::has_single_bit(v); }

// A ring or block the device will read and write: aligned and wholly inside one region.
std::optional<std::string> check_area(const vhost::GuestView& g, std::uint64_t gpa, std::uint64_t len, std::uint64_t align,
                                      std::string_view what) {
  if (gpa % align != 0) return fmt::format("{} at {:#x} is not {}-byte aligned", what, gpa, align);
  if (gpa + len < gpa) return fmt::format("{} at {:#x} wraps the address space", what, gpa);
  if (!g.memory().range(gpa, len)) return fmt::format("{} [{:#x}, +{:#x}) is not inside one guest memory region", what, gpa, len);
  return std::nullopt;
}

template <class T>
T req_as(std::span<const std::uint8_t> body) {
  T v{};
  std::memcpy(&v, body.data(), std::min(body.size(), sizeof v));
  return v;
}

template <class T>
std::vector<std::uint8_t> bytes_of(const T& v) {
  std::vector<std::uint8_t> out(sizeof v);
  std::memcpy(out.data(), &v, sizeof v);
  return out;
}

using Reply = CmdResult<std::vector<std::uint8_t>>;

// The control commands' handlers, over the device model: `body` holds exactly the command's
// request (virtio_rdma_cmd_req_len; a shorter one never reaches a handler), `g` the guest memory
// its addresses must fall in, `lim` the per-guest limits.
struct Handlers {
  DeviceModel& d;
  const vhost::GuestView& g;
  std::span<const std::uint8_t> body;
  const RdmaLimits& lim;

  // REG_MR and REG_DMA_MR: the guest's regions of both kinds count against max_mr.
  [[nodiscard]] std::optional<Refusal> mr_room() const {
    const auto n = d.mrs.size() + d.dma_mrs.size();
    if (n >= lim.max_mr)
      return refuse(vd::Status::no_space, fmt::format("the guest already has {} MRs (limit {})", n, lim.max_mr));
    return std::nullopt;
  }

  Reply query_device();
  Reply query_port();
  Reply query_gid();
  Reply create_pd();
  Reply destroy_pd();
  Reply reg_mr();
  Reply dereg_mr();
  Reply create_cq();
  Reply destroy_cq();
  Reply create_qp();
  Reply modify_qp();
  Reply query_qp();
  Reply destroy_qp();
  Reply create_ah();
  Reply destroy_ah();
  Reply create_srq();
  Reply destroy_srq();
  Reply query_config();
  Reply reg_dma_mr();
};

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
    vd::Status status = vd::Status::ok;
    std::vector<std::uint8_t> body;
    std::string why;
    if (!r.read(req.data(), len).ok()) {
      status = vd::Status::fault;
      why = "the control request could not be read from guest memory";
      log::warn("virtio-rdma: a control request could not be read from guest memory");
    } else {
      body = execute(q.memory(), std::span(req.data(), len), status, why);
      std::uint32_t cmd = 0;
      if (len >= sizeof cmd) std::memcpy(&cmd, req.data(), sizeof cmd);
      const auto* row = command_of(cmd);
      grew |= status == vd::Status::ok && row != nullptr && row->effect == Effect::makes;
    }
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

std::vector<std::uint8_t> DeviceModel::execute(const vhost::GuestView& g, std::span<const std::uint8_t> req,
                                                    vd::Status& status, std::string& why_out) {
  if (req.size() < sizeof(vd::CmdHeader)) {
    status = vd::Status::invalid;
    why_out = fmt::format("a control request of {} bytes is shorter than its {}-byte header", req.size(), sizeof(vd::CmdHeader));
    log::warn("virtio-rdma: a control request of {} bytes is shorter than its {}-byte header", req.size(),
              sizeof(vd::CmdHeader));
    return {};
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
    status = ref->status;
    why_out = fmt::format("{}: {}", vd::cmd_name(hdr.cmd), ref->why);
    if (should_log_refusal(Refused::command))
      log::warn("virtio-rdma: {} refused ({}): {}", vd::cmd_name(hdr.cmd), static_cast<std::uint32_t>(ref->status),
              ref->why);
    return {};
  }
  status = vd::Status::ok;
  return std::move(std::get<std::vector<std::uint8_t>>(result));
}

// ---- the handlers ------------------------------------------------------------------------------

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
    auto gid = d.engine->query_gid(r.index, 1);
    if (!gid) return refuse(vd::Status::invalid, gid.error().message);
    vd::GidResp out{};
    std::memcpy(out.gid, gid->gid.raw.data(), sizeof out.gid);
    out.type = static_cast<std::uint32_t>(gid->type);
    return bytes_of(out);
}

Reply Handlers::create_pd() {
    if (d.pds.size() >= lim.max_pd)
      return refuse(vd::Status::no_space, fmt::format("the guest already has {} PDs (limit {})", d.pds.size(), lim.max_pd));
    auto pd = d.engine->alloc_pd();
    if (!pd) return refuse(status_of(pd.error()), pd.error().message);
    const auto h = d.new_handle();
    d.pds[h] = PdObj{std::move(*pd), 0, {}};
    return bytes_of(vd::HandleResp{h, 0});
}

Reply Handlers::destroy_pd() {
    const auto h = req_as<vd::HandleReq>(body).handle;
    auto it = d.pds.find(h);
    if (it == d.pds.end()) return refuse(vd::Status::not_found, fmt::format("no PD {}", h));
    if (it->second.users != 0)
      return refuse(vd::Status::busy, fmt::format("PD {} still holds {} objects", h, it->second.users));
    d.pds.erase(it);
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

Reply Handlers::dereg_mr() {
    const auto h = req_as<vd::HandleReq>(body).handle;
    if (d.dma_mrs.count(h) != 0) {
      d.forget_dma_mr(h);
      return std::vector<std::uint8_t>{};
    }
    auto it = d.mrs.find(h);
    if (it == d.mrs.end()) return refuse(vd::Status::not_found, fmt::format("no MR {}", h));
    d.st.registered_bytes -= it->second.length;
    --d.pds[it->second.pd].users;
    d.forget_names(h);
    d.mrs.erase(it);
    return std::vector<std::uint8_t>{};
}

Reply Handlers::create_cq() {
    const auto r = req_as<vd::CreateCqReq>(body);
    if (d.cqs.size() >= lim.max_cq)
      return refuse(vd::Status::no_space, fmt::format("the guest already has {} CQs (limit {})", d.cqs.size(), lim.max_cq));
    if (!pow2(r.depth) || r.depth > lim.max_cqe)
      return refuse(vd::Status::invalid, fmt::format("CQ depth {} is not a power of two up to {}", r.depth, lim.max_cqe));
    const std::uint64_t bytes = vd::kCqeOffset + std::uint64_t{r.depth} * sizeof(vd::Cqe);
    if (auto why = check_area(g, r.ring_gpa, bytes, 4096, "the CQ ring")) return refuse(vd::Status::fault, *why);
    const auto h = d.new_handle();
    if (auto s = d.add_cq(g, h, r.depth, r.ring_gpa, true); !s.ok()) return refuse(status_of(s.error()), s.error().message);
    return bytes_of(vd::HandleResp{h, 0});
}

Reply Handlers::destroy_cq() {
    const auto h = req_as<vd::HandleReq>(body).handle;
    auto it = d.cqs.find(h);
    if (it == d.cqs.end()) return refuse(vd::Status::not_found, fmt::format("no CQ {}", h));
    if (it->second.users != 0)
      return refuse(vd::Status::busy, fmt::format("CQ {} is still used by {} QPs", h, it->second.users));
    const int fd = it->second.eng->event_fd();
    d.loop.remove(fd);
    d.cq_by_fd.erase(fd);
    d.cqs.erase(it);
    return std::vector<std::uint8_t>{};
}

Reply Handlers::create_qp() {
    const auto r = req_as<vd::CreateQpReq>(body);
    if (d.qps.size() >= lim.max_qp)
      return refuse(vd::Status::no_space, fmt::format("the guest already has {} QPs (limit {})", d.qps.size(), lim.max_qp));
    auto pit = d.pds.find(r.pd);
    auto scq = d.cqs.find(r.send_cq);
    auto rcq = d.cqs.find(r.recv_cq);
    if (pit == d.pds.end()) return refuse(vd::Status::not_found, fmt::format("CREATE_QP names no PD {}", r.pd));
    if (scq == d.cqs.end() || rcq == d.cqs.end())
      return refuse(vd::Status::not_found, fmt::format("CREATE_QP names no CQ {} or {}", r.send_cq, r.recv_cq));
    SrqObj* srq = nullptr;
    if (r.srq != vd::kNoHandle) {
      auto sit = d.srqs.find(r.srq);
      if (sit == d.srqs.end()) return refuse(vd::Status::not_found, fmt::format("CREATE_QP names no SRQ {}", r.srq));
      if (sit->second.pd != r.pd)
        return refuse(vd::Status::perm, fmt::format("SRQ {} belongs to PD {}, not PD {}", r.srq, sit->second.pd, r.pd));
      srq = &sit->second;
    }
    if (r.qp_type != VIRTIO_RDMA_QPT_RC && r.qp_type != VIRTIO_RDMA_QPT_UD && r.qp_type != VIRTIO_RDMA_QPT_GSI)
      return refuse(vd::Status::not_supported, fmt::format("QP type {} is not RC (2), UD (4) or GSI (1)", r.qp_type));
    if (!pow2(r.sq_depth) || r.sq_depth > lim.max_qp_wr)
      return refuse(vd::Status::invalid, fmt::format("send queue depth {} is not a power of two up to {}", r.sq_depth, lim.max_qp_wr));
    if (srq == nullptr && (!pow2(r.rq_depth) || r.rq_depth > lim.max_qp_wr))
      return refuse(vd::Status::invalid, fmt::format("receive queue depth {} is not a power of two up to {}", r.rq_depth, lim.max_qp_wr));
    if (r.max_send_sge > lim.max_sge || r.max_recv_sge > lim.max_sge || r.max_inline > lim.max_inline)
      return refuse(vd::Status::invalid, fmt::format("QP caps (send SGEs {}, receive SGEs {}, inline {}) exceed the "
                                                     "device's ({}, {}, {})", r.max_send_sge, r.max_recv_sge,
                                                     r.max_inline, lim.max_sge, lim.max_sge, lim.max_inline));
    QpObj qp;
    qp.pd = r.pd;
    qp.send_cq = r.send_cq;
    qp.recv_cq = r.recv_cq;
    qp.srq = r.srq;
    qp.type = static_cast<nicdrv::QpType>(r.qp_type);
    qp.sq_sig_all = r.sq_sig_all != 0;
    qp.max_send_sge = std::max(1u, r.max_send_sge);
    qp.max_recv_sge = std::max(1u, r.max_recv_sge);
    qp.max_inline = r.max_inline;
    qp.sq = WorkRing{r.sq_gpa, r.sq_depth, vd::send_stride(qp.max_send_sge, r.max_inline), 0, 0};
    if (srq == nullptr) qp.rq = WorkRing{r.rq_gpa, r.rq_depth, vd::recv_stride(qp.max_recv_sge), 0, 0};
    qp.status_gpa = r.status_gpa;
    if (auto why = check_area(g, r.sq_gpa, std::uint64_t{qp.sq.depth} * qp.sq.stride, 64, "the send ring"))
      return refuse(vd::Status::fault, *why);
    if (srq == nullptr)
      if (auto why = check_area(g, r.rq_gpa, std::uint64_t{qp.rq.depth} * qp.rq.stride, 64, "the receive ring"))
        return refuse(vd::Status::fault, *why);
    if (auto why = check_area(g, r.status_gpa, sizeof(vd::QpStatus), 64, "the QP status block"))
      return refuse(vd::Status::fault, *why);
    nicdrv::QpInitAttr ia;
    ia.type = qp.type;
    ia.send_cq = scq->second.eng.get();
    ia.recv_cq = rcq->second.eng.get();
    ia.srq = srq != nullptr ? srq->eng.get() : nullptr;
    ia.cap.max_send_wr = r.sq_depth;
    ia.cap.max_recv_wr = srq != nullptr ? 0 : r.rq_depth;
    ia.cap.max_send_sge = qp.max_send_sge;
    ia.cap.max_recv_sge = qp.max_recv_sge;
    ia.cap.max_inline_data = r.max_inline;
    ia.sq_sig_all = r.sq_sig_all != 0;
    auto eng = pit->second.eng->create_qp(ia);
    // After a move onto a NIC, a QPN it hands out may be a moved QP's name in the guest.
    std::vector<std::shared_ptr<nicdrv::QueuePair>> set_aside;
    for (int tries = 0; eng && !d.qpn_to_engine.empty() && d.guest_name_taken((*eng)->qp_num(), true); ++tries) {
      if (tries == 7) return refuse(vd::Status::busy, "the NIC kept handing out QPNs the guest already uses");
      set_aside.push_back(std::move(*eng));
      eng = pit->second.eng->create_qp(ia);
    }
    if (!eng) return refuse(status_of(eng.error()), eng.error().message);
    qp.eng = std::move(*eng);
    qp.guest_qpn = qp.eng->qp_num();
    const auto h = d.new_handle();
    d.qp_by_engine_qpn[qp.guest_qpn] = h;
    vd::CreateQpResp out{h, qp.guest_qpn, qp.sq.stride, qp.rq.stride};
    d.write_status(g, qp.status_gpa, 0, 0, 0);
    ++pit->second.users;
    ++scq->second.users;
    ++rcq->second.users;
    if (srq != nullptr) ++srq->users;
    d.qps.emplace(h, std::move(qp));
    return bytes_of(out);
}

Reply Handlers::modify_qp() {
    const auto r = req_as<vd::ModifyQpReq>(body);
    auto it = d.qps.find(r.qp);
    if (it == d.qps.end()) return refuse(vd::Status::not_found, fmt::format("MODIFY_QP names no QP {}", r.qp));
    auto attr = nicdrv::qp_attr_from_wire(r.attr);
    if (!attr) return refuse(vd::Status::invalid, "MODIFY_QP carries an out-of-range state, MTU or access value");
    if ((r.mask & ~((1u << 21) - 1)) != 0)
      return refuse(vd::Status::invalid, fmt::format("MODIFY_QP mask {:#x} has unknown bits", r.mask));
    const auto mask = static_cast<nicdrv::QpAttrMask>(r.mask);
    bool local_peer = it->second.local_peer;
    if (d.engine_rebuilds() && (mask & nicdrv::QpAttrMask::dest_qpn) != nicdrv::QpAttrMask::none) {
      // Connected to a QP of this same device? Then a move keeps the two connected.
      const auto gq = attr->dest_qp_num;
      auto own = d.qpn_to_engine.find(gq);
      auto byq = d.qp_by_engine_qpn.find(gq);
      const bool ours = own != d.qpn_to_engine.end() || (byq != d.qp_by_engine_qpn.end() && d.qps.count(byq->second) != 0 &&
                                                       d.qps[byq->second].guest_qpn == gq);
      auto sg = d.engine->query_gid(attr->ah_attr.sgid_index, attr->ah_attr.port_num);
      local_peer = ours && (mask & nicdrv::QpAttrMask::av) != nicdrv::QpAttrMask::none && sg.ok() && sg->gid == attr->ah_attr.dgid;
      if (local_peer && own != d.qpn_to_engine.end()) attr->dest_qp_num = own->second;
    }
    auto s = it->second.eng->modify(*attr, mask);
    if (!s.ok()) return refuse(status_of(s.error()), s.error().message);
    auto& qp = it->second;
    qp.local_peer = local_peer;
    if ((mask & nicdrv::QpAttrMask::dest_qpn) != nicdrv::QpAttrMask::none) {  // connected anew by the guest
      qp.guest_dest_qpn = 0;
      qp.remote_rkeys.clear();
      qp.peer_token = 0;
    }
    if (qp.eng->state() != nicdrv::QpState::err) qp.fatal_reported = false;
    d.write_status(g, qp.status_gpa, qp.sq.consumed, qp.rq.consumed, static_cast<std::uint32_t>(qp.eng->state()));
    if (qp.sq.produced != qp.sq.consumed) d.pending_sq.insert(r.qp);
    if (qp.rq.produced != qp.rq.consumed) d.pending_rq.insert(r.qp);
    return std::vector<std::uint8_t>{};
}

Reply Handlers::query_qp() {
    const auto h = req_as<vd::HandleReq>(body).handle;
    auto it = d.qps.find(h);
    if (it == d.qps.end()) return refuse(vd::Status::not_found, fmt::format("QUERY_QP names no QP {}", h));
    auto a = it->second.eng->query();
    if (!a) return refuse(status_of(a.error()), a.error().message);
    if (it->second.local_peer) a->dest_qp_num = d.guest_qpn_of(a->dest_qp_num);
    else if (it->second.guest_dest_qpn != 0) a->dest_qp_num = it->second.guest_dest_qpn;  // a re-pointed peer
    return bytes_of(nicdrv::qp_attr_to_wire(*a));
}

Reply Handlers::destroy_qp() {
    const auto h = req_as<vd::HandleReq>(body).handle;
    auto it = d.qps.find(h);
    if (it == d.qps.end()) return refuse(vd::Status::not_found, fmt::format("DESTROY_QP names no QP {}", h));
    auto& qp = it->second;
    --d.pds[qp.pd].users;
    --d.cqs[qp.send_cq].users;
    --d.cqs[qp.recv_cq].users;
    if (qp.srq != vd::kNoHandle) --d.srqs[qp.srq].users;
    d.pending_sq.erase(h);
    d.pending_rq.erase(h);
    d.forget_names(h);
    d.qps.erase(it);
    return std::vector<std::uint8_t>{};
}

Reply Handlers::create_ah() {
    const auto r = req_as<vd::CreateAhReq>(body);
    auto pit = d.pds.find(r.pd);
    if (pit == d.pds.end()) return refuse(vd::Status::not_found, fmt::format("CREATE_AH names no PD {}", r.pd));
    if (d.ahs.size() >= lim.max_ah)
      return refuse(vd::Status::no_space, fmt::format("the guest already has {} AHs (limit {})", d.ahs.size(), lim.max_ah));
    auto ah = pit->second.eng->create_ah(nicdrv::ah_from_wire(r.ah));
    if (!ah) return refuse(status_of(ah.error()), ah.error().message);
    const auto h = d.new_handle();
    d.ahs[h] = AhObj{r.pd, r.ah, std::move(*ah)};
    ++pit->second.users;
    return bytes_of(vd::HandleResp{h, 0});
}

Reply Handlers::destroy_ah() {
    const auto h = req_as<vd::HandleReq>(body).handle;
    auto it = d.ahs.find(h);
    if (it == d.ahs.end()) return refuse(vd::Status::not_found, fmt::format("DESTROY_AH names no AH {}", h));
    --d.pds[it->second.pd].users;
    d.ahs.erase(it);
    return std::vector<std::uint8_t>{};
}

Reply Handlers::create_srq() {
    const auto r = req_as<vd::CreateSrqReq>(body);
    auto pit = d.pds.find(r.pd);
    if (pit == d.pds.end()) return refuse(vd::Status::not_found, fmt::format("CREATE_SRQ names no PD {}", r.pd));
    if (d.srqs.size() >= lim.max_srq)
      return refuse(vd::Status::no_space, fmt::format("the guest already has {} SRQs (limit {})", d.srqs.size(), lim.max_srq));
    if (!pow2(r.depth) || r.depth > lim.max_qp_wr || r.max_sge == 0 || r.max_sge > lim.max_sge)
      return refuse(vd::Status::invalid, fmt::format("SRQ depth {} / SGEs {} out of range (power of two up to {}, 1..{})",
                                                     r.depth, r.max_sge, lim.max_qp_wr, lim.max_sge));
    SrqObj s;
    s.pd = r.pd;
    s.max_sge = r.max_sge;
    s.ring = WorkRing{r.ring_gpa, r.depth, vd::recv_stride(r.max_sge), 0, 0};
    s.status_gpa = r.status_gpa;
    if (auto why = check_area(g, r.ring_gpa, std::uint64_t{r.depth} * s.ring.stride, 64, "the SRQ ring"))
      return refuse(vd::Status::fault, *why);
    if (auto why = check_area(g, r.status_gpa, sizeof(vd::QpStatus), 64, "the SRQ status block"))
      return refuse(vd::Status::fault, *why);
    auto eng = pit->second.eng->create_srq(r.depth, r.max_sge);
    if (!eng) return refuse(status_of(eng.error()), eng.error().message);
    s.eng = std::move(*eng);
    const auto h = d.new_handle();
    vd::CreateSrqResp out{h, s.ring.stride};
    d.write_status(g, s.status_gpa, 0, 0, 0);
    ++pit->second.users;
    d.srqs.emplace(h, std::move(s));
    return bytes_of(out);
}

Reply Handlers::destroy_srq() {
    const auto h = req_as<vd::HandleReq>(body).handle;
    auto it = d.srqs.find(h);
    if (it == d.srqs.end()) return refuse(vd::Status::not_found, fmt::format("DESTROY_SRQ names no SRQ {}", h));
    if (it->second.users != 0)
      return refuse(vd::Status::busy, fmt::format("SRQ {} is still used by {} QPs", h, it->second.users));
    --d.pds[it->second.pd].users;
    d.pending_srq.erase(h);
    d.srqs.erase(it);
    return std::vector<std::uint8_t>{};
}

Reply Handlers::query_config() {
    const vd::Config c = d.config_space();
    std::vector<std::uint8_t> out(sizeof c);
    std::memcpy(out.data(), &c, sizeof c);
    return out;
}

}  // namespace vrdma::device
