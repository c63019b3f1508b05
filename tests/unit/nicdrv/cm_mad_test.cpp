// CM MAD codec (vrdma/nicdrv/proto/mad.hpp): every attribute encoded and parsed back with fields
// at their edges, a REQ written byte by byte from IBA table 106 (independently of our field
// table) and decoded, field packing next to neighbours, the RDMA-CM header, and bad input
// (every length, base/class version, method, class, attribute) refused.
#define BOOST_TEST_MODULE cm_mad_test
#include <boost/test/unit_test.hpp>

#include <arpa/inet.h>

#include <cstring>
#include <vector>

#include "vrdma/nicdrv/proto/mad.hpp"

namespace mad = vrdma::nicdrv::soft::mad;

namespace {

mad::Req full_req() {
  mad::Req r;
  r.local_comm_id = 0xdeadbeef;
  r.service_id = 0x0000000001064a4b;
  r.local_ca_guid = 0x0200c0fffe0a0001;
  r.local_qkey = 0x80010000;
  r.local_qpn = 0xffffff;
  r.responder_resources = 0xff;
  r.local_eecn = 0xabcdef;
  r.initiator_depth = 0x10;
  r.remote_eecn = 0x123456;
  r.remote_cm_response_timeout = 31;
  r.transport_service_type = 3;
  r.end_to_end_flow_control = true;
  r.starting_psn = 0xfffffe;
  r.local_cm_response_timeout = 17;
  r.retry_count = 7;
  r.pkey = 0x7fff;
  r.path_mtu = 5;
  r.rdc_exists = true;
  r.rnr_retry_count = 6;
  r.max_cm_retries = 15;
  r.srq = true;
  r.extended_transport_type = 5;
  r.primary_local_lid = 0x1234;
  r.primary_remote_lid = 0xffff;
  for (int i = 0; i < 16; ++i) {
    r.primary_local_gid[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i);
    r.primary_remote_gid[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(0xf0 + i);
  }
  r.primary_flow_label = 0xfffff;
  r.primary_packet_rate = 0x3f;
  r.primary_traffic_class = 0xb8;
  r.primary_hop_limit = 64;
  r.primary_sl = 15;
  r.primary_subnet_local = true;
  r.primary_local_ack_timeout = 31;
  for (std::size_t i = 0; i < r.alternate.size(); ++i) r.alternate[i] = static_cast<std::uint8_t>(0x40 + i);
  for (std::size_t i = 0; i < r.private_data.size(); ++i) r.private_data[i] = static_cast<std::uint8_t>(i * 3);
  return r;
}

template <class M>
M round_trip(const M& m, std::uint64_t tid = 0x0102030405060708) {
  mad::Header h;
  h.tid = tid;
  const mad::MadBytes b = mad::encode(h, m);
  mad::Mad out;
  BOOST_REQUIRE(mad::parse(b, out) == mad::ParseError::none);
  BOOST_TEST(out.hdr.tid == tid);
  BOOST_TEST(out.hdr.attr_id == static_cast<std::uint16_t>(mad::attr_of(m)));
  BOOST_REQUIRE(std::holds_alternative<M>(out.msg));
  return std::get<M>(out.msg);
}

}  // namespace

BOOST_AUTO_TEST_CASE(attribute_table_is_complete_and_consistent) {
  for (const auto& a : mad::kCmAttrs) {
    BOOST_TEST(a.private_off + a.private_len == mad::kDataLen);
    BOOST_TEST(mad::attr_info(static_cast<std::uint16_t>(a.id)) == &a);
  }
  BOOST_TEST(mad::attr_info(0x0010)->name == "ConnectRequest");
  BOOST_TEST(mad::attr_info(0x0000) == nullptr);
  BOOST_TEST(mad::attr_info(0x001b) == nullptr);
}

BOOST_AUTO_TEST_CASE(req_round_trips_with_every_field_at_its_maximum) {
  const mad::Req r = full_req();
  BOOST_TEST((round_trip(r) == r));
  mad::Req zero;
  zero.pkey = 0;
  zero.primary_local_lid = zero.primary_remote_lid = 0;
  BOOST_TEST((round_trip(zero) == zero));
}

BOOST_AUTO_TEST_CASE(every_other_attribute_round_trips) {
  mad::Mra mra;
  mra.local_comm_id = 1;
  mra.remote_comm_id = 0xffffffff;
  mra.message_mraed = 3;
  mra.service_timeout = 31;
  mra.private_data.fill(0xa5);
  BOOST_TEST((round_trip(mra) == mra));

  mad::Rej rej;
  rej.local_comm_id = 2;
  rej.remote_comm_id = 3;
  rej.message_rejected = 2;
  rej.reject_info_length = 72;
  rej.reason = 0xffff;
  rej.ari.fill(0x11);
  rej.private_data.fill(0x22);
  BOOST_TEST((round_trip(rej) == rej));

  mad::Rep rep;
  rep.local_comm_id = 4;
  rep.remote_comm_id = 5;
  rep.local_qkey = 0xffffffff;
  rep.local_qpn = 0xffffff;
  rep.local_eecn = 0xfffffe;
  rep.starting_psn = 0xfffffd;
  rep.responder_resources = 0xff;
  rep.initiator_depth = 0xfe;
  rep.target_ack_delay = 31;
  rep.failover_accepted = 3;
  rep.end_to_end_flow_control = true;
  rep.rnr_retry_count = 7;
  rep.srq = true;
  rep.local_ca_guid = 0xffffffffffffffff;
  rep.private_data.fill(0x33);
  BOOST_TEST((round_trip(rep) == rep));

  mad::Rtu rtu;
  rtu.local_comm_id = 6;
  rtu.remote_comm_id = 7;
  rtu.private_data.fill(0x44);
  BOOST_TEST((round_trip(rtu) == rtu));

  mad::Dreq dreq;
  dreq.local_comm_id = 8;
  dreq.remote_comm_id = 9;
  dreq.remote_qpn = 0xffffff;
  dreq.private_data.fill(0x55);
  BOOST_TEST((round_trip(dreq) == dreq));

  mad::Drep drep;
  drep.local_comm_id = 10;
  drep.remote_comm_id = 11;
  drep.private_data.fill(0x66);
  BOOST_TEST((round_trip(drep) == drep));
}

// The REQ written by hand from IBA table 106 (offsets from the start of the MAD): the decoder
// must read each field from there, and the encoder must write exactly these bytes.
BOOST_AUTO_TEST_CASE(a_req_laid_out_by_hand_decodes_field_by_field) {
  mad::MadBytes b{};
  b[0] = 1;     // base version
  b[1] = 0x07;  // CM class
  b[2] = 2;     // class version
  b[3] = 0x03;  // Send
  for (int i = 0; i < 8; ++i) b[8 + static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(0xa0 + i);  // TID
  b[16] = 0x00;
  b[17] = 0x10;  // attribute ID: REQ
  std::uint8_t* d = b.data() + 24;
  const std::uint8_t id[4] = {0x12, 0x34, 0x56, 0x78};
  std::memcpy(d + 0, id, 4);                                          // local comm ID
  const std::uint8_t sid[8] = {0, 0, 0, 0, 0x01, 0x06, 0x1c, 0x06};  // RDMA_PS_TCP, port 7174
  std::memcpy(d + 8, sid, 8);
  d[32] = 0x00, d[33] = 0x00, d[34] = 0x11;  // local QPN 0x11
  d[35] = 4;                                 // responder resources
  d[39] = 2;                                 // initiator depth
  d[43] = static_cast<std::uint8_t>(20 << 3 | 0 << 1 | 1);  // remote resp timeout 20, RC, flow control
  d[44] = 0xab, d[45] = 0xcd, d[46] = 0xef;                // starting PSN
  d[47] = static_cast<std::uint8_t>(18 << 3 | 7);          // local resp timeout 18, retry 7
  d[48] = 0xff, d[49] = 0xff;                              // P_Key
  d[50] = static_cast<std::uint8_t>(5 << 4 | 0 << 3 | 6);  // MTU 4096, no RDC, RNR retry 6
  d[51] = static_cast<std::uint8_t>(15 << 4 | 1 << 3 | 0); // max CM retries 15, SRQ
  d[52] = 0xff, d[53] = 0xff, d[54] = 0xff, d[55] = 0xff;  // permissive LIDs
  d[56 + 10] = 0xff, d[56 + 11] = 0xff, d[56 + 12] = 10, d[56 + 15] = 2;  // ::ffff:10.0.0.2
  d[72 + 10] = 0xff, d[72 + 11] = 0xff, d[72 + 12] = 10, d[72 + 15] = 1;  // ::ffff:10.0.0.1
  d[88] = 0x12, d[89] = 0x34, d[90] = 0x50;          // flow label 0x12345 (upper 20 bits)
  d[91] = 0x03;                                      // packet rate 3
  d[92] = 0x20;                                      // traffic class
  d[93] = 64;                                        // hop limit
  d[94] = static_cast<std::uint8_t>(3 << 4 | 1 << 3);  // SL 3, subnet local
  d[95] = static_cast<std::uint8_t>(17 << 3);        // local ACK timeout 17
  d[140] = 0x00, d[141] = 0x40, d[142] = 0xc0, d[143] = 0x01;  // cma header: v0, IPv4, port 0xc001
  d[140 + 4 + 12] = 10, d[140 + 4 + 15] = 2;
  d[140 + 20 + 12] = 10, d[140 + 20 + 15] = 1;

  mad::Mad m;
  BOOST_REQUIRE(mad::parse(b, m) == mad::ParseError::none);
  BOOST_TEST(m.hdr.tid == 0xa0a1a2a3a4a5a6a7ull);
  const auto& r = std::get<mad::Req>(m.msg);
  BOOST_TEST(r.local_comm_id == 0x12345678u);
  BOOST_TEST(r.service_id == 0x00000000'01061c06ull);
  BOOST_TEST(r.local_qpn == 0x11u);
  BOOST_TEST(r.responder_resources == 4);
  BOOST_TEST(r.initiator_depth == 2);
  BOOST_TEST(r.remote_cm_response_timeout == 20);
  BOOST_TEST(r.transport_service_type == 0);
  BOOST_TEST(r.end_to_end_flow_control);
  BOOST_TEST(r.starting_psn == 0xabcdefu);
  BOOST_TEST(r.local_cm_response_timeout == 18);
  BOOST_TEST(r.retry_count == 7);
  BOOST_TEST(r.pkey == 0xffff);
  BOOST_TEST(r.path_mtu == 5);
  BOOST_TEST(!r.rdc_exists);
  BOOST_TEST(r.rnr_retry_count == 6);
  BOOST_TEST(r.max_cm_retries == 15);
  BOOST_TEST(r.srq);
  BOOST_TEST(r.extended_transport_type == 0);
  BOOST_TEST(r.primary_local_lid == 0xffff);
  BOOST_TEST(r.primary_flow_label == 0x12345u);
  BOOST_TEST(r.primary_packet_rate == 3);
  BOOST_TEST(r.primary_traffic_class == 0x20);
  BOOST_TEST(r.primary_hop_limit == 64);
  BOOST_TEST(r.primary_sl == 3);
  BOOST_TEST(r.primary_subnet_local);
  BOOST_TEST(r.primary_local_ack_timeout == 17);
  BOOST_TEST(r.primary_local_gid[15] == 2);
  BOOST_TEST(r.primary_remote_gid[15] == 1);
  auto cma = mad::parse_cma(r.private_data);
  BOOST_REQUIRE(cma.has_value());
  BOOST_TEST(cma->src_port == 0xc001);
  BOOST_TEST(cma->src_ip_be == htonl(0x0a000002));
  BOOST_TEST(cma->dst_ip_be == htonl(0x0a000001));
  // And back to exactly these bytes.
  const mad::MadBytes again = mad::encode(m.hdr, m.msg);
  BOOST_TEST(std::memcmp(again.data(), b.data(), b.size()) == 0);
}

BOOST_AUTO_TEST_CASE(a_field_leaves_its_neighbours_alone) {
  std::array<std::uint8_t, mad::kDataLen> d{};
  d.fill(0xff);
  const mad::Field psn{44, 0, 24}, timeout{47, 0, 5}, retry{47, 5, 3};
  mad::put(d, timeout, 0);
  BOOST_TEST(d[47] == 0x07);
  BOOST_TEST(mad::get(d, retry) == 7u);
  mad::put(d, psn, 0x123456);
  BOOST_TEST(d[43] == 0xff);
  BOOST_TEST(d[47] == 0x07);
  BOOST_TEST(mad::get(d, psn) == 0x123456u);
  mad::put(d, retry, 0x1f);  // wider than the field: cut to 3 bits
  BOOST_TEST(d[47] == 0x07);
  BOOST_TEST(mad::get(d, mad::Field{231, 0, 8}) == 0xffu);
  BOOST_TEST(mad::get(d, mad::Field{231, 4, 8}) == 0u);  // past the end: refused, reads 0
}

BOOST_AUTO_TEST_CASE(rdma_cm_header_round_trips_and_rejects_non_ipv4) {
  mad::CmaHeader h;
  h.src_port = 0xfffe;
  h.src_ip_be = htonl(0x0a5b0001);
  h.dst_ip_be = htonl(0x0a5b0002);
  std::array<std::uint8_t, 92> buf{};
  mad::encode_cma(h, buf);
  BOOST_TEST(buf[1] == 0x40);
  BOOST_TEST((mad::parse_cma(buf) == h));
  auto v6 = buf;
  v6[1] = 0x60;
  BOOST_TEST(!mad::parse_cma(v6).has_value());
  auto badv = buf;
  badv[0] = 1;
  BOOST_TEST(!mad::parse_cma(badv).has_value());
  BOOST_TEST(!mad::parse_cma(std::span<const std::uint8_t>(buf.data(), 35)).has_value());
}

BOOST_AUTO_TEST_CASE(bad_mads_are_refused_with_the_reason) {
  mad::Header h;
  const mad::MadBytes good = mad::encode(h, mad::Rtu{});
  mad::Mad m;
  for (std::size_t n = 0; n < 300; ++n) {
    std::vector<std::uint8_t> v(n, 0);
    std::copy_n(good.begin(), std::min(n, good.size()), v.begin());
    const auto e = mad::parse(v, m);
    BOOST_TEST((n == 256 ? e == mad::ParseError::none : e == mad::ParseError::bad_length), "length " << n);
  }
  auto with = [&](std::size_t at, std::uint8_t val) {
    auto b = good;
    b[at] = val;
    return mad::parse(b, m);
  };
  BOOST_TEST((with(0, 2) == mad::ParseError::bad_base_version));
  BOOST_TEST((with(1, 0x04) == mad::ParseError::not_cm));   // a performance-management MAD
  BOOST_TEST((with(2, 1) == mad::ParseError::bad_class_version));
  BOOST_TEST((with(3, 0x01) == mad::ParseError::bad_method));  // Get
  BOOST_TEST((with(17, 0x01) == mad::ParseError::unknown_attribute));  // ClassPortInfo: not a CM message
  BOOST_TEST((with(17, 0x20) == mad::ParseError::unknown_attribute));
  BOOST_TEST((with(17, 0x19) == mad::ParseError::unhandled_attribute));  // LAP
  BOOST_TEST((with(17, 0x17) == mad::ParseError::unhandled_attribute));  // SIDR_REQ
  BOOST_TEST(mad::to_string(mad::ParseError::not_cm).size() > 0);
  BOOST_TEST(mad::to_string(mad::RejReason::invalid_service_id).size() > 0);
  BOOST_TEST(mad::to_string(static_cast<mad::RejReason>(99)).empty());
}
