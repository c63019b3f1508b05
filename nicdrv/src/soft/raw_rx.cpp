// Receive path that sees the IPv4 header. The ICRC (IBA Annex A17.3.3) covers the IPv4
// identification and flags fields unmasked; a UDP socket never shows them, and Linux rxe sends
// non-zero IDs (it picks them with __ip_select_ident). So RoCE packets are read from a raw
// IPPROTO_UDP socket (kernel-filtered to our address and port, IP header included), while the
// UDP socket keeps the port bound and sends; a drop-all filter keeps its queue empty.
#include <linux/filter.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "soft/engine.hpp"

namespace vrdma::nicdrv::soft {
namespace {

constexpr std::size_t kIpUdpLen = 20 + 8;  // the filter admits IHL 5 only (RoCEv2 has no options)

std::uint16_t get16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] << 8 | p[1]); }

class RawRxLink final : public Link {
 public:
  RawRxLink(std::unique_ptr<Link> tx, UniqueFd raw, EngineStats& st) : tx_(std::move(tx)), raw_(std::move(raw)), st_(st) {}

  std::size_t send(std::span<TxPacket> pkts) override { return tx_->send(pkts); }
  bool gso() const override { return tx_->gso(); }

  std::size_t recv(std::span<RxPacket> pkts) override {
    std::size_t n = std::min(pkts.size(), kRxSlots);
    for (std::size_t i = 0; i < n; ++i) {
      iov_[i][0] = iovec{hdr_[i].data(), kIpUdpLen};
      iov_[i][1] = iovec{pkts[i].data, pkts[i].cap};
      msg_[i] = mmsghdr{};
      msg_[i].msg_hdr.msg_iov = iov_[i].data();
      msg_[i].msg_hdr.msg_iovlen = 2;
    }
    int r = ::recvmmsg(raw_.get(), msg_.data(), static_cast<unsigned>(n), MSG_DONTWAIT, nullptr);
    if (r <= 0) return 0;
    std::size_t got = 0;
    for (std::size_t i = 0; i < static_cast<std::size_t>(r); ++i) {
      const auto& m = msg_[i];
      const std::uint8_t* h = hdr_[i].data();
      const std::size_t udp_len = m.msg_len >= kIpUdpLen ? get16(h + 24) : 0;
      // Truncated, shorter than its UDP header says, or a UDP length below the header: not RoCE.
      if ((m.msg_hdr.msg_flags & MSG_TRUNC) != 0 || udp_len < 8 || udp_len - 8 > m.msg_len - kIpUdpLen) {
        ++st_.rx_dropped_malformed;
        continue;
      }
      auto& p = pkts[got];
      if (got != i) std::memcpy(p.data, pkts[i].data, udp_len - 8);
      p.len = static_cast<std::uint32_t>(udp_len - 8);
      std::memcpy(&p.src_ip_be, h + 12, 4);
      p.src_port = get16(h + 20);
      p.ip_id = get16(h + 4);
      p.dont_fragment = (get16(h + 6) & 0x4000) != 0;
      p.gso_size = 0;  // a raw socket does not say; engine_loop.cpp works it out
      ++got;
    }
    return got;
  }

  int fd() const override { return raw_.get(); }

 private:
  std::unique_ptr<Link> tx_;
  UniqueFd raw_;
  EngineStats& st_;
  std::array<std::array<std::uint8_t, kIpUdpLen>, kRxSlots> hdr_{};
  std::array<std::array<iovec, 2>, kRxSlots> iov_{};
  std::array<mmsghdr, kRxSlots> msg_{};
};

}  // namespace

Result<std::unique_ptr<Link>> make_raw_rx_link(UniqueFd& udp_sock, std::uint32_t ip_be, std::uint16_t port,
                                               EngineStats& st, bool gso) {
  UniqueFd raw(::socket(AF_INET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_UDP));
  if (!raw) return errno_error(errno, "soft: raw UDP socket (needs CAP_NET_RAW)");
  // A raw socket sees every UDP datagram for its bound address; the kernel keeps only ours.
  // Offsets are from the IPv4 header: [0] version/IHL, [22] UDP destination port.
  sock_filter ours[] = {
      BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 0),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x45, 0, 3),
      BPF_STMT(BPF_LD | BPF_H | BPF_ABS, 22),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, port, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, 0xffffffffu),
      BPF_STMT(BPF_RET | BPF_K, 0),
  };
  sock_fprog prog{static_cast<unsigned short>(std::size(ours)), ours};
  if (::setsockopt(raw.get(), SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) != 0)
    return errno_error(errno, "soft: filter on the raw UDP socket");
  int buf = 8 << 20;
  if (::setsockopt(raw.get(), SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf) != 0)
    ::setsockopt(raw.get(), SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = ip_be;
  if (::bind(raw.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0)
    return errno_error(errno, "soft: bind the raw UDP socket");
  // The UDP socket still owns the port (no ICMP port-unreachable) but queues nothing.
  sock_filter none[] = {BPF_STMT(BPF_RET | BPF_K, 0)};
  sock_fprog drop{1, none};
  if (::setsockopt(udp_sock.get(), SOL_SOCKET, SO_ATTACH_FILTER, &drop, sizeof drop) != 0)
    return errno_error(errno, "soft: filter on the UDP socket");
  return std::unique_ptr<Link>(std::make_unique<RawRxLink>(make_udp_link(std::move(udp_sock), port, st, gso, false), std::move(raw), st));
}

}  // namespace vrdma::nicdrv::soft
