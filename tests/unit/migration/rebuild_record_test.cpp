// The re-creation record of a QP on a NIC (vrdma/migration/rebuild_record.hpp): every version
// this vrdmad reads decodes, a version 2 notice address (IPv4 only) comes back as the same
// address in the current form, an IPv6 one travels as it is, and a token without an address
// notices can reach is refused. The record of a NIC's SRQ (its held receives) travels as it is
// and refuses what does not fit.
#define BOOST_TEST_MODULE migration_rebuild_record
#include <boost/test/unit_test.hpp>

#include <arpa/inet.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "vrdma/migration/peer_notice.hpp"
#include "vrdma/migration/rebuild_record.hpp"

using namespace vrdma::migration;

namespace {

std::vector<std::uint8_t> seed(const std::string& name) {
  std::ifstream f(std::filesystem::path(VRDMA_SOURCE_DIR) / "tests/fuzz/migration/corpus/rebuild_record_fuzzer" / name,
                  std::ios::binary);
  BOOST_REQUIRE_MESSAGE(f, "no seed " << name);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_seed_decodes_and_a_version_2_address_is_kept) {
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(VRDMA_SOURCE_DIR) /
                                                           "tests/fuzz/migration/corpus/rebuild_record_fuzzer")) {
    const auto name = e.path().filename().string();
    if (name.starts_with("srq_")) {  // an SRQ's record (the same fuzzer reads both)
      auto r = rebuild::decode_srq(seed(name));
      BOOST_TEST(r.ok(), name << ": " << (r.ok() ? std::string() : r.error().message));
      continue;
    }
    auto r = rebuild::decode(seed(name));
    BOOST_TEST(r.ok(), name << ": " << (r.ok() ? std::string() : r.error().message));
  }
  auto v2 = rebuild::decode(seed("v2_with_notice_token"));
  auto v3 = rebuild::decode(seed("v3_notice_ipv4"));
  BOOST_REQUIRE(v2.ok());
  BOOST_REQUIRE(v3.ok());
  BOOST_TEST(v2->notice_token != 0u);
  BOOST_TEST(notice::to_string(v2->notice_addr) == "10.92.0.3");
  BOOST_TEST((*v2 == *v3), "the version 2 record and its version 3 form differ");
  // Written again, it is the current version, the same bytes as the version 3 seed.
  BOOST_TEST((rebuild::encode(*v2) == seed("v3_notice_ipv4")));
}

BOOST_AUTO_TEST_CASE(an_ipv6_notice_address_travels_and_a_link_local_one_is_refused) {
  auto r = rebuild::decode(seed("v3_notice_ipv6"));
  BOOST_REQUIRE(r.ok());
  BOOST_TEST(notice::to_string(r->notice_addr) == "fd92::3");
  auto back = rebuild::decode(rebuild::encode(*r));
  BOOST_REQUIRE(back.ok());
  BOOST_TEST((*back == *r));
  r->notice_addr = *notice::parse_address("fe80::3");
  auto bad = rebuild::decode(rebuild::encode(*r));
  BOOST_REQUIRE(!bad.ok());
  BOOST_TEST(bad.error().message.find("notice") != std::string::npos, bad.error().message);
  r->notice_addr = {};
  BOOST_TEST(!rebuild::decode(rebuild::encode(*r)).ok(), "a token without an address");
  r->notice_token = 0;
  BOOST_TEST(rebuild::decode(rebuild::encode(*r)).ok(), "no notice: no address needed");
}

BOOST_AUTO_TEST_CASE(an_srq_record_carries_its_receives_in_order_and_refuses_what_does_not_fit) {
  rebuild::SrqRecord r;
  r.max_sge = 2;
  r.receives.push_back({200, {{0x7f0000100000, 4096, 0x1234}}});
  r.receives.push_back({200, {{0x7f0000101000, 2048, 0x1234}, {0x7f0000102000, 2048, 0x99}}});  // wr_ids need not differ
  r.receives.push_back({7, {}});
  const auto bytes = rebuild::encode_srq(r);
  auto back = rebuild::decode_srq(bytes);
  BOOST_REQUIRE_MESSAGE(back.ok(), (back.ok() ? std::string() : back.error().message));
  BOOST_TEST((*back == r));
  BOOST_TEST(rebuild::decode_srq(seed("srq_three")).ok());
  auto refused = [](const rebuild::SrqRecord& x, std::size_t cut, const std::string& says) {
    auto b = rebuild::encode_srq(x);
    b.resize(b.size() - std::min(cut, b.size()));
    auto d = rebuild::decode_srq(b);
    BOOST_TEST(!d.ok());
    if (!d.ok()) BOOST_TEST(d.error().message.find(says) != std::string::npos, d.error().message);
  };
  refused(r, 1, "truncated");
  auto over = r;
  over.receives[1].sges.push_back({0, 1, 1});  // 3 SGEs in an SRQ of 2
  refused(over, 0, "3 SGEs, the SRQ takes 2");
  auto none = r;
  none.max_sge = 0;
  refused(none, 0, "0 SGEs a receive");
  auto wide = r;
  wide.max_sge = rebuild::kSrqMaxSge + 1;
  refused(wide, 0, "SGEs a receive");
  auto extra = rebuild::encode_srq(r);
  extra.push_back(0);
  BOOST_TEST(!rebuild::decode_srq(extra).ok());
  BOOST_TEST(!rebuild::decode_srq(rebuild::encode(rebuild::Record{})).ok());  // a QP's record is not an SRQ's
  BOOST_TEST(!rebuild::decode(bytes).ok());                                   // nor the other way round
}
