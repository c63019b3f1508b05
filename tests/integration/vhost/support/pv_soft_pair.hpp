// What the vrdmad tests with libpvverbs share: opening a device, a plain soft engine in a test
// network namespace, a pv device on a vrdmad with such a peer (and its move to a new vrdmad),
// posting a receive and waiting for one completion.
#pragma once
#include <signal.h>

#include <chrono>
#include <memory>
#include <string>

#include <boost/test/unit_test.hpp>

#include "check.hpp"
#include "netns.hpp"
#include "rdma_pair.hpp"
#include "vrdmad_proc.hpp"
#include "vrdma/guest/pv.hpp"
#include "vrdma/nicdrv/registry.hpp"

namespace vrdma::test {

inline std::shared_ptr<nicdrv::Device> open_dev(const std::string& name) {
  auto d = nicdrv::open_device(name);
  BOOST_REQUIRE_MESSAGE(d.ok(), "open " + name + ": " + (d ? std::string() : d.error().message));
  return *d;
}

// A plain soft engine of this process on host `ns` (its socket lives in that namespace).
inline std::shared_ptr<nicdrv::Device> soft_engine_in(const std::string& ns, const std::string& ip) {
  std::shared_ptr<nicdrv::Device> soft;
  BOOST_REQUIRE(run_in_netns(ns, [&] {
    auto d = nicdrv::open_device("soft:" + ip);
    if (d) soft = *d;
  }));
  BOOST_REQUIRE_MESSAGE(soft, "cannot open soft:" + ip + " in " + ns);
  return soft;
}

// A pv device on a vrdmad (soft engine) on host a, a plain soft engine of this process on host b.
struct PvAndSoft {
  NetnsPair net;
  TempDir dir;
  std::unique_ptr<Vrdmad> backend;
  std::shared_ptr<nicdrv::Device> dev, soft;
  // `options`: the pv device's (docs/virtio-rdma.md "libpvverbs").
  PvAndSoft(const char* prefix, int subnet, const std::string& options = "ram_mib=64") : net{prefix, subnet} {
    BOOST_REQUIRE_MESSAGE(net.ok(), "cannot create network namespaces (needs root)");
    backend = std::make_unique<Vrdmad>(dir, "a", net.ns_a(), "soft:" + net.ip_a());
    dev = open_dev(backend->device() + "?" + options);
    soft = soft_engine_in(net.ns_b(), net.ip_b());
  }
  // The device moves to a new vrdmad on the same host address: its state taken from the old
  // one, which is then SIGKILLed, and given to the new one (`name`). Returns the state's size.
  std::size_t move_to_new_vrdmad(const std::string& name) {
    auto state = pv::suspend(*dev);
    VRDMA_REQUIRE_OK(state);
    backend->child->stop(SIGKILL);
    auto fresh = std::make_unique<Vrdmad>(dir, name, net.ns_a(), "soft:" + net.ip_a());
    VRDMA_REQUIRE_OK(pv::resume_on(*dev, fresh->sock, *state));
    backend = std::move(fresh);
    return state->size();
  }
};

inline void post_recv(Endpoint& e, std::size_t off, std::size_t len, std::uint64_t id) {
  nicdrv::Sge s{reinterpret_cast<std::uint64_t>(e.buf.data() + off), static_cast<std::uint32_t>(len), e.mr->lkey()};
  nicdrv::RecvWr r{id, std::span<const nicdrv::Sge>(&s, 1)};
  VRDMA_REQUIRE_OK(e.qp->post_recv(std::span(&r, 1)));
}

inline nicdrv::WorkCompletion one(Endpoint& e, const char* what) {
  auto wcs = wait_cq(*e.cq, 1, std::chrono::seconds(30));
  BOOST_REQUIRE_MESSAGE(wcs.size() == 1, std::string("no completion for ") + what);
  return wcs[0];
}
}  // namespace vrdma::test
