// Packet links: the real UDP socket (batched with sendmmsg/recvmmsg) and a deterministic
// fault-injecting wrapper for tests (drop, duplicate, reorder, corrupt).
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "soft/engine.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::nicdrv::soft {
namespace {

// UDP_SEGMENT and UDP_GRO control messages: one 16-bit segment size out, one int in.
constexpr std::size_t kCtlLen = CMSG_SPACE(sizeof(int));
using CtlBuf = std::array<std::uint8_t, kCtlLen>;

class UdpLink final : public Link {
 public:
  UdpLink(UniqueFd sock, std::uint16_t port, EngineStats& st, bool gso, bool gro)
      : sock_(std::move(sock)), port_(port), st_(st), gso_(gso) {
    int one = 1;
    // Runs sent with UDP_SEGMENT by a peer then arrive whole, with their segment size.
    gro_ = gro && ::setsockopt(sock_.get(), IPPROTO_UDP, UDP_GRO, &one, sizeof one) == 0;
  }

  bool gso() const override { return gso_; }

  std::size_t send(std::span<TxPacket> pkts) override {
    const std::size_t n = std::min(pkts.size(), kTxSlots);
    // One message per packet, or per segmentation run (its packets as one iovec list).
    std::size_t m = 0;
    for (std::size_t i = 0; i < n; ++m) {
      const std::size_t segs = gso_ && pkts[i].gso_segs > 1 ? std::min<std::size_t>(pkts[i].gso_segs, n - i) : 1;
      addr_[m] = sockaddr_in{};
      addr_[m].sin_family = AF_INET;
      addr_[m].sin_port = htons(port_);
      addr_[m].sin_addr.s_addr = pkts[i].dst_ip_be;
      for (std::size_t k = 0; k < segs; ++k) iov_[i + k] = iovec{pkts[i + k].data, pkts[i + k].len};
      msg_[m] = mmsghdr{};
      msg_[m].msg_hdr.msg_name = &addr_[m];
      msg_[m].msg_hdr.msg_namelen = sizeof(sockaddr_in);
      msg_[m].msg_hdr.msg_iov = &iov_[i];
      msg_[m].msg_hdr.msg_iovlen = segs;
      if (segs > 1) {
        msg_[m].msg_hdr.msg_control = ctl_[m].data();
        msg_[m].msg_hdr.msg_controllen = CMSG_SPACE(sizeof(std::uint16_t));
        cmsghdr* c = CMSG_FIRSTHDR(&msg_[m].msg_hdr);
        c->cmsg_level = SOL_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof(std::uint16_t));
        const auto seg = static_cast<std::uint16_t>(pkts[i].len);
        std::memcpy(CMSG_DATA(c), &seg, sizeof seg);
      }
      i += segs;
    }
    std::size_t done = 0;
    int spins = 0;
    while (done < m) {
      int r = ::sendmmsg(sock_.get(), msg_.data() + done, static_cast<unsigned>(m - done), 0);
      if (r > 0) {
        done += static_cast<std::size_t>(r);
        continue;
      }
      if (r < 0 && (errno == EAGAIN || errno == ENOBUFS) && spins++ < 1000) {
        pollfd p{sock_.get(), POLLOUT, 0};
        ::poll(&p, 1, 1);
        continue;
      }
      if (r < 0 && errno != EAGAIN) {
        // An unreachable peer or an oversize packet: the packet is lost, RC retransmits.
        const int e = errno;
        if (msg_[done].msg_hdr.msg_iovlen > 1 && (e == EINVAL || e == EIO || e == EOPNOTSUPP || e == ENOPROTOOPT)) {
          // The route cannot segment (no checksum offload, IPsec, ...): this run is lost (RC
          // retransmits), later packets leave one by one.
          log::warn("soft: UDP segmentation offload failed ({}); sending packets one at a time from now on", std::strerror(e));
          gso_ = false;
        } else if (e == EMSGSIZE) {
          log::warn("soft: a {}-byte packet exceeds the interface MTU; lower the QP path MTU", msg_[done].msg_hdr.msg_iov[0].iov_len);
        }
        ++done;
        continue;
      }
      break;
    }
    return n;
  }

