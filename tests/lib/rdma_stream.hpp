// One side of a checked RC stream over any nicdrv provider: what the migration tests run while
// the device moves, in one process (two sides) or across processes and VMs (vrdma-stream).
//
// Each side sends `msgs` messages of kSlot bytes. Side 0's odd messages are RDMA WRITE WITH
// IMMEDIATE into a slot of the peer's write area; everything else is SEND WITH IMMEDIATE. Each
// message carries a pattern seeded by (side, index) and its index as immediate data. The
// receiver checks the pattern, that every message arrives exactly once and in order; the sender
// checks that every work request completes exactly once, in order, successfully. A failed check
// is an error sentence from step(). The receiver reposts each receive once its slot is checked,
// and a sender without a receive waiting meets RNR (the QPs retry it without end), so the
// window bounds what is unchecked: slots are never overwritten before they are checked.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "rdma_pair.hpp"

namespace vrdma::test {

class StreamSide {
 public:
  static constexpr std::size_t kSlot = 4096, kRecvSlots = 64, kWriteSlots = 128, kWindow = 16;
  static constexpr std::size_t kRxBase = 0, kWriteBase = kRecvSlots * kSlot;
  static constexpr std::size_t kSendBase = kWriteBase + kWriteSlots * kSlot;
  static constexpr std::size_t kBufBytes = kSendBase + kWindow * kSlot;  // what the endpoint's buffer needs

  // `peer_addr`/`peer_rkey`: the peer's buffer (side 0 writes into its write area).
  StreamSide(Endpoint& e, int side, std::size_t msgs, std::uint64_t peer_addr, std::uint32_t peer_rkey)
      : e_(e), side_(side), msgs_(msgs), peer_addr_(peer_addr), peer_rkey_(peer_rkey) {}

  // Posts the receives. Call once, before the peer starts sending.
  Status start();
  // Posts what the window allows and polls the CQ once.
  Status step();
  [[nodiscard]] bool done() const { return send_done_ == msgs_ && recvd_ == msgs_; }
  // Ends the stream after `n` messages each way instead of msgs(): false (nothing changed) when
  // n is more than msgs() or fewer than this side has already sent or received.
  [[nodiscard]] bool end_at(std::size_t n) {
    if (n > msgs_ || n < sent_ || n < recvd_) return false;
    msgs_ = n;
    return true;
  }

  [[nodiscard]] std::size_t sent() const { return sent_; }
  [[nodiscard]] std::size_t send_done() const { return send_done_; }
  [[nodiscard]] std::size_t received() const { return recvd_; }
  [[nodiscard]] std::size_t msgs() const { return msgs_; }
  // Longest time between two completions so far (the pause a migration causes).
  [[nodiscard]] double longest_gap_ms() const { return longest_gap_ms_; }

  static std::uint64_t seed(int side, std::size_t i) { return 100000 * static_cast<std::uint64_t>(side + 1) + i; }

 private:
  Status post_recv(std::size_t slot);

  Endpoint& e_;
  int side_;
  std::size_t msgs_;
  std::uint64_t peer_addr_;
  std::uint32_t peer_rkey_;
  std::size_t sent_ = 0, send_done_ = 0, recvd_ = 0;
  std::chrono::steady_clock::time_point last_completion_ = std::chrono::steady_clock::now();
  double longest_gap_ms_ = 0;
};

}  // namespace vrdma::test
