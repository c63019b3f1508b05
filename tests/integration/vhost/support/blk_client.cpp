#include "blk_client.hpp"

#include <fmt/format.h>
#include <poll.h>

#include <chrono>
#include <cstring>

namespace vrdma::test {

using namespace vhost;

std::vector<std::uint8_t> pattern(std::uint64_t seed, std::size_t len) {
  std::vector<std::uint8_t> v(len);
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<std::uint8_t>(x);
  }
  return v;
}

std::uint64_t checksum(const std::uint8_t* p, std::size_t len) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (std::size_t i = 0; i < len; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

Result<std::unique_ptr<BlkClient>> BlkClient::connect(const std::string& sock, BlkClientOptions o) {
  std::unique_ptr<BlkClient> c(new BlkClient());
  c->o_ = o;
  auto ram = GuestRam::create(GuestRam::vm_layout(o.ram_mib));
  if (!ram) return std::move(ram).error();
  c->ram_ = std::move(*ram);
  auto fe = Frontend::connect(sock);
  if (!fe) return std::move(fe).error();
  c->fe_ = std::make_unique<Frontend>(std::move(*fe));
  VRDMA_TRY(c->setup_rings(true));
  return c;
}

Status BlkClient::setup_rings(bool fresh, const std::vector<std::uint32_t>* bases) {
  VirtioFeatures want{VirtioFeature::version_1, VirtioFeature::protocol_features, VirtioFeature::blk_flush,
                      VirtioFeature::blk_mq, VirtioFeature::blk_seg_max, VirtioFeature::blk_blk_size};
  if (o_.packed) want.set(VirtioFeature::ring_packed);
  if (o_.event_idx) want.set(VirtioFeature::ring_event_idx);
  if (o_.indirect) want.set(VirtioFeature::ring_indirect_desc);
  ProtocolFeatures pwant{ProtocolFeature::mq, ProtocolFeature::reply_ack, ProtocolFeature::config,
                         ProtocolFeature::log_shmfd, ProtocolFeature::status};
  if (o_.add_mem_reg) pwant.set(ProtocolFeature::configure_mem_slots);
  if (o_.inflight) pwant.set(ProtocolFeature::inflight_shmfd);
  auto acked = fe_->negotiate(want, pwant);
  if (!acked) return std::move(acked).error();
  if (!acked->subset_of(want) || !(want & *acked).has(VirtioFeature::version_1))
    return make_error(Errc::not_supported, "backend lacks VERSION_1");
  if (o_.packed != acked->has(VirtioFeature::ring_packed))
    return make_error(Errc::not_supported, "backend did not ack the ring layout we asked for");
  auto nq = fe_->get_queue_num();
  if (!nq) return std::move(nq).error();
  if (*nq < o_.queues) return make_error(Errc::not_supported, fmt::format("backend has only {} queues", *nq));
  if (o_.add_mem_reg) VRDMA_TRY(fe_->add_mem_regions(ram_));
  else VRDMA_TRY(fe_->set_mem_table(ram_));
  if (o_.inflight) {
    if (!have_inflight_) {
      auto inf = fe_->get_inflight_fd(o_.queues, o_.queue_size);
      if (!inf) return std::move(inf).error();
      inflight_ = std::move(*inf);
      have_inflight_ = true;
    }
    VRDMA_TRY(fe_->set_inflight_fd(inflight_));
  }
  if (fresh) {
    qs_.clear();
    pq_.assign(o_.queues, {});
    for (std::uint16_t i = 0; i < o_.queues; ++i) {
      auto q = DriverQueue::create(ram_, o_.queue_size, o_.packed, o_.event_idx);
      if (!q) return std::move(q).error();
      qs_.push_back(std::move(*q));
      for (std::uint16_t s = 0; s < o_.queue_size; ++s) {
        auto h = ram_.alloc(16, 16);
        auto st = ram_.alloc(1, 1);
        auto d = ram_.alloc(o_.max_io, 512);
        if (!h || !st || !d) return make_error(Errc::no_memory, "guest RAM too small for the request slots");
        pq_[i].slots.push_back({*h, *d, *st});
        pq_[i].free.push_back(s);
      }
    }
  }
  for (std::uint16_t i = 0; i < o_.queues; ++i) {
    std::optional<std::uint32_t> base;
    if (bases != nullptr) {
      base = bases->at(i);
    } else if (!fresh && !o_.packed) {
      // As QEMU after a backend crash: resume at the used index the ring shows.
      std::uint16_t used;
      std::memcpy(&used, ram_.host(qs_[i].device_gpa() + 2, 2), 2);
      base = used;
    }
    VRDMA_TRY(fe_->start_queue(i, qs_[i], base));
  }
  return {};
}

Status BlkClient::reconnect(const std::string& sock) {
  auto fe = Frontend::connect(sock);
  if (!fe) return std::move(fe).error();
  fe_ = std::make_unique<Frontend>(std::move(*fe));
  VRDMA_TRY(setup_rings(false));
  for (std::uint16_t i = 0; i < o_.queues; ++i) VRDMA_TRY(fe_->kick(i));
  return {};
}

Status BlkClient::switch_to(const std::string& sock, GuestRam ram, const std::vector<std::uint32_t>& bases) {
  if (bases.size() != o_.queues) return make_error(Errc::invalid_argument, "one ring base per queue is needed");
  // The queues hold a pointer to ram_: moving the copy in makes them drive the copy.
  ram_ = std::move(ram);
  auto fe = Frontend::connect(sock);
  if (!fe) return std::move(fe).error();
  fe_ = std::make_unique<Frontend>(std::move(*fe));
  have_inflight_ = false;  // the destination backend gets an inflight area of its own
  VRDMA_TRY(setup_rings(false, &bases));
  for (std::uint16_t i = 0; i < o_.queues; ++i) VRDMA_TRY(fe_->kick(i));
  return {};
}

Status BlkClient::submit(BlkOp& op, std::size_t index) {
  PerQueue& p = pq_[op.queue];
  const std::uint16_t slot = p.free.back();
  const Slot& s = p.slots[slot];
  const std::uint32_t len = op.type == kBlkOut ? static_cast<std::uint32_t>(op.data.size()) : op.len;
  if (len > o_.max_io) return make_error(Errc::invalid_argument, "I/O larger than a slot");
  BlkReqHeader h{op.type, 0, op.sector};
  std::memcpy(ram_.host(s.hdr, 16), &h, 16);
  *ram_.host(s.status, 1) = 0xff;
  if (op.type == kBlkOut) std::memcpy(ram_.host(s.data, len), op.data.data(), len);
  const bool w = op.type != kBlkOut;
  std::vector<DriverBuf> bufs{{s.hdr, 16, false}};
  // Split larger data in two descriptors so chains have more than three.
  if (len > 4096) {
    bufs.push_back({s.data, 4096, w});
    bufs.push_back({s.data + 4096, len - 4096, w});
  } else if (len > 0) {
    bufs.push_back({s.data, len, w});
  }
  bufs.push_back({s.status, 1, true});
  auto id = qs_[op.queue].add(bufs, o_.indirect);
  if (!id) return std::move(id).error();
  p.free.pop_back();
  p.inflight[*id] = {index, slot};
  op.data_gpa = s.data;
  op.status_gpa = s.status;
  return {};
}

Status BlkClient::reap(std::vector<BlkOp>& ops, std::size_t& done) {
  for (std::uint16_t q = 0; q < o_.queues; ++q) {
    while (auto u = qs_[q].get_used()) {
      auto it = pq_[q].inflight.find(u->id);
      if (it == pq_[q].inflight.end())
        return make_error(Errc::protocol_error, fmt::format("device returned unknown id {} on queue {}", u->id, q));
      BlkOp& op = ops[it->second.first];
      const Slot& s = pq_[q].slots[it->second.second];
      op.status = *ram_.host(s.status, 1);
      if (op.type == kBlkIn) {
        op.data.assign(ram_.host(s.data, op.len), ram_.host(s.data, op.len) + op.len);
        if (op.status == kBlkOk && u->len != op.len + 1)
          return make_error(Errc::protocol_error, fmt::format("used length {} for a read of {}", u->len, op.len));
      }
      pq_[q].free.push_back(it->second.second);
      pq_[q].inflight.erase(it);
      ++done;
    }
  }
  return {};
}

Status BlkClient::post(std::vector<BlkOp>& ops, bool kick) {
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (pq_[ops[i].queue].free.empty()) return make_error(Errc::would_block, "more ops than slots");
    VRDMA_TRY(submit(ops[i], i));
  }
  for (std::uint16_t q = 0; q < o_.queues; ++q) {
    qs_[q].publish();
    if (kick && qs_[q].needs_kick()) VRDMA_TRY(fe_->kick(q));
  }
  return {};
}

