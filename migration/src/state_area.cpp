// The state area (virtio_rdma.hpp kStateQueue; docs/virtio-rdma.md "State in guest memory"):
// the device state travels inside the guest's own memory, so any frontend that live-migrates
// the guest's RAM with the vhost-user dirty log (QEMU 7.2 behind the vhost-user-blk carrier
// included) moves it, with no channel between the source and destination backends.
#include <zlib.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "device_state_impl.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::migration {
namespace {

std::string gid_text(const std::uint8_t* g) {
  nicdrv::Gid gid{};
  std::memcpy(gid.raw.data(), g, gid.raw.size());
  return gid.str();
}

std::string mac_text(const std::uint8_t* m) {
  return fmt::format("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5]);
}

// Visits the pieces of bytes [off, off + len) of a chain's buffers in order: fn(gpa, done, n),
// `done` being the bytes visited before this piece.
template <typename Fn>
Status over_chain(const DescChain& c, std::uint64_t off, std::uint64_t len, const char* what, Fn&& fn) {
  std::uint64_t done = 0;
  for (const auto& b : c.bufs) {
    if (done == len) break;
    if (off >= b.len) {
      off -= b.len;
      continue;
    }
    const std::uint64_t n = std::min<std::uint64_t>(b.len - off, len - done);
    VRDMA_TRY(fn(b.gpa + off, done, n));
    done += n;
    off = 0;
  }
  if (done != len) return make_error(Errc::invalid_argument, fmt::format("{} past the end of the state area", what));
  return {};
}

}  // namespace

// kStateQueue: keep the newest area the driver posts, return the one it replaces.
void DeviceState::Impl::state_queue(Queue& q) {
  while (auto chain = q.pop()) {
    std::string why;
    if (chain->readable != 0) why = "it has device-readable buffers";
    else if (chain->writable < vd::kMinStateArea)
      why = fmt::format("its {} bytes are fewer than the {} a state area needs", chain->writable, vd::kMinStateArea);
    else if (chain->writable > vd::kMaxStateArea)
      why = fmt::format("its {} bytes are more than the {} a state area may have", chain->writable, vd::kMaxStateArea);
    if (!why.empty()) {
      if (d.should_log_refusal(device::DeviceModel::Refused::command)) log::warn("virtio-rdma: state area refused ({}); returned unused", why);
      if (!q.push(*chain, 0).ok()) return;
      continue;
    }
    if (state_area && !q.push(*state_area, 0).ok()) return;
    state_area = std::move(*chain);
    state_area_asked = 0;
    log::debug("virtio-rdma: state area of {} bytes posted", state_area->writable);
  }
  check_state_area();
}

vd::StateCensus DeviceState::Impl::census() const {
  vd::StateCensus c;
  c.pds = d.pds.size();
  c.ahs = d.ahs.size();
  c.srqs = d.srqs.size();
  c.mrs = d.mr_count();
  for (const auto& [h, mr] : d.mrs) c.mr_pages += mr.observer->pages().size();
  for (const auto& [h, mr] : d.fast_mrs) c.mr_pages += mr.max_pages;
  c.cqs = d.cqs.size();
  for (const auto& [h, cq] : d.cqs) c.cqes += cq.depth;
  c.qps = d.qps.size();
  for (const auto& [h, qp] : d.qps) {
    c.send_wrs += qp.sq.depth;
    c.recv_wrs += qp.rq.depth;
    c.inline_bytes += std::uint64_t{qp.sq.depth} * qp.max_inline;
    c.remote_rkeys += qp.remote_rkeys.size();
  }
  for (const auto& [h, s] : d.srqs) c.recv_wrs += s.ring.depth;  // the receives an SRQ holds travel with it
  c.db_rings = d.db_rings.size();
  return c;
}

// After objects were created: ask the driver for a larger area (an event) when the state may
// not fit the one it posted. Drivers that post no area are not asked.
void DeviceState::Impl::check_state_area() {
  if (!state_area) return;
  const std::uint64_t bound = vd::state_area_bound(census());
  // Asked for twice the bound: ask again only once the state may outgrow that, too (a driver
  // that cannot grow its area is not asked at every command).
  if (bound <= state_area->writable || bound <= state_area_asked) return;
  if (state_area_asked >= vd::kMaxStateArea) {
    // Asked for the largest area already: the state may outgrow any area (a live migration then
    // needs a source vrdmad that sends it over the network). Said once; asked no more.
    if (state_area_asked == vd::kMaxStateArea) {
      log::warn("virtio-rdma: the device state may reach {} bytes, more than the largest state area ({} MiB); a live "
                "migration that carries it in guest memory fails if it does (send it over the network instead: vrdmactl device migrate --control SOCKET --to tcp:IP:PORT)",
                bound, vd::kMaxStateArea >> 20);
      state_area_asked = vd::kMaxStateArea + 1;
    }
    return;
  }
  const std::uint64_t want = std::min<std::uint64_t>(2 * bound, vd::kMaxStateArea);
  state_area_asked = want;
  log::info("virtio-rdma: the device state may reach {} bytes, more than the {}-byte state area; asking the driver "
            "for {} KiB", bound, state_area->writable, want >> 10);
  d.queue_event(vd::EventType::state_area_small, 0, static_cast<std::uint32_t>((want + 1023) >> 10));
}

// Zeroes the header's magic: the area then holds no state for any later reader.
Status DeviceState::Impl::clear_state_magic(const GuestView& g, const DescChain& c) const {
  const std::uint32_t zero = 0;
  return write_chain(g, c, 0, &zero, sizeof zero);
}

// The body first, the header (with its magic) last: a torn write is never a valid header.
Status DeviceState::Impl::write_state_area(const vd::StateAreaHeader& h, const void* body, std::uint64_t len) {
  const GuestView g = d.view();
  const vd::StateAreaHeader blank{};
  VRDMA_TRY(write_chain(g, *state_area, 0, &blank, sizeof blank));
  if (len > 0) VRDMA_TRY(write_chain(g, *state_area, sizeof h, body, len));
  VRDMA_TRY(write_chain(g, *state_area, 0, &h, sizeof h));
  state_in_area = true;
  return {};
}

Status DeviceState::Impl::save_state_to_guest() {
  if (!state_area)
    return make_error(Errc::not_found, "the driver posted no state area (kStateQueue): the device state cannot travel "
                                       "in guest memory");
  auto blob = save_state();
  vd::StateAreaHeader h{};
  h.magic = vd::kStateAreaMagic;
  h.state_version = kStateVersion;
  std::memcpy(h.mac, d.opts.mac, sizeof h.mac);
  if (!blob) {
    // The destination must know that objects existed and did not come, and why: it runs the
    // guest without them and tells its driver (DEVICE_FATAL) instead of leaving it waiting.
    const std::string why = blob.error().message.substr(0, std::min<std::size_t>(vd::kMaxLostReason,
                                                                                  state_area->writable - sizeof h));
    h.status = static_cast<std::uint32_t>(vd::StateAreaStatus::not_saved);
    h.length = why.size();
    (void)write_state_area(h, why.data(), why.size());
    return std::move(blob).error();
  }
  h.need = sizeof h + blob->size();
  if (auto gid = d.engine->query_gid(d.gid0_index, 1); gid) std::memcpy(h.gid, gid->gid.raw.data(), sizeof h.gid);
  if (h.need > state_area->writable) {
    h.status = static_cast<std::uint32_t>(vd::StateAreaStatus::too_small);
    (void)write_state_area(h, nullptr, 0);
    return make_error(Errc::no_memory, fmt::format("the device state ({} bytes) does not fit the {}-byte state area the "
                                                   "driver posted; the destination will not get it",
                                                   h.need, state_area->writable));
  }
  h.status = static_cast<std::uint32_t>(vd::StateAreaStatus::state);
  h.length = blob->size();
  h.crc32 = static_cast<std::uint32_t>(::crc32(0L, blob->data(), static_cast<uInt>(blob->size())));
  VRDMA_TRY(write_state_area(h, blob->data(), blob->size()));
  state_saved_bytes = blob->size();
  return {};
}

void DeviceState::Impl::withdraw_state_from_guest() {
  if (!state_in_area) return;
  state_in_area = false;
  if (!state_area) return;
  // The rings run here again: the guest did not leave (a failed migration). The state written
  // at the stop is history now; a backend started later on this guest (a restart after a crash)
  // must not take it for the guest's current objects.
  if (auto s = clear_state_magic(d.view(), *state_area); !s.ok())
    log::warn("virtio-rdma: the device state written at the stop could not be withdrawn from guest memory: {}",
              s.error().message);
  else
    log::info("virtio-rdma: the guest runs here again; the device state written at the stop is withdrawn");
}

Result<bool> DeviceState::Impl::load_state_from_guest() {
  if (d.host == nullptr) return make_error(Errc::bad_state, "no frontend session");
  state_lost.clear();  // said by this area only
  auto chain = d.host->last_avail_chain(vd::kStateQueue);
  if (!chain) {
    if (chain.error().is(Errc::not_found)) return false;  // the driver never posted an area: no state
    return std::move(chain).error();
  }
  const GuestView g = d.view();
  if (chain->readable != 0 || chain->writable < sizeof(vd::StateAreaHeader))
    return make_error(Errc::protocol_error, "the buffer kept on the state queue is not a state area");
  vd::StateAreaHeader h{};
  VRDMA_TRY(read_chain(g, *chain, 0, &h, sizeof h));
  if (h.magic != vd::kStateAreaMagic) {
    state_area = std::move(*chain);
    return false;
  }
  if (h.status == static_cast<std::uint32_t>(vd::StateAreaStatus::too_small) ||
      h.status == static_cast<std::uint32_t>(vd::StateAreaStatus::not_saved)) {
    // The source had objects and could not send them: nothing to load, and the guest must hear it.
    std::string why;
    if (h.status == static_cast<std::uint32_t>(vd::StateAreaStatus::too_small)) {
      why = fmt::format("the source's device state ({} bytes) did not fit the guest's {}-byte state area", h.need,
                        chain->writable);
    } else {
      std::string said(static_cast<std::size_t>(std::min<std::uint64_t>(
                           {h.length, vd::kMaxLostReason, chain->writable - sizeof h})),
                       '\0');
      VRDMA_TRY(read_chain(g, *chain, sizeof h, said.data(), said.size()));
      for (auto& c : said)
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';  // guest bytes
      why = "the source could not save the device state: " + said;
    }
    VRDMA_TRY(clear_state_magic(g, *chain));
    state_area = std::move(*chain);
    state_lost = std::move(why);
    return false;
  }
  if (h.status != static_cast<std::uint32_t>(vd::StateAreaStatus::state))
    return make_error(Errc::protocol_error, fmt::format("the state area has status {}", h.status));
  if (!state_version_readable(h.state_version))
    return make_error(Errc::not_supported, fmt::format("the state area holds device state version {}; this vrdmad reads "
                                                       "versions {} to {}: run the same vrdma release on both hosts",
                                                       h.state_version, kOldestStateVersion, kStateVersion));
  if (std::memcmp(h.mac, d.opts.mac, sizeof h.mac) != 0)
    return make_error(Errc::invalid_argument, fmt::format("the guest's MAC is {} but this vrdmad serves MAC {}: start it "
                                                          "with --mac {}", mac_text(h.mac), mac_text(d.opts.mac),
                                                          mac_text(h.mac)));
  if (auto gid = d.engine->query_gid(d.gid0_index, 1); gid && std::memcmp(h.gid, gid->gid.raw.data(), sizeof h.gid) != 0)
    return make_error(Errc::invalid_argument, fmt::format("the guest's GID is {} but this vrdmad's engine has GID {}: "
                                                          "start it with --engine on the guest's own address",
                                                          gid_text(h.gid), gid->gid.str()));
  if (h.length > chain->writable - sizeof h || h.length > vd::kMaxStateArea)
    return make_error(Errc::protocol_error, fmt::format("the state area claims {} bytes of state in a {}-byte area",
                                                        h.length, chain->writable));
  std::vector<std::uint8_t> blob(h.length);
  VRDMA_TRY(read_chain(g, *chain, sizeof h, blob.data(), blob.size()));
  if (static_cast<std::uint32_t>(::crc32(0L, blob.data(), static_cast<uInt>(blob.size()))) != h.crc32)
    return make_error(Errc::protocol_error, "the device state in guest memory fails its CRC check (torn or altered)");
  VRDMA_TRY(load_state(blob));
  state_saved_bytes = blob.size();
  // Never load the same state twice (a later restart of this backend, say).
  VRDMA_TRY(clear_state_magic(g, *chain));
  state_area = std::move(*chain);
  return true;
}

// Reads or writes `len` bytes at byte `off` of a chain's buffers (the state area is writable
// by the device; a destination reads it back as plain guest memory).
Status DeviceState::Impl::read_chain(const GuestView& g, const DescChain& c, std::uint64_t off, void* dst,
                                    std::uint64_t len) const {
  auto* out = static_cast<std::uint8_t*>(dst);
  return over_chain(c, off, len, "read", [&](std::uint64_t gpa, std::uint64_t done, std::uint64_t n) {
    return g.read(gpa, out + done, n);
  });
}

Status DeviceState::Impl::write_chain(const GuestView& g, const DescChain& c, std::uint64_t off, const void* src,
                                     std::uint64_t len) const {
  const auto* in = static_cast<const std::uint8_t*>(src);
  return over_chain(c, off, len, "write", [&](std::uint64_t gpa, std::uint64_t done, std::uint64_t n) {
    return g.write(gpa, in + done, n);
  });
}

}  // namespace vrdma::migration
