// vrdma-perf: bandwidth and latency tests over any nicdrv provider, in the spirit of perftest.
//
//   server:  vrdma-perf --device soft:10.0.0.1 --test write_bw
//   client:  vrdma-perf --device soft:10.0.0.2 --test write_bw --connect 10.0.0.1 --size 65536
//
// Against another vrdma-perf (perf_native.cpp), perftest or ibv_rc_pingpong (perf_foreign.hpp),
// or rping, ucmatose and perftest -R through RDMA-CM (perf_cm.hpp). --verify checks data end to end.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>

#include "perf.hpp"
#include "perf_cm.hpp"
#include "vrdma/common/cli.hpp"

using namespace vrdma::perf;

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"vrdma-perf: RDMA bandwidth and latency over any vrdma provider (soft:, verbs:, pv:)", "vrdma-perf"};
  vrdma::cli::prepare(app);
  app.add_option("-d,--device", c.device, "device, e.g. soft:10.0.0.1")->required();
  app.add_option("-t,--test", c.test, "write_bw, read_bw, send_bw, atomic_bw, send_lat, write_lat, read_lat")
      ->check(CLI::IsMember({"write_bw", "read_bw", "send_bw", "atomic_bw", "send_lat", "write_lat", "read_lat"}));
  app.add_option("-c,--connect", c.connect, "server's IPv4 address (client mode); without it, serve");
  app.add_option("-p,--port", c.port, "TCP port for the out-of-band exchange");
  app.add_option("-s,--size", c.size, "message size in bytes")->check(CLI::Range(1u, 1u << 30));
  app.add_option("-q,--depth", c.depth, "outstanding work requests")->check(CLI::Range(1u, 16384u));
  app.add_option("-n,--iters", c.iters, "iterations")->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
  app.add_option("-D,--duration", c.duration, "run for this many seconds instead of --iters");
  app.add_option("-m,--mtu", c.mtu, "path MTU");
  app.add_flag("--json", c.json_out, "print one JSON object");
  app.add_flag("--verify", c.verify, "check data end to end (CRC-32 of the buffers)");
  app.add_option("--peer-format", c.peer_format,
                 "out-of-band format of the peer: vrdma (another vrdma-perf), perftest (ib_*_bw/lat), "
                 "pingpong (ibv_rc_pingpong), rping (rping -s/-c; connects through RDMA-CM, default port 7174), "
                 "ucmatose (ucmatose; RDMA-CM, default port 7471, 10 messages of 100 bytes)")
      ->check(CLI::IsMember({"vrdma", "perftest", "pingpong", "rping", "ucmatose"}));
  app.add_option("--qp-timeout", c.qp_timeout,
                 "local ACK timeout exponent, 4.096 us x 2^n (default 14 = 67 ms; a slow peer such as a TCG guest needs more)")
      ->check(CLI::Range(1, 31));
  std::string atomic_type = "FETCH_AND_ADD";
  app.add_option("-A,--atomic-type", atomic_type, "atomic_bw: FETCH_AND_ADD or CMP_AND_SWAP (perftest's -A)")
      ->check(CLI::IsMember({"FETCH_AND_ADD", "CMP_AND_SWAP"}));
  app.add_flag("-b,--bidirectional", c.bidirectional,
               "write_bw, read_bw with --peer-format perftest: both sides run the test (perftest's -b)");
  app.add_option("--connection", c.connection,
                 "RC, or UD: ibv_ud_pingpong (--peer-format pingpong), perftest send_bw/send_lat -c UD")
      ->check(CLI::IsMember({"RC", "UD"}));
  app.add_flag("--srq", c.srq, "with --peer-format pingpong: ibv_srq_pingpong (--qps RC QPs on one SRQ)");
  app.add_option("--qps", c.qps, "with --srq: the tool's -q (default 16, as the tool's)")->check(CLI::Range(1, 255));
  app.add_option("--rate", c.rate,
                 "with --peer-format pingpong: send at most this many messages a second, so that the tool's "
                 "--iters last a known time (the tool answers as fast as we send)")
      ->check(CLI::Range(0.1, 1e7));
  app.add_flag("-a,--all-sizes", c.all_sizes,
               "write_bw, read_bw with --peer-format perftest: every size from 2 B to 8 MiB, as perftest's -a");
  app.add_flag("--busy-poll", c.busy_poll,
               "poll the completion queue without a pause: never yield the CPU or sleep on the CQ's event "
               "(perftest's way; by default, after 200 us without a completion it yields, after 2 ms it sleeps)");
  bool cm = false;
  app.add_flag("--cm", cm,
               "with --peer-format perftest: the peer runs with -R (RDMA-CM; send_bw and write_bw in either role, read_bw as its server)");
  if (auto rc = vrdma::cli::parse(app, argc, argv)) return *rc;
  c.cmp_and_swap = atomic_type == "CMP_AND_SWAP";
  // UD drops a message that finds no receive posted: serve with perftest's UD receive depth.
  if (c.connection == "UD" && app.count("--depth") == 0) c.depth = 512;
  if (c.connection == "UD" && !(c.peer_format == "pingpong" && !c.srq) &&
      !(c.peer_format == "perftest" && !cm && (c.test == "send_bw" || c.test == "send_lat"))) {
    std::fprintf(stderr, "vrdma-perf: --connection UD is served for ibv_ud_pingpong (--peer-format pingpong) and for "
                         "perftest's send_bw and send_lat (-c UD); UD has no RDMA WRITE, READ or atomics\n");
    return 2;
  }
  if (c.all_sizes) {
    if (c.peer_format != "perftest" || cm || (c.test != "write_bw" && c.test != "read_bw")) {
      std::fprintf(stderr, "vrdma-perf: -a (every size) is served for write_bw and read_bw against perftest "
                           "(--peer-format perftest, without --cm); not for %s with --peer-format %s\n",
                   c.test.c_str(), c.peer_format.c_str());
      return 2;
    }
    c.size = std::max<std::uint32_t>(c.size, 1u << 23);  // the buffers hold the largest message
  }
  if (c.bidirectional && (c.peer_format != "perftest" || cm || (c.test != "write_bw" && c.test != "read_bw"))) {
    std::fprintf(stderr, "vrdma-perf: -b (both sides run the test) is served for write_bw and read_bw against perftest "
                         "(--peer-format perftest, without --cm); not for %s with --peer-format %s\n",
                 c.test.c_str(), c.peer_format.c_str());
    return 2;
  }
  if (c.rate > 0 && c.peer_format != "pingpong") {
    std::fprintf(stderr, "vrdma-perf: --rate (messages a second) is served for the pingpong tools (--peer-format "
                         "pingpong); not for --peer-format %s\n", c.peer_format.c_str());
    return 2;
  }
  // The RDMA-CM peers (perf_cm.hpp), with their tool's defaults where the command line is silent.
  auto cm_config = [&](std::uint16_t port, std::uint32_t size, std::uint64_t iters) {
    vrdma::perf::CmRunConfig r;
    r.device = c.device;
    r.connect = c.connect;
    r.port = app.count("--port") != 0 ? c.port : port;
    r.size = app.count("--size") != 0 ? c.size : size;
    r.iters = app.count("--iters") != 0 ? c.iters : iters;
    r.test = c.test;
    r.qp_timeout = c.qp_timeout;
    return r;
  };
  if (cm && c.peer_format == "perftest") {
    if (!c.connect.empty()) return vrdma::perf::run_perftest_cm_client(cm_config(c.port, c.size, c.iters));
    return vrdma::perf::run_perftest_cm_server(cm_config(c.port, c.size, c.iters));
  }
  if (c.peer_format == "rping") return vrdma::perf::run_rping(cm_config(7174, 64, c.iters));  // rping's defaults
  if (c.peer_format == "ucmatose") return vrdma::perf::run_ucmatose(cm_config(7471, 100, 10));  // ucmatose's
  if (c.peer_format != "vrdma") return run_foreign(c);
  return run_native(c);
}

