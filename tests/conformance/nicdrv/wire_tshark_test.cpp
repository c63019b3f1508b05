// Our RoCEv2 packets as other implementations see them: one packet of every opcode is written to
// a pcap (Ethernet + IPv4 + UDP 4791) and decoded by Wireshark's infiniband dissector (tshark);
// its ICRC is recomputed by Scapy's independent RoCE layer (scapy.contrib.roce). Wireshark 4.0
// shows the ICRC but has no preference to verify it, hence the second tool. Each test is skipped,
// with a message, when its tool is missing. VRDMA_KEEP_TMP=1 keeps the pcap for inspection.
#define BOOST_TEST_MODULE wire_tshark_test
#include <boost/test/unit_test.hpp>

#include <arpa/inet.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "vrdma/nicdrv/proto/mad.hpp"
#include "vrdma/nicdrv/proto/wire.hpp"

namespace w = vrdma::nicdrv::soft::wire;
namespace fs = std::filesystem;
using w::Opcode;

namespace {

struct Built {
  Opcode op;
  w::Headers hdr;
  std::vector<std::uint8_t> ib;  // UDP payload: BTH .. ICRC
};

w::Ipv4Context ctx() {
  w::Ipv4Context ip;
  ip.src_be = htonl(0x0a000001);
  ip.dst_be = htonl(0x0a000002);
  ip.ip_id = 0x1234;
  ip.udp_src_port = 0xc123;
  return ip;
}

std::vector<Built> every_opcode() {
  std::vector<Built> out;
  for (unsigned b = 0; b < 256; ++b) {
    const auto& oi = w::opcode_table()[b];
    if (!oi.valid) continue;
    Built p{static_cast<Opcode>(b), {}, {}};
    w::Headers& h = p.hdr;
    h.bth.opcode = p.op;
    h.bth.dest_qp = 0xa00000 | b;         // distinct per packet
    h.bth.psn = w::psn_add(0xfffff0, b);  // straddles the 24-bit wrap
    h.bth.ack_req = (oi.flags & w::kIsLast) != 0;
    h.reth = {0x00007f0012345000ULL + b, 0x1000 + b, 4096};
    h.aeth = w::Aeth::make(w::AckType::ack, w::kCreditInvalid, 0x10000 + b);
    h.atomic = {0x00007f0000001000ULL, 0x2000 + b, 5, 7};
    h.atomic_ack = 0x1122334455667788ULL;
    h.imm = 0xc0ffee00 + b;
    h.ieth = 0x7e570000 + b;
    h.deth = {0x11111111, 0x000100 + b};
    const std::size_t n = (oi.flags & w::kHasPayload) ? 13 : 0;
    p.ib.resize(oi.hdr_len + n + 3 + w::kIcrcLen);
    const std::size_t hl = w::encode_headers(h, n, p.ib);
    BOOST_REQUIRE_EQUAL(hl, oi.hdr_len);
    for (std::size_t i = 0; i < n; ++i) p.ib[hl + i] = static_cast<std::uint8_t>('a' + i);
    p.ib.resize(w::finish_packet(ctx(), p.ib, hl + n));
    BOOST_REQUIRE(!p.ib.empty());
    out.push_back(std::move(p));
  }
  return out;
}

void put16(std::uint8_t* p, std::uint16_t x) {
  p[0] = static_cast<std::uint8_t>(x >> 8);
  p[1] = static_cast<std::uint8_t>(x);
}

// Ethernet II + IPv4 (real header checksum) + UDP (checksum 0, as RoCEv2 senders use) + ib.
std::vector<std::uint8_t> frame(const w::Ipv4Context& ip, const std::vector<std::uint8_t>& ib) {
  std::array<std::uint8_t, 14 + 20 + 8> h{0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1};
  put16(&h[12], 0x0800);
  std::uint8_t* iph = &h[14];
  iph[0] = 0x45;
  put16(iph + 2, static_cast<std::uint16_t>(20 + 8 + ib.size()));
  put16(iph + 4, ip.ip_id);
  put16(iph + 6, ip.dont_fragment ? 0x4000 : 0);
  iph[8] = 64;
  iph[9] = 17;
  std::memcpy(iph + 12, &ip.src_be, 4);
  std::memcpy(iph + 16, &ip.dst_be, 4);
  std::uint32_t sum = 0;
  for (std::size_t k = 0; k < 20; k += 2) sum += static_cast<std::uint32_t>(iph[k] << 8 | iph[k + 1]);
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  put16(iph + 10, static_cast<std::uint16_t>(~sum));
  std::uint8_t* udph = iph + 20;
  put16(udph, ip.udp_src_port);
  put16(udph + 2, ip.udp_dst_port);
  put16(udph + 4, static_cast<std::uint16_t>(8 + ib.size()));
  std::vector<std::uint8_t> f(h.begin(), h.end());
  f.insert(f.end(), ib.begin(), ib.end());
  return f;
}

void le32(std::ofstream& o, std::uint32_t x) {
  for (int k = 0; k < 4; ++k) o.put(static_cast<char>(x >> (8 * k)));
}

// Classic pcap, microsecond timestamps, link type 1 (Ethernet).
void write_pcap(const fs::path& path, const std::vector<Built>& pkts) {
  std::ofstream o(path, std::ios::binary);
  le32(o, 0xa1b2c3d4);
  le32(o, 2 | (4u << 16));  // version 2.4
  le32(o, 0);
  le32(o, 0);
  le32(o, 65535);
  le32(o, 1);
  std::uint32_t t = 0;
  for (const Built& p : pkts) {
    const auto f = frame(ctx(), p.ib);
    le32(o, 1700000000);
    le32(o, t++);
    le32(o, static_cast<std::uint32_t>(f.size()));
    le32(o, static_cast<std::uint32_t>(f.size()));
    o.write(reinterpret_cast<const char*>(f.data()), static_cast<std::streamsize>(f.size()));
  }
  BOOST_REQUIRE(o.good());
}

struct Run {
  int status = -1;
  std::string out;
};

Run run(const std::string& cmd) {
  Run r;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  r.status = ::pclose(f);
  return r;
}

bool works(const std::string& cmd) { return run(cmd + " >/dev/null 2>&1").status == 0; }

// A python3 that can import Scapy's RoCE layer (Debian's python3-scapy lives in /usr/bin's).
std::string scapy_python() {
  for (const char* py : {"python3", "/usr/bin/python3"}) {
    if (works(std::string(py) + " -c 'import scapy.contrib.roce'")) return py;
  }
  return {};
}

struct Tool {
  std::string what;
  bool (*present)();
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    const bool ok = present();
    boost::test_tools::assertion_result r(ok);
    r.message() << what << " is not installed: skipping this check";
    if (!ok) std::clog << "SKIPPED: " << what << " is not installed\n";  // visible at ctest's log level
    return r;
  }
};
bool have_tshark() { return works("tshark --version"); }
bool have_scapy() { return !scapy_python().empty(); }

struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "vrdma-wire-XXXXXX").string();
    if (::mkdtemp(t.data())) path = t;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty() && !std::getenv("VRDMA_KEEP_TMP")) fs::remove_all(path, ec);
  }
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> v;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) v.push_back(cur);
  if (!s.empty() && s.back() == sep) v.emplace_back();
  return v;
}

std::uint64_t num(const std::string& s) { return s.empty() ? ~0ULL : std::stoull(s, nullptr, 0); }

}  // namespace

BOOST_AUTO_TEST_CASE(tshark_decodes_every_opcode_as_encoded,
                     *boost::unit_test::precondition(Tool{"tshark", have_tshark})) {
  TempDir dir;
  BOOST_REQUIRE(!dir.path.empty());
  const auto pkts = every_opcode();
  const fs::path pcap = dir.path / "every_opcode.pcap";
  write_pcap(pcap, pkts);

  // Fields, one line per frame. The infiniband dissector owns UDP 4791 by default.
  const std::vector<std::string> fields = {
      "infiniband.bth.opcode",   "infiniband.bth.destqp",     "infiniband.bth.psn",
      "infiniband.bth.padcnt",   "infiniband.bth.a",          "infiniband.bth.tver",
      "infiniband.bth.p_key",    "infiniband.reth.va",        "infiniband.reth.r_key",
      "infiniband.reth.dmalen",  "infiniband.aeth.syndrome",  "infiniband.aeth.msn",
      "infiniband.deth.q_key",   "infiniband.deth.srcqp",     "infiniband.atomiceth.swapdt",
      "infiniband.atomiceth.cmpdt", "infiniband.atomicacketh.origremdt", "infiniband.immdt",
      "infiniband.invariant.crc", "infiniband.ieth", "_ws.col.Info"};
  std::string cmd = "tshark -n -r " + pcap.string() + " -T fields -E separator='|' -E occurrence=f";
  for (const auto& f : fields) cmd += " -e " + f;
  const Run r = run(cmd + " 2>/dev/null");
  BOOST_REQUIRE_EQUAL(r.status, 0);
  const auto lines = split(r.out, '\n');
  BOOST_REQUIRE_GE(lines.size(), pkts.size());

  for (std::size_t i = 0; i < pkts.size(); ++i) {
    const Built& p = pkts[i];
    const auto& oi = w::info(p.op);
    const auto v = split(lines[i], '|');
    BOOST_TEST_CONTEXT(oi.name << ": " << lines[i]) {
      BOOST_REQUIRE_EQUAL(v.size(), fields.size());
      std::map<std::string, std::string> got;
      for (std::size_t k = 0; k < fields.size(); ++k) got[fields[k]] = v[k];
      const auto n = [&](const char* f) { return num(got[f]); };
      BOOST_TEST(n("infiniband.bth.opcode") == static_cast<std::uint8_t>(p.op));
      BOOST_TEST(n("infiniband.bth.destqp") == p.hdr.bth.dest_qp);
      BOOST_TEST(n("infiniband.bth.psn") == p.hdr.bth.psn);
      BOOST_TEST(n("infiniband.bth.padcnt") == p.hdr.bth.pad);
      BOOST_TEST((got["infiniband.bth.a"] == "1" || got["infiniband.bth.a"] == "True") == p.hdr.bth.ack_req);
      BOOST_TEST(n("infiniband.bth.tver") == 0u);
      BOOST_TEST(n("infiniband.bth.p_key") == p.hdr.bth.pkey);
      if (oi.flags & w::kHasReth) {
        BOOST_TEST(n("infiniband.reth.va") == p.hdr.reth.va);
        BOOST_TEST(n("infiniband.reth.r_key") == p.hdr.reth.rkey);
        BOOST_TEST(n("infiniband.reth.dmalen") == p.hdr.reth.dma_len);
      }
      if (oi.flags & w::kHasAeth) {
        BOOST_TEST(n("infiniband.aeth.syndrome") == p.hdr.aeth.syndrome);
        BOOST_TEST(n("infiniband.aeth.msn") == p.hdr.aeth.msn);
      }
      if (oi.flags & w::kHasDeth) {
        BOOST_TEST(n("infiniband.deth.q_key") == p.hdr.deth.qkey);
        BOOST_TEST(n("infiniband.deth.srcqp") == p.hdr.deth.src_qp);
      }
      if (oi.flags & w::kHasAtomicEth) {
        BOOST_TEST(n("infiniband.atomiceth.swapdt") == p.hdr.atomic.swap_add);
        BOOST_TEST(n("infiniband.atomiceth.cmpdt") == p.hdr.atomic.compare);
      }
      if (oi.flags & w::kHasAtomicAckEth) BOOST_TEST(n("infiniband.atomicacketh.origremdt") == p.hdr.atomic_ack);
      if (oi.flags & w::kHasImm) BOOST_TEST(num("0x" + got["infiniband.immdt"]) == p.hdr.imm);
      if (oi.flags & w::kHasIeth) BOOST_TEST(num("0x" + got["infiniband.ieth"]) == p.hdr.ieth);
      // Wireshark shows the last four bytes as a big-endian number; we store the CRC LSB first.
      const std::uint8_t* c = p.ib.data() + p.ib.size() - 4;
      const std::uint32_t shown =
          std::uint32_t{c[0]} << 24 | std::uint32_t{c[1]} << 16 | std::uint32_t{c[2]} << 8 | c[3];
      BOOST_TEST(n("infiniband.invariant.crc") == shown);
      // Our table's names are the dissector's.
      BOOST_TEST(got["_ws.col.Info"].rfind(std::string(oi.name) + " QP=", 0) == 0u);
    }
  }

  // Nothing malformed, no warnings or errors in the full decode.
  const Run verbose = run("tshark -n -r " + pcap.string() + " -V 2>&1");
  BOOST_REQUIRE_EQUAL(verbose.status, 0);
  BOOST_TEST(verbose.out.find("Malformed") == std::string::npos);
  BOOST_TEST(verbose.out.find("[Expert Info (Error") == std::string::npos);
  BOOST_TEST(verbose.out.find("[Expert Info (Warning") == std::string::npos);
  BOOST_TEST(verbose.out.find("Invariant CRC") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(scapy_recomputes_the_same_icrc_for_every_opcode,
                     *boost::unit_test::precondition(Tool{"python3 with Scapy (python3-scapy)", have_scapy})) {
  TempDir dir;
  BOOST_REQUIRE(!dir.path.empty());
  const auto pkts = every_opcode();
  const fs::path pcap = dir.path / "every_opcode.pcap";
  write_pcap(pcap, pkts);
  const Run r = run(scapy_python() + " " VRDMA_ICRC_CHECK_PY " " + pcap.string() + " 2>&1");
  BOOST_TEST_MESSAGE(r.out);
  BOOST_TEST(r.status == 0);
  std::size_t ok = 0;
  for (const auto& line : split(r.out, '\n')) ok += line.find(" ok ") != std::string::npos;
  BOOST_TEST(ok == pkts.size());

  // And the check itself can fail: a packet with one ICRC bit flipped is reported bad.
  auto bad = pkts;
  bad[0].ib.back() ^= 0x80;
  write_pcap(pcap, bad);
  const Run rb = run(scapy_python() + " " VRDMA_ICRC_CHECK_PY " " + pcap.string() + " 2>&1");
  BOOST_TEST(rb.status != 0);
  BOOST_TEST(rb.out.find("frame 1 BAD") != std::string::npos);
}

// Our CM MADs as Wireshark's CM dissector reads them: one UD SEND ONLY to QP1 per message we send
// (REQ with the RDMA-CM header, MRA, REJ, REP, RTU, DREQ, DREP), every field tshark names equal to
// what we encoded, nothing malformed (a full 256-byte MAD: a short capture shows "Malformed").
BOOST_AUTO_TEST_CASE(tshark_decodes_every_cm_mad_as_encoded, *boost::unit_test::precondition(Tool{"tshark", have_tshark})) {
  namespace mad = vrdma::nicdrv::soft::mad;
  mad::Req req;
  req.local_comm_id = 0x11223344;
  req.service_id = 0x0000000001061c06;  // RDMA_PS_TCP, port 7174
  req.local_ca_guid = 0x0200c0fffe0a0001;
  req.local_qpn = 0xabcdef;
  req.responder_resources = 4;
  req.initiator_depth = 2;
  req.remote_cm_response_timeout = 20;
  req.end_to_end_flow_control = true;
  req.starting_psn = 0x123456;
  req.local_cm_response_timeout = 18;
  req.retry_count = 7;
  req.path_mtu = 5;
  req.rnr_retry_count = 6;
  req.max_cm_retries = 15;
  req.primary_local_gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1};  // ::ffff:10.0.0.1
  req.primary_remote_gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2};
  req.primary_packet_rate = 3;
  req.primary_hop_limit = 64;
  req.primary_local_ack_timeout = 17;
  mad::CmaHeader cma;
  cma.src_port = 0xc123;
  cma.src_ip_be = htonl(0x0a000001);
  cma.dst_ip_be = htonl(0x0a000002);
  mad::encode_cma(cma, req.private_data);
  mad::Mra mra;
  mra.local_comm_id = 0x55667788;
  mra.remote_comm_id = 0x11223344;
  mra.service_timeout = 21;
  mad::Rej rej;
  rej.remote_comm_id = 0x11223344;
  rej.reason = 8;
  mad::Rep rep;
  rep.local_comm_id = 0x55667788;
  rep.remote_comm_id = 0x11223344;
  rep.local_qpn = 0x000012;
  rep.starting_psn = 0x654321;
  rep.responder_resources = 3;
  rep.initiator_depth = 1;
  rep.end_to_end_flow_control = true;
  rep.rnr_retry_count = 7;
  rep.local_ca_guid = 0x0200c0fffe0a0002;
  mad::Rtu rtu;
  rtu.local_comm_id = 0x11223344;
  rtu.remote_comm_id = 0x55667788;
  mad::Dreq dreq;
  dreq.local_comm_id = 0x11223344;
  dreq.remote_comm_id = 0x55667788;
  dreq.remote_qpn = 0x000012;
  mad::Drep drep;
  drep.local_comm_id = 0x55667788;
  drep.remote_comm_id = 0x11223344;
  const std::vector<mad::Message> msgs = {req, mra, rej, rep, rtu, dreq, drep};

  std::vector<Built> pkts;
  for (std::size_t i = 0; i < msgs.size(); ++i) {
    mad::Header h;
    h.tid = 0x0102030405060700ull + i;
    const mad::MadBytes m = mad::encode(h, msgs[i]);
    Built p{Opcode::ud_send_only, {}, {}};
    p.hdr.bth.opcode = Opcode::ud_send_only;
    p.hdr.bth.dest_qp = mad::kGsiQpn;
    p.hdr.bth.psn = static_cast<std::uint32_t>(i);
    p.hdr.deth = {mad::kGsiQkey, mad::kGsiQpn};
    const auto& oi = w::info(Opcode::ud_send_only);
    p.ib.resize(oi.hdr_len + m.size() + 3 + w::kIcrcLen);
    const std::size_t hl = w::encode_headers(p.hdr, m.size(), p.ib);
    BOOST_REQUIRE_EQUAL(hl, oi.hdr_len);
    std::copy(m.begin(), m.end(), p.ib.begin() + static_cast<std::ptrdiff_t>(hl));
    p.ib.resize(w::finish_packet(ctx(), p.ib, hl + m.size()));
    pkts.push_back(std::move(p));
  }
  TempDir dir;
  BOOST_REQUIRE(!dir.path.empty());
  const fs::path pcap = dir.path / "cm_mads.pcap";
  write_pcap(pcap, pkts);

  const std::vector<std::string> fields = {
      "infiniband.mad.mgmtclass", "infiniband.mad.classversion", "infiniband.mad.method", "infiniband.mad.attributeid",
      "infiniband.mad.transactionid", "infiniband.cm.req.serviceid", "infiniband.cm.req.localcaguid",
      "infiniband.cm.req.localqpn", "infiniband.cm.req.responderres", "infiniband.cm.req.initdepth",
      "infiniband.cm.req.remoteresptout", "infiniband.cm.req.startpsn", "infiniband.cm.req.localresptout",
      "infiniband.cm.req.retrcount", "infiniband.cm.req.pppmtu", "infiniband.cm.req.rnrretrcount",
      "infiniband.cm.req.maxcmretr", "infiniband.cm.req.prim_localgid_ipv4", "infiniband.cm.req.prim_remotegid_ipv4",
      "infiniband.cm.req.prim_hoplim", "infiniband.cm.req.prim_localacktout", "infiniband.cm.req.ip_cm.ipv",
      "infiniband.cm.req.ip_cm.sport", "infiniband.cm.req.ip_cm.sip4", "infiniband.cm.req.ip_cm.dip4",
      "infiniband.cm.rej.remotecommid", "infiniband.cm.rej.reason", "infiniband.cm.rep.remotecommid",
      "infiniband.cm.rep.localqpn", "infiniband.cm.rep.startpsn", "infiniband.cm.rep.respres",
      "infiniband.cm.rep.initdepth", "infiniband.cm.rep.rnrretrcount", "infiniband.cm.rep.localcaguid",
      "infiniband.cm.rtu.localcommid", "infiniband.cm.rtu.remotecommid", "infiniband.cm.dreq.localcommid",
      "infiniband.cm.dreq.remotecommid", "infiniband.cm.drsp.localcommid", "infiniband.cm.drsp.remotecommid",
      "_ws.col.Info"};
  std::string cmd = "tshark -n -r " + pcap.string() + " -T fields -E separator='|' -E occurrence=f";
  for (const auto& f : fields) cmd += " -e " + f;
  const Run r = run(cmd + " 2>/dev/null");
  BOOST_REQUIRE_EQUAL(r.status, 0);
  const auto lines = split(r.out, '\n');
  BOOST_REQUIRE_GE(lines.size(), pkts.size());
  std::vector<std::map<std::string, std::string>> got(pkts.size());
  for (std::size_t i = 0; i < pkts.size(); ++i) {
    const auto v = split(lines[i], '|');
    BOOST_REQUIRE_EQUAL(v.size(), fields.size());
    for (std::size_t k = 0; k < fields.size(); ++k) got[i][fields[k]] = v[k];
    BOOST_TEST(num(got[i]["infiniband.mad.mgmtclass"]) == 0x07u);
    BOOST_TEST(num(got[i]["infiniband.mad.classversion"]) == 2u);
    BOOST_TEST(num(got[i]["infiniband.mad.method"]) == 3u);
    BOOST_TEST(num(got[i]["infiniband.mad.attributeid"]) == static_cast<std::uint16_t>(mad::attr_of(msgs[i])));
    BOOST_TEST(num(got[i]["infiniband.mad.transactionid"]) == 0x0102030405060700ull + i);
  }
  const auto n = [&](std::size_t i, const char* f) { return num(got[i][f]); };
  BOOST_TEST(got[0]["_ws.col.Info"].find("ConnectRequest") != std::string::npos);
  BOOST_TEST(n(0, "infiniband.cm.req.serviceid") == req.service_id);
  BOOST_TEST(n(0, "infiniband.cm.req.localcaguid") == req.local_ca_guid);
  BOOST_TEST(n(0, "infiniband.cm.req.localqpn") == req.local_qpn);
  BOOST_TEST(n(0, "infiniband.cm.req.responderres") == 4u);
  BOOST_TEST(n(0, "infiniband.cm.req.initdepth") == 2u);
  BOOST_TEST(n(0, "infiniband.cm.req.remoteresptout") == 20u);
  BOOST_TEST(n(0, "infiniband.cm.req.startpsn") == req.starting_psn);
  BOOST_TEST(n(0, "infiniband.cm.req.localresptout") == 18u);
  BOOST_TEST(n(0, "infiniband.cm.req.retrcount") == 7u);
  BOOST_TEST(n(0, "infiniband.cm.req.pppmtu") == 5u);
  BOOST_TEST(n(0, "infiniband.cm.req.rnrretrcount") == 6u);
  BOOST_TEST(n(0, "infiniband.cm.req.maxcmretr") == 15u);
  BOOST_TEST(got[0]["infiniband.cm.req.prim_localgid_ipv4"] == "10.0.0.1");
  BOOST_TEST(got[0]["infiniband.cm.req.prim_remotegid_ipv4"] == "10.0.0.2");
  BOOST_TEST(n(0, "infiniband.cm.req.prim_hoplim") == 64u);
  BOOST_TEST(n(0, "infiniband.cm.req.prim_localacktout") == 17u);
  BOOST_TEST(n(0, "infiniband.cm.req.ip_cm.ipv") == 4u);
  BOOST_TEST(n(0, "infiniband.cm.req.ip_cm.sport") == 0xc123u);
  BOOST_TEST(got[0]["infiniband.cm.req.ip_cm.sip4"] == "10.0.0.1");
  BOOST_TEST(got[0]["infiniband.cm.req.ip_cm.dip4"] == "10.0.0.2");
  BOOST_TEST(got[1]["_ws.col.Info"].find("MsgRcptAck") != std::string::npos);
  BOOST_TEST(n(2, "infiniband.cm.rej.remotecommid") == 0x11223344u);
  BOOST_TEST(n(2, "infiniband.cm.rej.reason") == 8u);
  BOOST_TEST(n(3, "infiniband.cm.rep.remotecommid") == 0x11223344u);
  BOOST_TEST(n(3, "infiniband.cm.rep.localqpn") == 0x12u);
  BOOST_TEST(n(3, "infiniband.cm.rep.startpsn") == 0x654321u);
  BOOST_TEST(n(3, "infiniband.cm.rep.respres") == 3u);
  BOOST_TEST(n(3, "infiniband.cm.rep.initdepth") == 1u);
  BOOST_TEST(n(3, "infiniband.cm.rep.rnrretrcount") == 7u);
  BOOST_TEST(n(3, "infiniband.cm.rep.localcaguid") == rep.local_ca_guid);
  BOOST_TEST(n(4, "infiniband.cm.rtu.localcommid") == 0x11223344u);
  BOOST_TEST(n(4, "infiniband.cm.rtu.remotecommid") == 0x55667788u);
  BOOST_TEST(n(5, "infiniband.cm.dreq.localcommid") == 0x11223344u);
  BOOST_TEST(n(5, "infiniband.cm.dreq.remotecommid") == 0x55667788u);
  BOOST_TEST(n(6, "infiniband.cm.drsp.localcommid") == 0x55667788u);
  BOOST_TEST(n(6, "infiniband.cm.drsp.remotecommid") == 0x11223344u);

  const Run verbose = run("tshark -n -r " + pcap.string() + " -V 2>&1");
  BOOST_REQUIRE_EQUAL(verbose.status, 0);
  BOOST_TEST(verbose.out.find("Malformed") == std::string::npos);
  BOOST_TEST(verbose.out.find("[Expert Info (Error") == std::string::npos);
  BOOST_TEST(verbose.out.find("[Expert Info (Warning") == std::string::npos);
}
