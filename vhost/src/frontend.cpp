#include "vrdma/vhost/frontend.hpp"

#include <fmt/format.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

namespace vrdma::vhost {

Result<Frontend> Frontend::connect(const std::string& path, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    auto c = Channel::connect(path);
    if (c) {
      Frontend f;
      f.chan_ = std::move(*c);
      VRDMA_TRY(f.chan_.set_recv_timeout_ms(10000));
      return f;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::move(c).error();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Result<Frontend> Frontend::adopt(UniqueFd sock) {
  Frontend f;
  f.chan_ = Channel(std::move(sock));
  VRDMA_TRY(f.chan_.set_recv_timeout_ms(10000));
  return f;
}

Result<std::optional<Message>> Frontend::request(Message m) {
  std::vector<Message> one;
  one.push_back(std::move(m));
  auto r = requests(std::move(one));
  if (!r) return std::move(r).error();
  return std::move(r->front());
}

Result<std::vector<std::optional<Message>>> Frontend::requests(std::vector<Message> ms) {
  struct Expect {
    const MessageSpec* spec;
    std::uint32_t request;
    bool reply, ack;
  };
  std::vector<Expect> expect;
  expect.reserve(ms.size());
  for (auto& m : ms) {
    const MessageSpec* spec = find_spec(m.hdr.request);
    if (spec == nullptr) return make_error(Errc::invalid_argument, "unknown request");
    const bool has_reply = spec->reply == ReplyRule::always;
    const bool ack = !has_reply && pfeatures_.has(ProtocolFeature::reply_ack);
    if (ack) m.hdr.flags |= kFlagNeedReply;
    expect.push_back({spec, m.hdr.request, has_reply, ack});
  }
  // Every request first, then the replies in order: the backend reads its socket in order and
  // answers each before reading the next, so a batch costs one round trip, not one per message.
  for (auto& m : ms) VRDMA_TRY(chan_.send(m));
  std::vector<std::optional<Message>> out;
  out.reserve(ms.size());
  for (const auto& e : expect) {
    if (!e.reply && !e.ack) {
      out.emplace_back();
      continue;
    }
    auto r = chan_.recv();
    if (!r) return prefixed(fmt::format("waiting for the reply to {}: ", e.spec->name), r.error());
    if (r->hdr.request != e.request || (r->hdr.flags & kFlagReply) == 0)
      return make_error(Errc::protocol_error, fmt::format("{}: backend answered request {} flags {:#x}", e.spec->name,
                                                          r->hdr.request, r->hdr.flags));
    if (e.ack) {
      if (r->hdr.size != 8) return make_error(Errc::protocol_error, fmt::format("{}: ack of {} bytes", e.spec->name, r->hdr.size));
      if (r->get<std::uint64_t>() != 0)
        return make_error(Errc::protocol_error, fmt::format("backend refused {} (ack {})", e.spec->name, r->get<std::uint64_t>()));
      out.emplace_back();
      continue;
    }
    out.emplace_back(std::move(*r));
  }
  return out;
}

namespace {
Result<std::uint64_t> get_u64(Frontend& f, Request r) {
  auto rep = f.request(make_request(r));
  if (!rep) return std::move(rep).error();
  VRDMA_TRY(validate_reply(**rep, r, 8));
  return (*rep)->get<std::uint64_t>();
}
}  // namespace

Status Frontend::simple(Request r, std::uint64_t v) {
  Message m = make_request(r);
  m.set(v);
  auto rep = request(std::move(m));
  if (!rep) return std::move(rep).error();
  return {};
}

Result<VirtioFeatures> Frontend::negotiate(VirtioFeatures want, ProtocolFeatures pwant) {
  auto offered = get_u64(*this, Request::get_features);
  if (!offered) return std::move(offered).error();
  const auto f = want & VirtioFeatures::from_raw(*offered);
  if (f.has(VirtioFeature::protocol_features)) {
    auto po = get_u64(*this, Request::get_protocol_features);
    if (!po) return std::move(po).error();
    const auto p = pwant & ProtocolFeatures::from_raw(*po);
    VRDMA_TRY(simple(Request::set_protocol_features, p.raw()));
    pfeatures_ = p;  // REPLY_ACK applies from the next message on
  }
  VRDMA_TRY(set_owner());
  VRDMA_TRY(set_features(f));
  return f;
}

Status Frontend::set_features(VirtioFeatures f) {
  VRDMA_TRY(simple(Request::set_features, f.raw()));
  features_ = f;
  return {};
}

Status Frontend::set_owner() {
  auto r = request(make_request(Request::set_owner));
  if (!r) return std::move(r).error();
  return {};
}

Result<std::uint64_t> Frontend::get_queue_num() { return get_u64(*this, Request::get_queue_num); }

Result<std::vector<std::uint8_t>> Frontend::get_config(std::uint32_t offset, std::uint32_t size) {
  if (size > kMaxConfigSize) return make_error(Errc::invalid_argument, "config window too large");
  Message m = make_request(Request::get_config);
  m.set(ConfigHeader{offset, size, 0});
  m.hdr.size = static_cast<std::uint32_t>(sizeof(ConfigHeader) + size);
  auto r = request(std::move(m));
  if (!r) return std::move(r).error();
  VRDMA_TRY(validate_reply(**r, Request::get_config, static_cast<std::uint32_t>(sizeof(ConfigHeader) + size)));
  return std::vector<std::uint8_t>((*r)->payload.begin() + sizeof(ConfigHeader),
                                   (*r)->payload.begin() + sizeof(ConfigHeader) + size);
}

Status Frontend::set_mem_table(const GuestRam& ram) {
  const auto t = ram.table();
  if (t.size() > kMaxMemTableRegions) return make_error(Errc::invalid_argument, "too many regions for SET_MEM_TABLE");
  Message m = make_request(Request::set_mem_table);
  m.set(MemTableHeader{static_cast<std::uint32_t>(t.size()), 0});
  for (std::size_t i = 0; i < t.size(); ++i) {
    m.set_bytes(sizeof(MemTableHeader) + i * sizeof(MemRegion), &t[i], sizeof(MemRegion));
    const int dup = ::fcntl(ram.fd(), F_DUPFD_CLOEXEC, 0);
    if (dup < 0) return errno_error(errno, "dup guest RAM fd");
    m.fds.emplace_back(dup);
  }
  m.hdr.size = static_cast<std::uint32_t>(sizeof(MemTableHeader) + t.size() * sizeof(MemRegion));
  auto r = request(std::move(m));
  if (!r) return std::move(r).error();
  return {};
}

Status Frontend::add_mem_regions(const GuestRam& ram) {
  for (const auto& reg : ram.table()) {
    Message m = make_request(Request::add_mem_reg);
    m.set(SingleMemRegion{0, reg});
    const int dup = ::fcntl(ram.fd(), F_DUPFD_CLOEXEC, 0);
    if (dup < 0) return errno_error(errno, "dup guest RAM fd");
    m.fds.emplace_back(dup);
    auto r = request(std::move(m));
    if (!r) return std::move(r).error();
  }
  return {};
}

Status Frontend::set_log_base(int memfd, std::uint64_t bytes) {
  Message m = make_request(Request::set_log_base);
  m.set(LogArea{bytes, 0});
  const int dup = ::fcntl(memfd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return errno_error(errno, "dup log fd");
  m.fds.emplace_back(dup);
  auto r = request(std::move(m));
  if (!r) return std::move(r).error();
  return validate_reply(**r, Request::set_log_base, 8);
}

Result<Message> Frontend::vring_fd(Request r, std::uint16_t index, int fd) {
  Message m = make_request(r);
  m.set(std::uint64_t{index});
  const int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return errno_error(errno, "dup eventfd");
  m.fds.emplace_back(dup);
  return m;
}

Status Frontend::start_queue(std::uint16_t index, const DriverQueue& q, std::optional<std::uint32_t> base) {
  const QueueStart one{index, &q, base};
  return start_queues(std::span(&one, 1));
}

Status Frontend::start_queues(std::span<const QueueStart> starts) {
  std::vector<Message> ms;
  ms.reserve(starts.size() * 6);
  for (const auto& s : starts) {
    const std::uint16_t index = s.index;
    const DriverQueue& q = *s.queue;
    if (queues_.size() <= index) queues_.resize(index + 1u);
    QueueFds& f = queues_[index];
    f.kick = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    f.call = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!f.kick || !f.call) return errno_error(errno, "eventfd");
    Message num = make_request(Request::set_vring_num);
    num.set(VringState{index, q.size()});
    ms.push_back(std::move(num));
    Message b = make_request(Request::set_vring_base);
    b.set(VringState{index, s.base.value_or(q.initial_base())});
    ms.push_back(std::move(b));
    Message a = make_request(Request::set_vring_addr);
    a.set(VringAddr{index, 0, q.uaddr(q.desc_gpa()), q.uaddr(q.device_gpa()), q.uaddr(q.driver_gpa()), q.device_gpa()});
    ms.push_back(std::move(a));
    auto call = vring_fd(Request::set_vring_call, index, f.call.get());
    if (!call) return std::move(call).error();
    ms.push_back(std::move(*call));
    auto kick = vring_fd(Request::set_vring_kick, index, f.kick.get());
    if (!kick) return std::move(kick).error();
    ms.push_back(std::move(*kick));
    if (features_.has(VirtioFeature::protocol_features)) {
      Message e = make_request(Request::set_vring_enable);
      e.set(VringState{index, 1});
      ms.push_back(std::move(e));
    }
  }
  auto r = requests(std::move(ms));
  if (!r) return std::move(r).error();
  return {};
}

Result<std::uint32_t> Frontend::get_vring_base(std::uint16_t index) {
  auto r = get_vring_bases(std::vector<std::uint16_t>{index});
  if (!r) return std::move(r).error();
  return r->front();
}

Result<std::vector<std::uint32_t>> Frontend::get_vring_bases(std::span<const std::uint16_t> indices) {
  std::vector<Message> ms;
  ms.reserve(indices.size());
  for (const auto index : indices) {
    Message m = make_request(Request::get_vring_base);
    m.set(VringState{index, 0});
    ms.push_back(std::move(m));
  }
  auto r = requests(std::move(ms));
  if (!r) return std::move(r).error();
  std::vector<std::uint32_t> bases;
  bases.reserve(r->size());
  for (auto& rep : *r) {
    VRDMA_TRY(validate_reply(*rep, Request::get_vring_base, sizeof(VringState)));
    bases.push_back(rep->get<VringState>().num);
  }
  return bases;
}

Status Frontend::kick(std::uint16_t index) {
  if (index >= queues_.size() || !queues_[index].kick) return make_error(Errc::bad_state, "queue not started");
  const std::uint64_t one = 1;
  if (::write(queues_[index].kick.get(), &one, sizeof one) != sizeof one) return errno_error(errno, "kick");
  return {};
}

int Frontend::call_fd(std::uint16_t index) const {
  return index < queues_.size() ? queues_[index].call.get() : -1;
}

Result<bool> Frontend::wait_call(std::uint16_t index, int timeout_ms) {
  const int fd = call_fd(index);
  if (fd < 0) return make_error(Errc::bad_state, "queue not started");
  pollfd p{fd, POLLIN, 0};
  const int n = ::poll(&p, 1, timeout_ms);
  if (n < 0) return errno_error(errno, "poll call eventfd");
  if (n == 0) return false;
  std::uint64_t v;
  [[maybe_unused]] auto r = ::read(fd, &v, sizeof v);
  return true;
}

Result<Frontend::Inflight> Frontend::get_inflight_fd(std::uint16_t num_queues, std::uint16_t queue_size) {
  Message m = make_request(Request::get_inflight_fd);
  m.set(InflightInfo{0, 0, num_queues, queue_size, 0});
  auto r = request(std::move(m));
  if (!r) return std::move(r).error();
  VRDMA_TRY(validate_reply(**r, Request::get_inflight_fd, sizeof(InflightInfo)));
  if ((*r)->fds.size() != 1) return make_error(Errc::protocol_error, "GET_INFLIGHT_FD reply carried no fd");
  Inflight inf;
  inf.info = (*r)->get<InflightInfo>();
  inf.fd = (*r)->take_fd(0);
  return inf;
}

Status Frontend::set_inflight_fd(const Inflight& inf) {
  Message m = make_request(Request::set_inflight_fd);
  m.set(inf.info);
  const int dup = ::fcntl(inf.fd.get(), F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return errno_error(errno, "dup inflight fd");
  m.fds.emplace_back(dup);
  auto r = request(std::move(m));
  if (!r) return std::move(r).error();
  return {};
}

}  // namespace vrdma::vhost
