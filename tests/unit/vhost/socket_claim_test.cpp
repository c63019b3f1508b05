// A backend's socket path (vhost/channel.hpp claim_socket_path, listen_unix): a second backend
// never steals a live one's socket, a dead one's socket file is taken over, and a file that is
// not a socket is never removed.
#define BOOST_TEST_MODULE vhost_socket_claim
#include <boost/test/unit_test.hpp>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "vrdma/vhost/channel.hpp"

using namespace vrdma;
using namespace vrdma::vhost;

namespace {
struct Dir {
  std::filesystem::path p;
  Dir() {
    char t[] = "/tmp/vrdma-claim.XXXXXX";
    BOOST_REQUIRE(::mkdtemp(t) != nullptr);
    p = t;
  }
  ~Dir() { std::filesystem::remove_all(p); }
};
bool connects(const std::string& path) {
  UniqueFd c(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return ::connect(c.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_live_listener_is_refused_with_a_sentence_and_keeps_its_socket) {
  Dir d;
  const std::string path = (d.p / "g1.sock").string();
  auto first = listen_unix(path);
  BOOST_REQUIRE(first.ok());
  auto second = listen_unix(path);
  BOOST_REQUIRE(!second.ok());
  BOOST_TEST(second.error().is(Errc::busy));
  BOOST_TEST(second.error().message.find("another process listens on " + path) != std::string::npos,
             second.error().message);
  BOOST_TEST(connects(path));  // the first one still gets its clients
}

BOOST_AUTO_TEST_CASE(a_dead_backends_socket_file_is_taken_over) {
  Dir d;
  const std::string path = (d.p / "g1.sock").string();
  {
    auto first = listen_unix(path);
    BOOST_REQUIRE(first.ok());
  }  // closed: the file stays, nobody listens
  BOOST_REQUIRE(std::filesystem::is_socket(path));
  BOOST_TEST(!connects(path));
  auto second = listen_unix(path);
  BOOST_REQUIRE_MESSAGE(second.ok(), (second.ok() ? "" : second.error().message));
  BOOST_TEST(connects(path));
}

BOOST_AUTO_TEST_CASE(a_file_that_is_not_a_socket_is_never_removed) {
  Dir d;
  const std::string path = (d.p / "disk.img").string();
  std::ofstream(path) << "precious";
  auto l = listen_unix(path);
  BOOST_REQUIRE(!l.ok());
  BOOST_TEST(l.error().is(Errc::invalid_argument));
  BOOST_TEST(l.error().message.find("exists and is not a socket") != std::string::npos, l.error().message);
  std::ifstream in(path);
  std::string s;
  in >> s;
  BOOST_TEST(s == "precious");
  BOOST_TEST(claim_socket_path((d.p / "nothing-here").string()).ok());
}
