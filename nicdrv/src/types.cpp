#include <arpa/inet.h>

#include <cstring>

#include "vrdma/nicdrv/types.hpp"

namespace vrdma::nicdrv {

Gid Gid::from_ipv4(std::uint32_t ipv4_be) noexcept {
  Gid g;
  g.raw[10] = 0xff;
  g.raw[11] = 0xff;
  std::memcpy(&g.raw[12], &ipv4_be, 4);
  return g;
}

bool Gid::is_ipv4_mapped() const noexcept {
  for (int i = 0; i < 10; ++i)
    if (raw[static_cast<std::size_t>(i)] != 0) return false;
  return raw[10] == 0xff && raw[11] == 0xff;
}

std::uint32_t Gid::ipv4() const noexcept {
  std::uint32_t v;
  std::memcpy(&v, &raw[12], 4);
  return v;
}

std::string Gid::str() const {
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, raw.data(), buf, sizeof buf);
  return buf;
}

std::optional<Mtu> mtu_from_bytes(std::uint32_t bytes) noexcept {
  switch (bytes) {
    case 256: return Mtu::mtu256;
    case 512: return Mtu::mtu512;
    case 1024: return Mtu::mtu1024;
    case 2048: return Mtu::mtu2048;
    case 4096: return Mtu::mtu4096;
    default: return std::nullopt;
  }
}

std::string_view to_string(QpState s) noexcept {
  switch (s) {
    case QpState::reset: return "RESET";
    case QpState::init: return "INIT";
    case QpState::rtr: return "RTR";
    case QpState::rts: return "RTS";
    case QpState::sqd: return "SQD";
    case QpState::sqe: return "SQE";
    case QpState::err: return "ERR";
  }
  return "?";
}

std::string_view to_string(QpType t) noexcept {
  return t == QpType::rc ? "RC" : t == QpType::ud ? "UD" : t == QpType::gsi ? "GSI" : "?";
}

std::string_view to_string(WrOpcode op) noexcept {
  switch (op) {
    case WrOpcode::rdma_write: return "RDMA_WRITE";
    case WrOpcode::rdma_write_with_imm: return "RDMA_WRITE_WITH_IMM";
    case WrOpcode::send: return "SEND";
    case WrOpcode::send_with_imm: return "SEND_WITH_IMM";
    case WrOpcode::rdma_read: return "RDMA_READ";
    case WrOpcode::atomic_cmp_and_swp: return "ATOMIC_CMP_AND_SWP";
    case WrOpcode::atomic_fetch_and_add: return "ATOMIC_FETCH_AND_ADD";
    case WrOpcode::send_with_inv: return "SEND_WITH_INV";
    case WrOpcode::local_inv: return "LOCAL_INV";
    case WrOpcode::reg_mr: return "REG_MR";
  }
  return "?";
}

std::string_view to_string(WcStatus s) noexcept {
  static constexpr std::string_view names[] = {
      "success", "local length error", "local QP operation error", "local EE context operation error",
      "local protection error", "work request flushed", "memory window bind error", "bad response",
      "local access error", "remote invalid request", "remote access error", "remote operation error",
      "transport retry counter exceeded", "RNR retry counter exceeded", "local RDD violation",
      "remote invalid RD request", "remote aborted", "invalid EE context number", "invalid EE context state",
      "fatal error", "response timeout", "general error"};
  auto i = static_cast<std::size_t>(s);
  return i < std::size(names) ? names[i] : "?";
}

std::string_view to_string(WcOpcode op) noexcept {
  switch (op) {
    case WcOpcode::send: return "SEND";
    case WcOpcode::rdma_write: return "RDMA_WRITE";
    case WcOpcode::rdma_read: return "RDMA_READ";
    case WcOpcode::comp_swap: return "COMP_SWAP";
    case WcOpcode::fetch_add: return "FETCH_ADD";
    case WcOpcode::bind_mw: return "BIND_MW";
    case WcOpcode::local_inv: return "LOCAL_INV";
    case WcOpcode::reg_mr: return "REG_MR";
    case WcOpcode::recv: return "RECV";
    case WcOpcode::recv_rdma_with_imm: return "RECV_RDMA_WITH_IMM";
  }
  return "?";
}

}  // namespace vrdma::nicdrv
