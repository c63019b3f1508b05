#include "rdma_stream.hpp"

#include <array>

#include <fmt/format.h>

namespace vrdma::test {

using namespace vrdma::nicdrv;

Status StreamSide::post_recv(std::size_t slot) {
  Sge s{reinterpret_cast<std::uint64_t>(e_.buf.data() + kRxBase + slot * kSlot), static_cast<std::uint32_t>(kSlot),
        e_.mr->lkey()};
  RecvWr r{slot, std::span<const Sge>(&s, 1)};
  return e_.qp->post_recv(std::span(&r, 1));
}

Status StreamSide::start() {
  if (e_.buf.size() < kBufBytes)
    return make_error(Errc::invalid_argument, fmt::format("a stream needs a {}-byte buffer, the endpoint has {}", kBufBytes,
                                                          e_.buf.size()));
  for (std::size_t s = 0; s < kRecvSlots; ++s) VRDMA_TRY(post_recv(s));
  last_completion_ = std::chrono::steady_clock::now();
  return {};
}

Status StreamSide::step() {
  while (sent_ < msgs_ && sent_ - send_done_ < kWindow) {
    const std::size_t i = sent_;
    std::uint8_t* src = e_.buf.data() + kSendBase + (i % kWindow) * kSlot;
    fill_pattern(src, kSlot, seed(side_, i));
    Sge s{reinterpret_cast<std::uint64_t>(src), static_cast<std::uint32_t>(kSlot), e_.mr->lkey()};
    SendWr w;
    w.wr_id = i;
    w.flags = SendFlags::signaled;
    w.imm_data = static_cast<std::uint32_t>(i);
    w.sg_list = std::span<const Sge>(&s, 1);
    if (side_ == 0 && i % 2 == 1) {
      w.opcode = WrOpcode::rdma_write_with_imm;
      w.rdma.remote_addr = peer_addr_ + kWriteBase + (i % kWriteSlots) * kSlot;
      w.rdma.rkey = peer_rkey_;
    } else {
      w.opcode = WrOpcode::send_with_imm;
    }
    VRDMA_TRY(e_.qp->post_send(std::span(&w, 1)));
    ++sent_;
  }
  std::array<WorkCompletion, 32> wcs;
  auto n = e_.cq->poll(wcs);
  if (!n) return std::move(n).error();
  if (*n > 0) {
    const auto now = std::chrono::steady_clock::now();
    longest_gap_ms_ = std::max(longest_gap_ms_, std::chrono::duration<double, std::milli>(now - last_completion_).count());
    last_completion_ = now;
  }
  for (std::size_t k = 0; k < *n; ++k) {
    const auto& wc = wcs[k];
    if (wc.status != WcStatus::success)
      return make_error(Errc::io_error, fmt::format("side {}: work request {} completed with {}", side_, wc.wr_id,
                                                    to_string(wc.status)));
    if (wc.opcode == WcOpcode::send || wc.opcode == WcOpcode::rdma_write) {
      if (wc.wr_id != send_done_)  // each work request completes once, in order
        return make_error(Errc::protocol_error, fmt::format("side {}: send {} completed when {} was due", side_, wc.wr_id,
                                                            send_done_));
      ++send_done_;
      continue;
    }
    const std::size_t i = recvd_;
    if (wc.imm_data != static_cast<std::uint32_t>(i))  // each message arrives once, in order
      return make_error(Errc::protocol_error, fmt::format("side {}: message {} arrived when {} was due", side_,
                                                          wc.imm_data, i));
    const bool write = side_ == 1 && i % 2 == 1;
    if (write != (wc.opcode == WcOpcode::recv_rdma_with_imm))
      return make_error(Errc::protocol_error, fmt::format("side {}: message {} arrived as {}", side_, i, to_string(wc.opcode)));
    if (wc.wr_id >= kRecvSlots)
      return make_error(Errc::protocol_error, fmt::format("side {}: a receive completed with wr_id {}", side_, wc.wr_id));
    const std::uint8_t* data = write ? e_.buf.data() + kWriteBase + (i % kWriteSlots) * kSlot
                                     : e_.buf.data() + kRxBase + wc.wr_id * kSlot;
    if (!check_pattern(data, kSlot, seed(1 - side_, i)))
      return make_error(Errc::protocol_error, fmt::format("side {}: message {} is corrupted", side_, i));
    ++recvd_;
    VRDMA_TRY(post_recv(wc.wr_id));
  }
  return {};
}

}  // namespace vrdma::test
