// Fuzzes the whole receive path of the backend: bytes become a stream of vhost-user messages
// (with real fds attached) sent over a socketpair to a BackendServer serving the blk fixture;
// the loop dispatches each. Input format, repeated: [1 byte fd count & flags][12-byte header]
// [payload of header.size bytes, capped] (fd count: the low 3 bits; bit 6: eventfds, else the
// guest RAM memfd; bit 7: header.size as given). Every message is also run through validate_request
// directly.
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "blk_device.hpp"
#include "vrdma/common/log.hpp"
#include "vrdma/vhost/backend.hpp"

using namespace vrdma;
using namespace vrdma::vhost;

namespace {

struct World {
  std::unique_ptr<test::BlkDevice> dev;
  std::optional<EventLoop> loop;
  UniqueFd ram;  // a memfd the fuzzer can hand over as guest memory
  World() {
    log::set_level(log::Level::error);
    UniqueFd disk(::memfd_create("fuzz-disk", MFD_CLOEXEC));
    (void)!::ftruncate(disk.get(), 1 << 20);
    dev = std::move(test::BlkDevice::open(std::move(disk), 2).value());
    loop.emplace(std::move(EventLoop::create().value()));
    ram = UniqueFd(::memfd_create("fuzz-ram", MFD_CLOEXEC));
    (void)!::ftruncate(ram.get(), 1 << 20);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static World w;
  static bool quiet = [] {
    log::set_level(log::Level::error);
    return true;
  }();
  (void)quiet;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  UniqueFd front(sv[0]);
  BackendOptions opts;
  opts.message_deadline_ms = 1;
  auto server = BackendServer::adopt(UniqueFd(sv[1]), *w.dev, *w.loop, opts);
  if (!server) return 0;
  Channel chan(std::move(front));
  std::size_t off = 0;
  for (int n = 0; n < 64 && off + 1 + sizeof(Header) <= size; ++n) {
    const std::uint8_t ctl = data[off++];
    Message m;
    std::memcpy(&m.hdr, data + off, sizeof(Header));
    off += sizeof(Header);
    const std::size_t len = std::min<std::size_t>({m.hdr.size, kMaxPayload, size - off});
    std::memcpy(m.payload.data(), data + off, len);
    off += len;
    if ((ctl & 0x80) == 0) m.hdr.size = static_cast<std::uint32_t>(len);  // mostly self-consistent frames
    const int nfds = ctl & 0x7;
    // Bit 6: eventfds (what kick/call/err must be), else the guest RAM memfd.
    for (int i = 0; i < nfds; ++i)
      m.fds.emplace_back((ctl & 0x40) != 0 ? ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK) : ::dup(w.ram.get()));
    (void)validate_request(m, ProtocolFeatures::from_raw(~std::uint64_t{0}));
    if (!chan.send(m).ok()) break;
    // Dispatch what arrived; drain replies so the socket never fills.
    for (int k = 0; k < 4; ++k) (void)w.loop->run_once(0);
    std::uint8_t sink[4096];
    while (::recv(chan.fd(), sink, sizeof sink, MSG_DONTWAIT) > 0) {
    }
    if (!(*server)->connected()) break;
  }
  server->reset();
  // Nothing may stay registered: the next input starts from a clean loop.
  for (int k = 0; k < 2; ++k) (void)w.loop->run_once(0);
  return 0;
}
