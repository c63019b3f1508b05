// Packet links: the real UDP socket (batched with sendmmsg/recvmmsg) and a deterministic
// fault-injecting wrapper for tests (drop, duplicate, reorder, corrupt).
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "soft/engine.hpp"
#include "vrdma/common/log.hpp"

namespace vrdma::nicdrv::soft {
namespace {

class UdpLink final : public Link {
 public:
  UdpLink(UniqueFd sock, std::uint16_t port, EngineStats& st) : sock_(std::move(sock)), port_(port), st_(st) {}

  std::size_t send(std::span<TxPacket> pkts) override {
    std::size_t n = std::min(pkts.size(), kTxSlots);
    for (std::size_t i = 0; i < n; ++i) {
      addr_[i] = sockaddr_in{};
      addr_[i].sin_family = AF_INET;
      addr_[i].sin_port = htons(port_);
      addr_[i].sin_addr.s_addr = pkts[i].dst_ip_be;
      iov_[i] = iovec{pkts[i].data, pkts[i].len};
      msg_[i] = mmsghdr{};
      msg_[i].msg_hdr.msg_name = &addr_[i];
      msg_[i].msg_hdr.msg_namelen = sizeof(sockaddr_in);
      msg_[i].msg_hdr.msg_iov = &iov_[i];
      msg_[i].msg_hdr.msg_iovlen = 1;
    }
    std::size_t done = 0;
    int spins = 0;
    while (done < n) {
      int r = ::sendmmsg(sock_.get(), msg_.data() + done, static_cast<unsigned>(n - done), 0);
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
        if (errno == EMSGSIZE) log::warn("soft: a {}-byte packet exceeds the interface MTU; lower the QP path MTU", iov_[done].iov_len);
        ++done;
        continue;
      }
      break;
    }
    return done;
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
      ++got;
    }
    return got;
  }

  int fd() const override { return sock_.get(); }

 private:
  UniqueFd sock_;
  std::uint16_t port_;
  EngineStats& st_;
  std::array<sockaddr_in, kTxSlots> addr_{};
  std::array<iovec, kTxSlots> iov_{};
  std::array<mmsghdr, kTxSlots> msg_{};
  std::array<sockaddr_in, kRxSlots> addr_rx_{};
  std::array<iovec, kRxSlots> iov_rx_{};
  std::array<mmsghdr, kRxSlots> msg_rx_{};
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
      if (seq < cfg_.drop_first_n || roll(cfg_.drop_ppm)) {
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

std::unique_ptr<Link> make_udp_link(UniqueFd sock, std::uint16_t port, EngineStats& st) {
  return std::make_unique<UdpLink>(std::move(sock), port, st);
}

std::unique_ptr<Link> make_fault_link(std::unique_ptr<Link> inner, const FaultConfig& cfg, EngineStats& st) {
  return std::make_unique<FaultLink>(std::move(inner), cfg, st);
}

}  // namespace vrdma::nicdrv::soft
