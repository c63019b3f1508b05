// Doorbell rings (docs/virtio-rdma.md "Doorbell rings"): a process's doorbells written into its
// own guest memory, with no system call. The driver makes one per process (CREATE_DB_RING) and
// names it when it creates that process's CQs, QPs and SRQs; the process appends records and
// notifies the doorbell queue (its notify address is mapped into the process). Every
// doorbell-queue notification, polling round and resume takes each ring's new records. A ring
// is the process's: its producer and records are untrusted, a record acts only on an object
// made with that ring, and a ring written wrong costs only its own doorbells.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>

#include <fmt/format.h>

#include "command_handlers.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::device {

namespace {
constexpr std::uint64_t kProducerOffset = offsetof(vd::DbRingHeader, producer);
constexpr std::uint64_t kConsumedOffset = offsetof(vd::DbRingHeader, consumed);
constexpr std::uint64_t kFlagsOffset = offsetof(vd::DbRingHeader, flags);
}  // namespace

void DeviceModel::ring_doorbell_rings(const vhost::GuestView& g) {
  if (paused) return;
  std::array<vd::Doorbell, 64> recs;
  for (auto& [number, ring] : db_rings) {
    auto producer = g.read_obj<std::uint32_t>(ring.gpa + kProducerOffset);
    if (!producer) continue;  // checked at creation; a new memory table may have dropped it
    // The records before the producer were written before it (the process's release store).
    std::atomic_thread_fence(std::memory_order_acquire);
    const std::uint32_t ahead = *producer - ring.consumed;
    if (ahead == 0) continue;
    if (ahead > ring.depth) {
      ++st.doorbell_errors;
      if (should_log_refusal(Refused::doorbell))
        log::warn("virtio-rdma: doorbell ring {}: producer {} is more than the ring's {} records ahead of the device "
                  "({}); its records are ignored until it is not",
                  number, *producer, ring.depth, ring.consumed);
      continue;
    }
    for (std::uint32_t left = ahead; left != 0;) {
      const std::uint32_t slot = ring.consumed & (ring.depth - 1);
      const std::uint32_t n = std::min({left, static_cast<std::uint32_t>(recs.size()), ring.depth - slot});
      const std::uint64_t at = ring.gpa + vd::kDbRingRecordsOffset + std::uint64_t{slot} * sizeof(vd::Doorbell);
      if (!g.read(at, recs.data(), std::uint64_t{n} * sizeof(vd::Doorbell)).ok()) break;
      ring.consumed += n;
      left -= n;
      for (std::uint32_t i = 0; i < n; ++i) {
        ++st.doorbells;
        ++st.ring_doorbells;
        ring_doorbell(g, recs[i], number);
      }
    }
    (void)g.write_obj(ring.gpa + kConsumedOffset, ring.consumed);
  }
}

bool DeviceModel::db_ring_depth_ok(std::uint32_t depth) {
  return cmd::pow2(depth) && depth >= vd::kDbRingMinDepth && depth <= vd::kDbRingMaxDepth;
}

std::optional<std::string> DeviceModel::db_ring_layout_error(const vhost::GuestView& g, std::uint64_t gpa,
                                                             std::uint32_t depth) {
  if (!db_ring_depth_ok(depth))
    return fmt::format("doorbell ring depth {} is not a power of two from {} to {}", depth, vd::kDbRingMinDepth,
                       vd::kDbRingMaxDepth);
  return cmd::check_area(g, gpa, virtio_rdma_db_ring_bytes(depth), 64, "the doorbell ring");
}

void DeviceModel::set_db_rings_polled(const vhost::GuestView& g, bool polled) {
  const std::uint32_t flags = polled ? vd::kDbRingNoKick : 0;
  for (auto& [number, ring] : db_rings) (void)g.write_obj(ring.gpa + kFlagsOffset, flags);
  db_rings_polled = polled;
  // A process stores its producer, then reads the flags; the device clears the flags, then
  // reads the producers (the caller runs the rings once more): one of the two sees the other.
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void DeviceModel::count_db_ring_user(std::uint32_t ring, int delta) {
  if (ring == 0) return;
  if (auto it = db_rings.find(ring); it != db_rings.end())
    it->second.users = static_cast<std::uint32_t>(static_cast<int>(it->second.users) + delta);
}

std::uint32_t DeviceModel::new_db_ring_number() {
  for (std::uint32_t tries = 0; tries < 0xffff; ++tries) {
    const std::uint32_t n = next_db_ring_;
    next_db_ring_ = next_db_ring_ == 0xffff ? 1 : next_db_ring_ + 1;
    if (!db_rings.contains(n)) return n;
  }
  return 0;
}

namespace cmd {

std::optional<Refusal> Handlers::db_ring_known(std::uint32_t ring, std::string_view command) const {
  if (ring == 0 || d.db_rings.contains(ring)) return std::nullopt;
  return refuse(vd::Status::not_found, fmt::format("{} names no doorbell ring {}", command, ring));
}

Reply Handlers::create_db_ring() {
  const auto r = req_as<vd::CreateDbRingReq>(body);
  if (auto e = room(d.db_rings.size(), vd::kMaxDbRings, "doorbell rings")) return *e;
  if (auto why = DeviceModel::db_ring_layout_error(g, r.gpa, r.depth))
    return refuse(DeviceModel::db_ring_depth_ok(r.depth) ? vd::Status::fault : vd::Status::invalid, *why);
  auto producer = g.read_obj<std::uint32_t>(r.gpa + kProducerOffset);
  if (!producer) return refuse(vd::Status::fault, "the doorbell ring's header cannot be read");
  const auto n = d.new_db_ring_number();
  if (n == 0) return refuse(vd::Status::no_space, "every doorbell ring number is in use");
  // It starts empty where the driver left it (a ring made again over the same memory after a
  // device-fatal event keeps its process's producer).
  DbRingObj ring{r.gpa, r.depth, *producer, 0};
  (void)g.write_obj(r.gpa + kConsumedOffset, ring.consumed);
  (void)g.write_obj(r.gpa + kFlagsOffset, d.db_rings_polled ? vd::kDbRingNoKick : std::uint32_t{0});
  d.db_rings.emplace(n, ring);
  return bytes_of(vd::HandleResp{n, 0});
}

Reply Handlers::destroy_db_ring() {
  auto found = to_destroy(d.db_rings, "doorbell ring", "CQs, QPs and SRQs");
  if (auto* no = std::get_if<Refusal>(&found)) return *no;
  d.db_rings.erase(std::get<0>(found));
  return std::vector<std::uint8_t>{};
}

}  // namespace cmd

}  // namespace vrdma::device