Status BlkClient::collect(std::vector<BlkOp>& ops, int timeout_ms) {
  std::size_t done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto outstanding = [&] {
    std::size_t n = 0;
    for (const auto& p : pq_) n += p.inflight.size();
    return n;
  };
  while (outstanding() > 0) {
    VRDMA_TRY(reap(ops, done));
    if (outstanding() == 0) break;
    if (std::chrono::steady_clock::now() > deadline)
      return make_error(Errc::timeout, fmt::format("{} requests did not complete", outstanding()));
    std::vector<pollfd> p;
    for (std::uint16_t q = 0; q < o_.queues; ++q) p.push_back({fe_->call_fd(q), POLLIN, 0});
    ::poll(p.data(), p.size(), 20);
    for (std::uint16_t q = 0; q < o_.queues; ++q) (void)fe_->wait_call(q, 0);
  }
  return {};
}

Status BlkClient::run(std::vector<BlkOp>& ops, int timeout_ms, bool allow_errors) {
  std::vector<std::size_t> next(o_.queues, 0);
  std::vector<std::vector<std::size_t>> byq(o_.queues);
  for (std::size_t i = 0; i < ops.size(); ++i) byq[ops[i].queue % o_.queues].push_back(i);
  std::size_t done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (done < ops.size()) {
    for (std::uint16_t q = 0; q < o_.queues; ++q) {
      bool added = false;
      while (next[q] < byq[q].size() && !pq_[q].free.empty() &&
             qs_[q].free_slots() >= (o_.indirect ? 1 : 4)) {
        VRDMA_TRY(submit(ops[byq[q][next[q]]], byq[q][next[q]]));
        ++next[q];
        added = true;
      }
      if (added) {
        qs_[q].publish();
        if (qs_[q].needs_kick()) VRDMA_TRY(fe_->kick(q));
      }
    }
    std::vector<pollfd> p;
    for (std::uint16_t q = 0; q < o_.queues; ++q) p.push_back({fe_->call_fd(q), POLLIN, 0});
    ::poll(p.data(), p.size(), 10);
    for (std::uint16_t q = 0; q < o_.queues; ++q) (void)fe_->wait_call(q, 0);
    VRDMA_TRY(reap(ops, done));
    if (std::chrono::steady_clock::now() > deadline)
      return make_error(Errc::timeout, fmt::format("{} of {} requests did not complete", ops.size() - done, ops.size()));
  }
  if (!allow_errors)
    for (const auto& op : ops)
      if (op.status != kBlkOk)
        return make_error(Errc::io_error, fmt::format("request type {} sector {} failed with status {}", op.type,
                                                      op.sector, op.status));
  return {};
}

}  // namespace vrdma::test
