// The re-creation record of a QP on a NIC (vrdma/migration/rebuild_record.hpp): every version
// this vrdmad reads decodes, a version 2 notice address (IPv4 only) comes back as the same
// address in the current form, an IPv6 one travels as it is, and a token without an address
// notices can reach is refused.
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
    auto r = rebuild::decode(seed(e.path().filename().string()));
    BOOST_TEST(r.ok(), e.path().filename().string() << ": " << (r.ok() ? std::string() : r.error().message));
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
