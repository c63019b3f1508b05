// vrdma-perf's peers that connect through RDMA-CM (cm.hpp) instead of an out-of-band TCP
// exchange: rping (librdmacm's example) in either role, and perftest with -R.
#pragma once

#include <cstdint>
#include <string>

namespace vrdma::perf {

struct CmRunConfig {
  std::string device;   // our device, e.g. soft:10.77.0.1
  std::string connect;  // the server's IPv4 address; empty: serve
  std::uint16_t port = 7174;
  std::uint32_t size = 64;
  std::uint64_t iters = 10;
  unsigned qp_timeout = 17;        // local ACK timeout exponent
  std::string test = "send_bw";    // perftest -R: write_bw, read_bw, send_bw
};

// rping (rdma-core librdmacm/examples/rping.c): the client SENDs {addr, rkey, len} of its
// source buffer, the server RDMA READs it and SENDs a go-ahead, the client SENDs its sink
// buffer, the server RDMA WRITEs the data there and SENDs a go-ahead; the client compares
// (rping -V). We check the data in both roles. Prints one JSON line; exit 0 if verified.
int run_rping(const CmRunConfig& c);

// ucmatose (rdma-core librdmacm/examples/cmatose.c) in either role: each side posts its receives
// before the connection is up; the server SENDs `iters` messages of `size` bytes, the client
// receives them all and answers with as many; the server then disconnects. ucmatose fills no
// pattern, so we check counts and lengths: every message of ours completed and each of theirs
// arrived, `size` bytes long. Prints one JSON line; exit 0 if so.
int run_ucmatose(const CmRunConfig& c);

// perftest with -R (ib_send_bw -R ... <our address>) as its server. perftest's out-of-band
// channel is then itself an RDMA-CM connection (the first on its port) carrying the same records
// as its TCP exchange, one record per SEND; the test's QP is a second RDMA-CM connection. We
// answer every record with the client's own bytes (we agree with its version, sizes and keys, as
// the TCP server does) and keep receives posted on the test QP until the client disconnects.
// send_bw counts the messages; write_bw names our buffer in its key records and counts the
// engine's packets (engine.rx_packets: since the listener opened). Prints one JSON line; exit 0
// if data arrived and the client left.
int run_perftest_cm_server(const CmRunConfig& c);

// perftest with -R as its client (ib_send_bw -R / ib_write_bw -R serving): the records its
// client sends, then `iters` SENDs or WRITEs of `size` bytes on the test QP (write_bw: into the
// buffer the server named, and our report, which the server prints). Prints one JSON line; exit
// 0 when every work request completed and the server took the closing record.
int run_perftest_cm_client(const CmRunConfig& c);

}  // namespace vrdma::perf
