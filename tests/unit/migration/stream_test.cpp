// The switchover stream's decoders of what a peer vrdmad sends (migration/stream.hpp): the RDMA
// endpoint in HELLO / HELLO_OK and STATE_WRITTEN round-trip, and every malformed or out-of-range
// field is refused with a sentence naming it (the fuzzer covers arbitrary bytes).
#define BOOST_TEST_MODULE migration_stream
#include <boost/test/unit_test.hpp>

#include <string>

#include "vrdma/migration/stream.hpp"

using namespace vrdma::migration;

namespace {
std::span<const std::uint8_t> bytes(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}
const std::string kHello =
    R"({"gid":"::ffff:10.66.0.1","mac":"52:54:00:66:00:01","engine":"soft","state_version":3,"source":"a")";
}  // namespace

BOOST_AUTO_TEST_CASE(rdma_endpoints_and_state_written_round_trip) {
  HelloOk ok;
  ok.prestate = true;
  ok.rdma = RdmaPeer{"::ffff:10.67.0.2", 0x123456, 0xabcdef, 0x7f0000001000, 0x1234, 2u << 20};
  const auto text = encode_hello_ok(ok);
  auto back = decode_hello_ok(bytes(text));
  BOOST_REQUIRE(back.ok());
  BOOST_TEST(back->prestate);
  BOOST_TEST((back->rdma == ok.rdma));

  auto h = decode_hello(bytes(kHello + R"(,"rdma":{"gid":"::ffff:10.67.0.1","qpn":17,"psn":4660},"state_hint":1290000})"));
  BOOST_REQUIRE(h.ok());
  BOOST_REQUIRE(h->rdma.has_value());
  BOOST_TEST(h->rdma->qpn == 17u);
  BOOST_TEST(h->rdma->bytes == 0u);
  BOOST_TEST(h->state_hint == 1290000u);

  auto w = decode_state_written(bytes(encode_state_written({1290000, 0xdeadbeef})));
  BOOST_REQUIRE(w.ok());
  BOOST_TEST(w->bytes == 1290000u);
  BOOST_TEST(w->crc32 == 0xdeadbeefu);
}

// Both ends name their vrdma release; a HELLO or HELLO_OK from a release before the field still
// decodes (release empty), and one whose release is not a short string is refused.
BOOST_AUTO_TEST_CASE(hello_and_hello_ok_carry_the_release) {
  Hello h;
  h.gid = "::ffff:10.67.0.1";
  h.mac = "52:54:00:66:00:01";
  h.engine = "soft";
  h.state_version = 3;
  h.source = "hostA:/run/vrdma/g.ctl";
  h.release = "0.1.0";
  auto back = decode_hello(bytes(encode_hello(h)));
  BOOST_REQUIRE(back.ok());
  BOOST_TEST(back->release == "0.1.0");
  BOOST_TEST(back->state_version == 3u);
  auto old = decode_hello(bytes(kHello + "}"));
  BOOST_REQUIRE(old.ok());
  BOOST_TEST(old->release.empty());
  BOOST_TEST(!decode_hello(bytes(kHello + R"(,"release":7})")).ok());
  BOOST_TEST(!decode_hello(bytes(kHello + R"(,"release":")" + std::string(33, '9') + R"("})")).ok());

  HelloOk ok;
  ok.release = "0.2.0";
  auto okb = decode_hello_ok(bytes(encode_hello_ok(ok)));
  BOOST_REQUIRE(okb.ok());
  BOOST_TEST(okb->release == "0.2.0");
  BOOST_TEST(decode_hello_ok(bytes(R"({"prestate":true})")).ok());
  BOOST_TEST(!decode_hello_ok(bytes(R"({"release":[1]})")).ok());
}

BOOST_AUTO_TEST_CASE(malformed_rdma_endpoints_are_refused_with_the_reason) {
  const char* bad_rdma[] = {
      R"({"prestate":true,"rdma":"no"})",
      R"({"prestate":true,"rdma":{"qpn":1,"psn":1}})",
      R"({"prestate":true,"rdma":{"gid":"not a gid","qpn":1,"psn":1}})",
      R"({"prestate":true,"rdma":{"gid":"::1","qpn":16777216,"psn":1}})",
      R"({"prestate":true,"rdma":{"gid":"::1","qpn":1,"psn":-1}})",
      R"({"prestate":true,"rdma":{"gid":"::1","qpn":1,"psn":1,"bytes":67108865}})",
      R"({"prestate":true,"rdma":{"gid":"::1","qpn":1,"psn":1,"rkey":4294967296,"bytes":4096}})",
  };
  for (const char* t : bad_rdma) {
    auto r = decode_hello_ok(bytes(t));
    BOOST_TEST_CONTEXT(t) {
      BOOST_REQUIRE(!r.ok());
      BOOST_TEST(r.error().message.find("the peer's RDMA endpoint is malformed") != std::string::npos);
    }
  }
  BOOST_TEST(!decode_hello_ok(bytes("[1]")).ok());
  // A buffer of no bytes has no address or key.
  auto none = decode_hello_ok(bytes(R"({"rdma":{"gid":"::1","qpn":1,"psn":1,"addr":4096,"rkey":7}})"));
  BOOST_REQUIRE(none.ok());
  BOOST_TEST(none->rdma->addr == 0u);
  BOOST_TEST(none->rdma->rkey == 0u);
  // In HELLO too, and a state hint beyond the largest state.
  BOOST_TEST(!decode_hello(bytes(kHello + R"(,"rdma":{"gid":"x","qpn":1,"psn":1}})")).ok());
  BOOST_TEST(!decode_hello(bytes(kHello + R"(,"state_hint":67108865})")).ok());
}

BOOST_AUTO_TEST_CASE(state_written_needs_a_size_up_to_the_largest_state_and_a_crc) {
  const char* bad[] = {R"({"bytes":1})", R"({"crc32":1})", R"({"bytes":67108865,"crc32":1})",
                       R"({"bytes":1,"crc32":4294967296})", R"({"bytes":"1","crc32":1})", "nonsense"};
  for (const char* t : bad) {
    auto r = decode_state_written(bytes(t));
    BOOST_TEST_CONTEXT(t) {
      BOOST_REQUIRE(!r.ok());
      BOOST_TEST(r.error().message.find("STATE_WRITTEN") != std::string::npos);
    }
  }
}
