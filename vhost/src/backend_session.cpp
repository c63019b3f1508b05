// Backend session: dispatch, features, owner, guest memory and the dirty log.
#include "backend_session.hpp"

#include <fmt/format.h>

#include "vrdma/common/log.hpp"
#include "vrdma/vhost/write_journal.hpp"

namespace vrdma::vhost {

const std::array<BackendSession::Handler, static_cast<std::size_t>(Request::count_)> BackendSession::kHandlers = [] {
  std::array<Handler, static_cast<std::size_t>(Request::count_)> h{};
  auto at = [&](Request r) -> Handler& { return h[static_cast<std::size_t>(r)]; };
  at(Request::get_features) = &BackendSession::get_features;
  at(Request::set_features) = &BackendSession::set_features;
  at(Request::set_owner) = &BackendSession::set_owner;
  at(Request::reset_owner) = &BackendSession::reset_owner;
  at(Request::set_mem_table) = &BackendSession::set_mem_table;
  at(Request::set_log_base) = &BackendSession::set_log_base;
  at(Request::set_vring_num) = &BackendSession::set_vring_num;
  at(Request::set_vring_addr) = &BackendSession::set_vring_addr;
  at(Request::set_vring_base) = &BackendSession::set_vring_base;
  at(Request::get_vring_base) = &BackendSession::get_vring_base;
  at(Request::set_vring_kick) = &BackendSession::set_vring_kick;
  at(Request::set_vring_call) = &BackendSession::set_vring_call;
  at(Request::set_vring_err) = &BackendSession::set_vring_err;
  at(Request::get_protocol_features) = &BackendSession::get_protocol_features;
  at(Request::set_protocol_features) = &BackendSession::set_protocol_features;
  at(Request::get_queue_num) = &BackendSession::get_queue_num;
  at(Request::set_vring_enable) = &BackendSession::set_vring_enable;
  at(Request::get_config) = &BackendSession::get_config;
  at(Request::set_config) = &BackendSession::set_config;
  at(Request::get_inflight_fd) = &BackendSession::get_inflight_fd;
  at(Request::set_inflight_fd) = &BackendSession::set_inflight_fd;
  at(Request::reset_device) = &BackendSession::reset_owner;
  at(Request::get_max_mem_slots) = &BackendSession::get_max_mem_slots;
  at(Request::add_mem_reg) = &BackendSession::add_mem_reg;
  at(Request::rem_mem_reg) = &BackendSession::rem_mem_reg;
  at(Request::set_status) = &BackendSession::set_status;
  at(Request::get_status) = &BackendSession::get_status;
  at(Request::set_device_state_fd) = &BackendSession::set_device_state_fd;
  at(Request::check_device_state) = &BackendSession::check_device_state;
  // Every supported row of the message table has a handler, and no unsupported one does.
  for (const auto& s : kMessageTable)
    if (s.supported != (h[static_cast<std::size_t>(s.request)] != nullptr)) std::abort();
  return h;
}();

BackendSession::BackendSession(Device& dev, EventLoop& loop, const BackendOptions& opts, BackendStats& stats,
                               std::shared_ptr<FaultSink> faults, std::function<void(std::string)> fail)
    : dev_(dev),
      loop_(loop),
      opts_(opts),
      stats_(stats),
      faults_(std::move(faults)),
      fail_(std::move(fail)),
      info_(dev.info()) {
  offered_ = info_.features;
  offered_.set(VirtioFeature::version_1).set(VirtioFeature::protocol_features).set(VirtioFeature::log_all);
  if (opts.packed) offered_.set(VirtioFeature::ring_packed);
  if (opts.event_idx) offered_.set(VirtioFeature::ring_event_idx);
  if (opts.indirect) offered_.set(VirtioFeature::ring_indirect_desc);
  poffered_ = {ProtocolFeature::mq,     ProtocolFeature::log_shmfd,    ProtocolFeature::reply_ack,
               ProtocolFeature::config, ProtocolFeature::reset_device, ProtocolFeature::status,
               ProtocolFeature::device_state};
  if (opts.inflight) poffered_.set(ProtocolFeature::inflight_shmfd);
  if (opts.mem_slots) poffered_.set(ProtocolFeature::configure_mem_slots);
  vrings_.resize(info_.num_queues);
  dev_.attach(this);
}

BackendSession::~BackendSession() {
  stop_all();
  if (state_fd_) loop_.remove(state_fd_.get());
  dev_.reset();
  dev_.attach(nullptr);
}

Result<std::optional<Message>> BackendSession::handle(Message& m) {
  const Handler h = kHandlers[m.hdr.request];  // validate_request() checked the range
  if (h == nullptr) return make_error(Errc::not_supported, fmt::format("vhost-user {} is not supported",
                                                                       request_name(m.hdr.request)));
  return (this->*h)(m);
}

Message BackendSession::u64_reply(const Message& req, std::uint64_t v) {
  Message r = make_reply(req);
  r.set(v);
  return r;
}

GuestView BackendSession::view() const {
  const bool logging = acked_.has(VirtioFeature::log_all) && log_ != nullptr;
  return GuestView(mem_, logging ? log_ : nullptr);
}

BackendSession::Reply BackendSession::get_features(Message& m) { return std::optional(u64_reply(m, offered_.raw())); }

BackendSession::Reply BackendSession::set_features(Message& m) {
  const auto f = VirtioFeatures::from_raw(m.get<std::uint64_t>());
  if (!f.subset_of(offered_))
    return make_error(Errc::invalid_argument,
                      fmt::format("SET_FEATURES acks {:#x}, which this backend never offered", f.raw() & ~offered_.raw()));
  for (const auto& v : vrings_) {
    if (v.ring != nullptr && (f.has(VirtioFeature::ring_packed) != acked_.has(VirtioFeature::ring_packed)))
      return make_error(Errc::bad_state, "SET_FEATURES changes the ring layout while a ring is running");
  }
  if (f.has(VirtioFeature::log_all) != acked_.has(VirtioFeature::log_all)) {
    log::info("vhost-user: dirty logging {}", f.has(VirtioFeature::log_all) ? "on" : "off");
    journal::event(f.has(VirtioFeature::log_all) ? journal::Event::logging_on : journal::Event::logging_off);
  }
  if (f != acked_) log::info("vhost-user: features acked {:#x} (packed {}, event idx {}, indirect {}, log all {})",
                             f.raw(), f.has(VirtioFeature::ring_packed), f.has(VirtioFeature::ring_event_idx),
                             f.has(VirtioFeature::ring_indirect_desc), f.has(VirtioFeature::log_all));
  acked_ = f;
  if (f.has(VirtioFeature::protocol_features) && !protocol_negotiated_) {
    // A frontend that acks protocol features it never negotiated on this connection carries on
    // from an earlier one: QEMU 7.2's vhost-user-blk reconnects to a restarted backend while a
    // guest migrates in without GET_FEATURES or SET_PROTOCOL_FEATURES. It can only have acked
    // what a backend like this one offered, so take the offer as negotiated.
    packed_ = poffered_;
    protocol_negotiated_ = true;
    log::info("vhost-user: the frontend acks protocol features it did not negotiate on this connection (it carries "
              "on from an earlier one); taking the ones this backend offers, {:#x}", poffered_.raw());
  }
  dev_.memory_changed();
  dev_.features_acked(f);
  return std::optional<Message>{};
}

BackendSession::Reply BackendSession::set_owner(Message&) { return std::optional<Message>{}; }

BackendSession::Reply BackendSession::reset_owner(Message&) {
  stop_all();
  reset_pending_ = false;
  for (auto& v : vrings_) v = Vring{};
  acked_ = {};
  status_ = 0;
  dev_.reset();
  return std::optional<Message>{};
}

BackendSession::Reply BackendSession::get_protocol_features(Message& m) {
  return std::optional(u64_reply(m, poffered_.raw()));
}

BackendSession::Reply BackendSession::set_protocol_features(Message& m) {
  const auto f = ProtocolFeatures::from_raw(m.get<std::uint64_t>());
  if (!f.subset_of(poffered_))
    return make_error(Errc::invalid_argument, fmt::format("SET_PROTOCOL_FEATURES acks {:#x}, which was never offered",
                                                          f.raw() & ~poffered_.raw()));
  packed_ = f;
  protocol_negotiated_ = true;
  return std::optional<Message>{};
}

BackendSession::Reply BackendSession::get_queue_num(Message& m) { return std::optional(u64_reply(m, info_.num_queues)); }

BackendSession::Reply BackendSession::set_mem_table(Message& m) {
  const auto h = m.get<MemTableHeader>();
  std::vector<GuestMemory::RegionPtr> regions;
  for (std::uint32_t i = 0; i < h.nregions; ++i) {
    const auto r = m.get<MemRegion>(sizeof(MemTableHeader) + i * sizeof(MemRegion));
    auto mapped = MappedRegion::map(r, m.take_fd(i), faults_);
    if (!mapped) return prefixed(fmt::format("SET_MEM_TABLE region {}: ", i), mapped.error());
    say_if_unsealed(**mapped);
    regions.push_back(std::move(*mapped));
  }
  auto table = GuestMemory::build(std::move(regions));
  if (!table) return prefixed("SET_MEM_TABLE: ", table.error());
  mem_ = std::move(*table);  // whole-table swap; running rings see it at their next access
  dev_.memory_changed();
  journal_mem_table();
  log::info("vhost-user: guest memory table now has {} regions", mem_->regions().size());
  return std::optional<Message>{};
}

void BackendSession::journal_mem_table() const {
  if (!journal::enabled()) return;
  journal::event(journal::Event::mem_table, static_cast<std::uint32_t>(mem_->regions().size()));
  for (const auto& r : mem_->regions()) journal::event(journal::Event::mem_region, 0, r->gpa(), r->size(), r->fd_offset());
}

void BackendSession::say_if_unsealed(const MappedRegion& r) {
  if (r.sealed()) return;
  log::info("vhost-user: guest memory at gpa {:#x} ({:#x} bytes) is in a file that cannot be sealed against "
            "shrinking (not a sealable memfd: QEMU's memory-backend-file, or a memfd made without sealing); if the "
            "frontend shrinks it, only this frontend's device fails",
            r.gpa(), r.size());
}

BackendSession::Reply BackendSession::get_max_mem_slots(Message& m) { return std::optional(u64_reply(m, kMaxMemSlots)); }

BackendSession::Reply BackendSession::add_mem_reg(Message& m) {
  const auto r = m.get<SingleMemRegion>().region;
  auto mapped = MappedRegion::map(r, m.take_fd(0), faults_);
  if (!mapped) return prefixed("ADD_MEM_REG: ", mapped.error());
  say_if_unsealed(**mapped);
  auto table = mem_->with(std::move(*mapped));
  if (!table) return prefixed("ADD_MEM_REG: ", table.error());
  mem_ = std::move(*table);
  dev_.memory_changed();
  journal_mem_table();
  return std::optional<Message>{};
}

BackendSession::Reply BackendSession::rem_mem_reg(Message& m) {
  auto table = mem_->without(m.get<SingleMemRegion>().region);
  if (!table) return prefixed("REM_MEM_REG: ", table.error());
  mem_ = std::move(*table);
  dev_.memory_changed();
  journal_mem_table();
  return std::optional<Message>{};
}

BackendSession::Reply BackendSession::set_log_base(Message& m) {
  const auto a = m.get<LogArea>();
  auto l = DirtyLog::map(m.take_fd(0), a.mmap_size, a.mmap_offset, faults_);
  if (!l) return prefixed("SET_LOG_BASE: ", l.error());
  log_ = std::move(*l);
  dev_.memory_changed();
  journal::event(journal::Event::log_base, 0, 0, a.mmap_size);
  log::info("vhost-user: dirty log of {} bytes covers {} MiB of guest memory", a.mmap_size, a.mmap_size * 8 * 4 / 1024);
  return std::optional(u64_reply(m, 0));
}

}  // namespace vrdma::vhost
