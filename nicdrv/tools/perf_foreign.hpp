// vrdma-perf against foreign tools: the out-of-band records of perftest and ibv_rc_pingpong
// (perf_foreign.cpp), perftest's exchange in both roles (perf_perftest.cpp) and the ping-pong
// (perf_pingpong.cpp).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "perf.hpp"

namespace vrdma::perf {

// ---- foreign peers: the out-of-band formats of perftest and ibv_rc_pingpong -------------------
// Both tools swap fixed-size, NUL-terminated text records over TCP, the client writing first.
// perftest (KEY_PRINT_FMT_GID in perftest_communication.h) sends
//   lid:out_reads:qpn:psn:rkey:vaddr:<16 GID bytes, each "xx:">srqn:   (108 bytes with the NUL)
// and, before and after the keys, other records (versions, page and cache-line size, MTU, the
// bandwidth report) that the server answers with a record of the same size. As a server we
// answer those with the client's own record: we agree to its version and sizes.
// ibv_rc_pingpong sends lid:qpn:psn:<GID as 32 hex digits> (52 bytes), then the client "done".
constexpr std::size_t kPerftestKeyLen = 108, kPingpongLen = 52;
constexpr int kForeignTimeoutMs = 120000;

struct ForeignDest {
  std::uint64_t lid = 0, out_reads = 0, qpn = 0, psn = 0, rkey = 0, vaddr = 0, srqn = 0;
  Gid gid;
};

struct ForeignOutcome {
  Outcome o;
  std::vector<std::size_t> records;  // sizes of the records the peer sent, in order
  bool verified = true;
  bool last_ack_lost = false;  // pingpong: see run_pingpong
};

std::string perftest_record(const ForeignDest& d);
bool parse_perftest_record(std::string_view m, ForeignDest& d);
std::string pingpong_record(const ForeignDest& d);
bool parse_pingpong_record(std::string_view m, ForeignDest& d);
void write_all(int fd, std::string_view m);
// Waits up to `ms` for bytes; false on timeout. Runs `idle` between short waits.
bool wait_readable(int fd, int ms, const std::function<void()>& idle);
std::string read_exact(int fd, std::size_t n);
// One record of unknown size: everything that arrives until the line is quiet for 50 ms (the
// writer then waits for our answer). Empty on end of stream. Waits while `progress` (a packet
// count) moves; dies after 120 s in which neither a record nor a packet came.
std::string read_record(int fd, const std::function<void()>& idle, const std::function<std::uint64_t()>& progress = {});
ForeignDest my_dest(Ctx& x, std::uint32_t psn);

// perf_perftest.cpp
ForeignOutcome serve_perftest(Ctx& x, int fd);
ForeignOutcome client_perftest(Ctx& x, int fd);
// perf_pingpong.cpp: ibv_rc_pingpong, or ibv_ud_pingpong with --connection UD
ForeignOutcome run_pingpong(Ctx& x, int fd, bool is_server);
// ibv_srq_pingpong (--srq): --qps RC QPs receiving from one SRQ, a ping-pong on each.
ForeignOutcome run_srq_pingpong(Ctx& x, int fd, bool is_server);

}  // namespace vrdma::perf
