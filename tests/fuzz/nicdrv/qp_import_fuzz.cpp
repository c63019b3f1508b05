// libFuzzer target: QP state blobs arrive from the migration source over the network, so
// import_state() must reject anything malformed with an error and never crash or hang.
// Inputs whose first byte is odd get a valid blob header (magic, version, QPN, type) so the
// fuzzer spends its time past the first checks. The same bytes go to an SRQ's import_state()
// (the receives an SRQ held), with an SRQ header when the second bit is set.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "vrdma/nicdrv/registry.hpp"

using namespace vrdma::nicdrv;

namespace {

struct Env {
  std::shared_ptr<Device> dev;
  std::shared_ptr<ProtectionDomain> pd;
  std::shared_ptr<CompletionQueue> cq;
  Env() {
    auto d = open_device("soft:127.0.0.1?port=" + std::to_string(30000 + getpid() % 20000));
    if (!d) std::abort();
    dev = *d;
    pd = *dev->alloc_pd();
    cq = *dev->create_cq(256);
    // Quiesced: an accepted blob must not make the engine transmit to whatever address it names.
    if (!dev->quiesce()) std::abort();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Env env;
  constexpr std::uint32_t kQpn = 0x77;
  std::vector<std::uint8_t> blob(data, data + size);
  if (size > 0 && (data[0] & 1) != 0 && size >= 14) {
    std::uint32_t hdr[3] = {0x56514d31, 1, kQpn};
    std::memcpy(blob.data(), hdr, sizeof hdr);
    blob[12] = static_cast<std::uint8_t>(QpType::rc);
    blob[13] %= 7;  // a valid state
  }
  QpInitAttr ia;
  ia.send_cq = env.cq.get();
  ia.recv_cq = env.cq.get();
  ia.cap.max_send_wr = 16;
  ia.cap.max_recv_wr = 16;
  ia.cap.max_send_sge = 4;
  ia.cap.max_recv_sge = 4;
  ia.cap.max_inline_data = 64;
  QpOptions o;
  o.requested_qpn = kQpn;
  auto qp = env.pd->create_qp(ia, o);
  if (!qp) return 0;
  auto st = (*qp)->import_state(blob);
  if (st) {
    // An accepted blob must leave a QP that can be exported and moved to ERR cleanly.
    auto again = (*qp)->export_state();
    if (!again) std::abort();
    QpAttr a;
    a.qp_state = QpState::err;
    (void)(*qp)->modify(a, QpAttrMask::state);
  }
  std::vector<std::uint8_t> sblob(data, data + size);
  if (size >= 20 && (data[0] & 2) != 0) {
    const std::uint32_t hdr[4] = {0x56534d31, 1, 16, 2};  // "VSM1", version, max_wr, max_sge
    std::memcpy(sblob.data(), hdr, sizeof hdr);
  }
  auto srq = env.pd->create_srq(16, 2);
  if (!srq) return 0;
  if ((*srq)->import_state(sblob)) {
    // An accepted blob round-trips: exported again, it has every receive it was given.
    auto again = (*srq)->export_state();
    if (!again || again->size() != sblob.size()) std::abort();
  }
  return 0;
}
