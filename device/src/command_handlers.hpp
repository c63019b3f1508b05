// The control commands' handlers (private to device/src): commands.cpp holds the table of
// commands, the control queue and the queries, PDs, MRs and CQs; commands_qp.cpp the QPs, AHs
// and SRQs. Every field is checked before the engine sees it; a refused command gets an
// errno-valued status and one log sentence.
#pragma once

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "vrdma/device/model.hpp"

namespace vrdma::device::cmd {

inline constexpr std::size_t kMaxRequest = 256;

// A refusal: the status for the guest and the sentence for the operator's log.
struct Refusal {
  vd::Status status;
  std::string why;
};
template <class T>
using CmdResult = std::variant<T, Refusal>;

inline Refusal refuse(vd::Status s, std::string why) { return {s, std::move(why)}; }

// The command's status: the errno of the error's kind (common/result.hpp), when the contract has
// that status; EIO otherwise.
inline vd::Status status_of(const Error& e) {
  const int n = errno_of(e.errc());
  switch (n) {
    case VIRTIO_RDMA_S_PERM: case VIRTIO_RDMA_S_NOT_FOUND: case VIRTIO_RDMA_S_NO_MEMORY: case VIRTIO_RDMA_S_FAULT:
    case VIRTIO_RDMA_S_BUSY: case VIRTIO_RDMA_S_INVALID: case VIRTIO_RDMA_S_NO_SPACE: case VIRTIO_RDMA_S_NOT_SUPPORTED:
      return static_cast<vd::Status>(n);
    default: return vd::Status::io;
  }
}

inline bool pow2(std::uint32_t v) { return v != 0 && std::has_single_bit(v); }

// A ring or block the device will read and write: aligned and wholly inside one region.
inline std::optional<std::string> check_area(const vhost::GuestView& g, std::uint64_t gpa, std::uint64_t len, std::uint64_t align,
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

  // A per-guest limit on objects of one kind: refused once the guest has `limit` of them.
  [[nodiscard]] static std::optional<Refusal> room(std::size_t have, std::uint32_t limit, std::string_view what) {
    if (have < limit) return std::nullopt;
    return refuse(vd::Status::no_space, fmt::format("the guest already has {} {} (limit {})", have, what, limit));
  }
  // What a DESTROY_* (or DEREG_MR) names: the request's handle and its object in `m`, when there
  // is one and nothing uses it (PDs, CQs and SRQs count their `users`, which are `what`).
  template <class Map>
  CmdResult<typename Map::iterator> to_destroy(Map& m, std::string_view kind, std::string_view what = {}) {
    const auto h = req_as<vd::HandleReq>(body).handle;
    auto it = m.find(h);
    if (it == m.end()) return refuse(vd::Status::not_found, fmt::format("no {} {}", kind, h));
    if constexpr (requires { it->second.users; })
      if (it->second.users != 0)
        return refuse(vd::Status::busy, fmt::format("{} {} is still used by {} {}", kind, h, it->second.users, what));
    return it;
  }
  // REG_MR, REG_DMA_MR and ALLOC_MR: the guest's regions of every kind count against max_mr.
  [[nodiscard]] std::optional<Refusal> mr_room() const { return room(d.mr_count(), lim.max_mr, "MRs"); }

  Reply query_device();
  Reply query_port();
  Reply query_gid();
  Reply create_pd();
  Reply destroy_pd();
  Reply reg_mr();
  Reply dereg_mr();
  Reply alloc_mr();
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
  // db_rings.cpp
  Reply create_db_ring();
  Reply destroy_db_ring();
  // A CREATE_CQ/QP/SRQ's db_ring: 0 or a ring the guest has.
  [[nodiscard]] std::optional<Refusal> db_ring_known(std::uint32_t ring, std::string_view command) const;
};

}  // namespace vrdma::device::cmd
