#define BOOST_TEST_MODULE vhost_message
#include <boost/test/unit_test.hpp>
#include <sys/eventfd.h>

#include "vrdma/vhost/message.hpp"

using namespace vrdma;
using namespace vrdma::vhost;

namespace {
const ProtocolFeatures kAll = ProtocolFeatures::from_raw(~std::uint64_t{0});
Message with_fds(Message m, int n) {
  for (int i = 0; i < n; ++i) m.fds.emplace_back(::eventfd(0, EFD_CLOEXEC));
  return m;
}
}  // namespace

BOOST_AUTO_TEST_CASE(table_rows_follow_the_enum_and_names_are_the_spec_names) {
  BOOST_TEST(kMessageTable.size() == static_cast<std::size_t>(Request::count_));
  BOOST_TEST(request_name(5) == "SET_MEM_TABLE");
  BOOST_TEST(request_name(42) == "SET_DEVICE_STATE_FD");
  BOOST_TEST(request_name(1000) == "UNKNOWN");
  BOOST_TEST(kMaxPayload == 268u);
}

BOOST_AUTO_TEST_CASE(feature_sets_are_typed_bits) {
  VirtioFeatures f{VirtioFeature::version_1, VirtioFeature::ring_packed};
  BOOST_TEST(f.raw() == ((1ull << 32) | (1ull << 34)));
  BOOST_TEST(f.has(VirtioFeature::ring_packed));
  BOOST_TEST(!f.has(VirtioFeature::ring_event_idx));
  BOOST_TEST(VirtioFeatures{VirtioFeature::version_1}.subset_of(f));
  BOOST_TEST(!f.subset_of(VirtioFeatures{VirtioFeature::version_1}));
}

BOOST_AUTO_TEST_CASE(sizes_flags_and_versions_are_checked) {
  Message m = make_request(Request::set_features);
  m.set(std::uint64_t{1});
  BOOST_TEST(validate_request(m, kAll).ok());
  m.hdr.size = 7;
  BOOST_TEST(!validate_request(m, kAll).ok());
  m.hdr.size = 8;
  m.hdr.flags = 2;
  BOOST_TEST(!validate_request(m, kAll).ok());
  m.hdr.flags = kVersion | kFlagReply;
  BOOST_TEST(!validate_request(m, kAll).ok());
  m.hdr.flags = kVersion | 0x100;
  BOOST_TEST(!validate_request(m, kAll).ok());
  m.hdr.flags = kVersion | kFlagNeedReply;
  BOOST_TEST(validate_request(m, kAll).ok());
  Message u = make_request(Request::none);
  BOOST_TEST(!validate_request(u, kAll).ok());
  u.hdr.request = 44;
  BOOST_TEST(!validate_request(u, kAll).ok());
}

BOOST_AUTO_TEST_CASE(protocol_gated_requests_need_their_feature) {
  Message m = make_request(Request::get_config);
  m.set(ConfigHeader{0, 4, 0});
  m.hdr.size = sizeof(ConfigHeader) + 4;
  BOOST_TEST(validate_request(m, kAll).ok());
  auto e = validate_request(m, ProtocolFeatures{});
  BOOST_REQUIRE(!e.ok());
  BOOST_TEST(e.error().message.find("not negotiated") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(unsupported_requests_say_so) {
  Message m = make_request(Request::postcopy_advise);
  auto e = validate_request(m, kAll);
  BOOST_REQUIRE(!e.ok());
  BOOST_TEST(e.error().is(Errc::not_supported));
}

BOOST_AUTO_TEST_CASE(fd_rules) {
  Message k = make_request(Request::set_vring_kick);
  k.set(std::uint64_t{3});
  BOOST_TEST(!validate_request(k, kAll).ok());  // needs its fd
  Message k1 = with_fds(std::move(k), 1);
  BOOST_TEST(validate_request(k1, kAll).ok());
  Message n = make_request(Request::set_vring_call);
  n.set(std::uint64_t{3} | kVringNoFd);
  BOOST_TEST(validate_request(n, kAll).ok());
  Message n1 = with_fds(std::move(n), 1);
  BOOST_TEST(!validate_request(n1, kAll).ok());  // NOFD yet an fd
  Message bits = make_request(Request::set_vring_err);
  bits.set(std::uint64_t{1} << 20 | kVringNoFd);
  BOOST_TEST(!validate_request(bits, kAll).ok());
  Message f = with_fds(make_request(Request::get_features), 1);
  BOOST_TEST(!validate_request(f, kAll).ok());
}

BOOST_AUTO_TEST_CASE(mem_table_count_must_match_size_and_fds) {
  auto table = [](std::uint32_t n, std::uint32_t size, int fds) {
    Message m = make_request(Request::set_mem_table);
    m.set(MemTableHeader{n, 0});
    m.hdr.size = size;
    return with_fds(std::move(m), fds);
  };
  BOOST_TEST(validate_request(table(2, 8 + 64, 2), kAll).ok());
  BOOST_TEST(!validate_request(table(2, 8 + 64, 1), kAll).ok());
  BOOST_TEST(!validate_request(table(2, 8 + 32, 2), kAll).ok());
  BOOST_TEST(!validate_request(table(0, 8 + 32, 0), kAll).ok());
  BOOST_TEST(!validate_request(table(9, 8 + 32 * 8, 8), kAll).ok());
  BOOST_TEST(!validate_request(table(0xffffffffu, 8 + 32 * 8, 8), kAll).ok());
}

BOOST_AUTO_TEST_CASE(config_window_is_bounded_without_overflow) {
  auto cfg = [](std::uint32_t off, std::uint32_t size, std::uint32_t payload) {
    Message m = make_request(Request::set_config);
    m.set(ConfigHeader{off, size, 0});
    m.hdr.size = payload;
    return m;
  };
  BOOST_TEST(validate_request(cfg(0, 256, 12 + 256), kAll).ok());
  BOOST_TEST(validate_request(cfg(250, 6, 12 + 6), kAll).ok());
  BOOST_TEST(!validate_request(cfg(251, 6, 12 + 6), kAll).ok());
  BOOST_TEST(!validate_request(cfg(0xffffffffu, 2, 12 + 2), kAll).ok());
  BOOST_TEST(!validate_request(cfg(0, 4, 12 + 5), kAll).ok());
}
