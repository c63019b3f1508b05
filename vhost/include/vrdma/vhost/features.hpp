// Typed feature words (STYLE.md "Typed feature bits"): a bit number is never used as a mask.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace vrdma::vhost {

// Virtio feature bits a vhost-user device of ours may offer (virtio 1.2 §6, vhost-user.rst).
enum class VirtioFeature : unsigned {
  blk_size_max = 1,
  blk_seg_max = 2,
  blk_blk_size = 6,
  blk_flush = 9,
  blk_mq = 12,
  log_all = 26,            // VHOST_F_LOG_ALL: the frontend asks for dirty logging
  ring_indirect_desc = 28,
  ring_event_idx = 29,
  protocol_features = 30,  // VHOST_USER_F_PROTOCOL_FEATURES
  version_1 = 32,
  access_platform = 33,
  ring_packed = 34,
};

// vhost-user protocol feature bits (vhost-user.rst "Protocol features").
enum class ProtocolFeature : unsigned {
  mq = 0,
  log_shmfd = 1,
  rarp = 2,
  reply_ack = 3,
  mtu = 4,
  backend_req = 5,
  config = 9,
  inflight_shmfd = 12,
  reset_device = 13,
  inband_notifications = 14,
  configure_mem_slots = 15,
  status = 16,
  device_state = 19,
};

template <class E>
class FeatureSet {
 public:
  constexpr FeatureSet() = default;
  constexpr FeatureSet(std::initializer_list<E> bits) {
    for (E b : bits) set(b);
  }
  static constexpr FeatureSet from_raw(std::uint64_t raw) {
    FeatureSet f;
    f.raw_ = raw;
    return f;
  }
  [[nodiscard]] constexpr std::uint64_t raw() const { return raw_; }
  [[nodiscard]] constexpr bool has(E b) const { return (raw_ & mask(b)) != 0; }
  constexpr FeatureSet& set(E b) {
    raw_ |= mask(b);
    return *this;
  }
  constexpr FeatureSet& clear(E b) {
    raw_ &= ~mask(b);
    return *this;
  }
  [[nodiscard]] constexpr FeatureSet operator&(FeatureSet o) const { return from_raw(raw_ & o.raw_); }
  [[nodiscard]] constexpr FeatureSet operator|(FeatureSet o) const { return from_raw(raw_ | o.raw_); }
  // True if every bit of *this is also in `o`.
  [[nodiscard]] constexpr bool subset_of(FeatureSet o) const { return (raw_ & ~o.raw_) == 0; }
  constexpr bool operator==(const FeatureSet&) const = default;

 private:
  static constexpr std::uint64_t mask(E b) { return std::uint64_t{1} << static_cast<unsigned>(b); }
  std::uint64_t raw_ = 0;
};

using VirtioFeatures = FeatureSet<VirtioFeature>;
using ProtocolFeatures = FeatureSet<ProtocolFeature>;

}  // namespace vrdma::vhost