  std::size_t recv(std::span<RxPacket> pkts) override {
    std::size_t n = std::min(pkts.size(), kRxSlots);
    for (std::size_t i = 0; i < n; ++i) {
      iov_rx_[i] = iovec{pkts[i].data, pkts[i].cap};
      msg_rx_[i] = mmsghdr{};
      msg_rx_[i].msg_hdr.msg_name = &addr_rx_[i];
      msg_rx_[i].msg_hdr.msg_namelen = sizeof(sockaddr_in);
      msg_rx_[i].msg_hdr.msg_iov = &iov_rx_[i];
      msg_rx_[i].msg_hdr.msg_iovlen = 1;
      if (gro_) {
        msg_rx_[i].msg_hdr.msg_control = ctl_rx_[i].data();
        msg_rx_[i].msg_hdr.msg_controllen = kCtlLen;
      }
    }
    int r = ::recvmmsg(sock_.get(), msg_rx_.data(), static_cast<unsigned>(n), MSG_DONTWAIT, nullptr);
    if (r <= 0) return 0;
    std::size_t got = 0;
    for (int i = 0; i < r; ++i) {
      auto& m = msg_rx_[static_cast<std::size_t>(i)];
      if ((m.msg_hdr.msg_flags & MSG_TRUNC) != 0) {  // larger than any RoCE packet: not ours
        ++st_.rx_dropped_malformed;
        continue;
      }
      auto& p = pkts[got];
      if (got != static_cast<std::size_t>(i)) std::memcpy(p.data, pkts[static_cast<std::size_t>(i)].data, m.msg_len);
      p.len = m.msg_len;
      p.src_ip_be = addr_rx_[static_cast<std::size_t>(i)].sin_addr.s_addr;
      p.src_port = ntohs(addr_rx_[static_cast<std::size_t>(i)].sin_port);
      p.ip_id = 0;  // what we send (unseen here: see raw_rx.cpp)
      p.dont_fragment = true;
      p.gso_size = 0;
      for (cmsghdr* c = CMSG_FIRSTHDR(&m.msg_hdr); gro_ && c != nullptr; c = CMSG_NXTHDR(&m.msg_hdr, c))
        if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
          int g = 0;
          std::memcpy(&g, CMSG_DATA(c), sizeof g);
          p.gso_size = static_cast<std::uint16_t>(std::clamp(g, 0, 65535));
        }
      ++got;
    }
    return got;
  }

  int fd() const override { return sock_.get(); }

 private:
  UniqueFd sock_;
  std::uint16_t port_;
  EngineStats& st_;
  bool gso_ = false, gro_ = false;
  std::array<sockaddr_in, kTxSlots> addr_{};
  std::array<iovec, kTxSlots> iov_{};
  std::array<mmsghdr, kTxSlots> msg_{};
  std::array<CtlBuf, kTxSlots> ctl_{};
  std::array<sockaddr_in, kRxSlots> addr_rx_{};
  std::array<iovec, kRxSlots> iov_rx_{};
  std::array<mmsghdr, kRxSlots> msg_rx_{};
  std::array<CtlBuf, kRxSlots> ctl_rx_{};
};

// Test seam (named as such): decides each transmitted packet's fate from a seeded PRNG.
class FaultLink final : public Link {
 public:
  FaultLink(std::unique_ptr<Link> inner, const FaultConfig& cfg, EngineStats& st)
      : inner_(std::move(inner)), cfg_(cfg), rng_(cfg.seed), st_(st) {
    bufs_.resize(2 * kTxSlots + 1, std::vector<std::uint8_t>(kPktBuf));
  }

  std::size_t send(std::span<TxPacket> pkts) override {
    std::size_t out = 0;
    auto emit = [&](const TxPacket& p) {
      auto& b = bufs_[out];
      std::memcpy(b.data(), p.data, p.len);
      staged_[out] = TxPacket{p.dst_ip_be, b.data(), p.len};
      ++out;
    };
    for (const auto& p : pkts) {
      std::uint64_t seq = seq_++;
      if (seq < cfg_.drop_first_n || std::find(cfg_.drop_seq.begin(), cfg_.drop_seq.end(), seq) != cfg_.drop_seq.end() ||
          roll(cfg_.drop_ppm)) {
        ++st_.faults_dropped;
        continue;
      }
      if (roll(cfg_.corrupt_ppm) && p.len > 0) {
        ++st_.faults_corrupted;
        emit(p);
        staged_[out - 1].data[rng_() % p.len] ^= static_cast<std::uint8_t>(1u << (rng_() % 8));
      } else {
        emit(p);
      }
      if (roll(cfg_.duplicate_ppm)) {
        ++st_.faults_duplicated;
        emit(p);
      }
      if (holding_) {  // release the held-back packet after this one
        auto& b = bufs_[out];
        std::memcpy(b.data(), held_buf_.data(), held_.len);
        staged_[out] = TxPacket{held_.dst_ip_be, b.data(), held_.len};
        ++out;
        holding_ = false;
      } else if (roll(cfg_.reorder_ppm)) {
        ++st_.faults_reordered;
        --out;
        held_buf_.assign(staged_[out].data, staged_[out].data + staged_[out].len);
        held_ = TxPacket{staged_[out].dst_ip_be, nullptr, staged_[out].len};
        holding_ = true;
      }
      if (out >= 2 * kTxSlots - 2) {
        inner_->send(std::span<TxPacket>(staged_.data(), out));
        out = 0;
      }
    }
    if (out > 0) inner_->send(std::span<TxPacket>(staged_.data(), out));
    return pkts.size();
  }

  std::size_t recv(std::span<RxPacket> pkts) override {
    // A held-back packet is not kept forever: flush it when the engine next polls.
    if (holding_) {
      TxPacket p{held_.dst_ip_be, held_buf_.data(), held_.len};
      holding_ = false;
      inner_->send(std::span<TxPacket>(&p, 1));
    }
    return inner_->recv(pkts);
  }
  int fd() const override { return inner_->fd(); }

 private:
  bool roll(std::uint32_t ppm) { return ppm != 0 && (rng_() % 1000000) < ppm; }

  std::unique_ptr<Link> inner_;
  FaultConfig cfg_;
  std::mt19937_64 rng_;
  EngineStats& st_;
  std::uint64_t seq_ = 0;
  std::vector<std::vector<std::uint8_t>> bufs_;
  std::array<TxPacket, 2 * kTxSlots + 1> staged_{};
  TxPacket held_{};
  bool holding_ = false;
  std::vector<std::uint8_t> held_buf_;
};

}  // namespace

std::unique_ptr<Link> make_udp_link(UniqueFd sock, std::uint16_t port, EngineStats& st, bool gso, bool gro) {
  return std::make_unique<UdpLink>(std::move(sock), port, st, gso, gro);
}

std::unique_ptr<Link> make_fault_link(std::unique_ptr<Link> inner, const FaultConfig& cfg, EngineStats& st) {
  return std::make_unique<FaultLink>(std::move(inner), cfg, st);
}

}  // namespace vrdma::nicdrv::soft
