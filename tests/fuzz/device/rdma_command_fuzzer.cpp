// Fuzzes the virtio RDMA device's untrusted inputs: control commands (the command decoder and
// every command handler) and doorbell records (work-request rings, arming), against a real
// RdmaDevice on a real soft engine (loopback), through real virtqueues in real guest memory.
// Input: records of [u8 tag][u16 length][length bytes]; an even tag is a control request, an
// odd tag a chain of doorbell records, tag 0xff a device state to load into a reset device
// (the migration blob, untrusted too), tag 0xf9 an object layout to build ahead (PRESTATE,
// untrusted too; a later 0xff state may adopt its objects) and tag 0xfd a save of the current
// layout and state (rings stopped) built and loaded back into a reset device. AddressSanitizer catches any access outside the guest
// memory; the device is reset after every input so state stays bounded.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "vrdma/common/log.hpp"
#include "vrdma/migration/device_state.hpp"
#include "vrdma/nicdrv/registry.hpp"
#include "vrdma/vhost/device.hpp"
#include "vrdma/vhost/driver_queue.hpp"
#include "vrdma/vhost/guest_ram.hpp"
#include "vrdma/device/rdma_device.hpp"
#include "vrdma/virtio_rdma.hpp"

using namespace vrdma;
using namespace vrdma::vhost;
using namespace vrdma::device;
namespace vd = vrdma::vrdma_dev;

namespace {

// Where a "state area" record puts its bytes: the chain the driver kept posted on the state
// queue, as a destination finds it (migration::DeviceState::load_state_from_guest).
constexpr std::uint64_t kStateAreaGpa = 0x180000;
constexpr std::uint32_t kStateAreaLen = 64u << 10;

struct Host final : DeviceHost {
  GuestView view;
  bool have_area = false;
  GuestView memory() const override { return view; }
  void run_queue(std::uint16_t) override {}
  bool queue_running(std::uint16_t) const override { return true; }
  Result<DescChain> last_avail_chain(std::uint16_t) const override {
    if (!have_area) return make_error(Errc::not_found, "no state area posted");
    DescChain c;
    c.bufs.push_back({kStateAreaGpa, kStateAreaLen, true});
    c.writable = kStateAreaLen;
    return c;
  }
};

struct World {
  GuestRam ram;
  Host host;
  std::unique_ptr<EventLoop> loop;
  std::shared_ptr<nicdrv::Device> engine;
  std::unique_ptr<RdmaDevice> dev;
  std::unique_ptr<migration::DeviceState> state;  // the state loader and the state area (destroyed first)
  std::unique_ptr<DriverQueue> ctl, db;
  std::unique_ptr<Ring> ctl_ring, db_ring;
  std::uint64_t req = 0, rsp = 0;

  static World* make() {
    // Guest RAM as in the pv transport: a low region and a big one at 1 MiB. The fuzzer's
    // addresses hit both, the hole between them and beyond.
    auto ram = GuestRam::create({{0, 640u << 10, 0}, {1u << 20, 16u << 20, 1u << 20}});
    if (!ram) return nullptr;
    auto loop = EventLoop::create();
    auto engine = nicdrv::open_device("soft:127.0.0.1?port=47987");
    if (!loop || !engine) return nullptr;
    auto* w = new World{std::move(*ram), {}, std::make_unique<EventLoop>(std::move(*loop)), *engine, nullptr, nullptr,
                        nullptr, nullptr, nullptr, nullptr, 0, 0};
    std::vector<GuestMemory::RegionPtr> regions;
    for (const auto& r : w->ram.table()) regions.push_back(MappedRegion::wrap(r, w->ram.host(r.guest_phys_addr, 1)));
    auto mem = GuestMemory::build(std::move(regions));
    if (!mem) return nullptr;
    w->host.view = GuestView(*mem, nullptr);
    w->dev = std::make_unique<RdmaDevice>(w->engine, *w->loop);
    w->state = std::make_unique<migration::DeviceState>(*w->dev);
    w->dev->attach(&w->host);
    auto c = DriverQueue::create(w->ram, 64, false, false);
    auto d = DriverQueue::create(w->ram, 64, false, false);
    if (!c || !d) return nullptr;
    w->ctl = std::make_unique<DriverQueue>(std::move(*c));
    w->db = std::make_unique<DriverQueue>(std::move(*d));
    for (auto [q, ring] : {std::pair{w->ctl.get(), &w->ctl_ring}, std::pair{w->db.get(), &w->db_ring}}) {
      RingSetup s;
      s.size = q->size();
      s.desc = q->desc_gpa();
      s.driver = q->driver_gpa();
      s.device = q->device_gpa();
      auto r = make_ring(s, 0, w->host.view, InflightRegion{});
      if (!r) return nullptr;
      *ring = std::move(*r);
    }
    // Fixed addresses the seed corpus relies on: requests at 1 MiB (a send ring placed there
    // is filled by the next "request"), responses 4 KiB above; the rings sit in low memory.
    if (w->ctl->desc_gpa() >= (640u << 10) || w->db->desc_gpa() >= (640u << 10)) return nullptr;
    w->req = 0x100000;
    w->rsp = 0x101000;
    return w;
  }

  void send(std::uint16_t index, DriverQueue& q, Ring& ring, const std::uint8_t* p, std::size_t n) {
    std::memcpy(ram.host(req, n), p, n);
    std::vector<DriverBuf> bufs{{req, static_cast<std::uint32_t>(std::max<std::size_t>(n, 1)), false}};
    if (index == vd::kControlQueue) bufs.push_back({rsp, 512, true});
    if (!q.add(bufs).ok()) return;
    q.publish();
    Queue dq(index, ring, host.view);
    dev->queue_ready(dq);
    while (q.get_used()) {
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static World* w = [] {
    log::set_level(std::getenv("VRDMA_FUZZ_STATS") != nullptr ? log::Level::debug : log::Level::error);
    return World::make();
  }();
  if (w == nullptr) return 0;
  for (int records = 0; records < 64 && size >= 3; ++records) {
    const std::uint8_t tag = data[0];
    std::size_t len = static_cast<std::size_t>(data[1]) | (static_cast<std::size_t>(data[2]) << 8);
    data += 3;
    size -= 3;
    len = std::min({len, size, std::size_t{2048}});
    if (tag == 0xff) {
      w->dev->reset();
      (void)w->state->load_state(std::span(data, len));
    } else if (tag == 0xfb) {
      // A state area in guest memory (header + state), as a destination reads it.
      w->dev->reset();
      std::memset(w->ram.host(kStateAreaGpa, kStateAreaLen), 0, kStateAreaLen);
      std::memcpy(w->ram.host(kStateAreaGpa, len), data, len);
      w->host.have_area = true;
      (void)w->state->load_state_from_guest();
      w->host.have_area = false;
    } else if (tag == 0xf9) {
      // An object layout from a source (PRESTATE): built ahead; a later 0xff state may adopt it.
      w->dev->reset();
      (void)w->state->precreate(std::span(data, len));
    } else if (tag == 0xfd) {
      // Save and load, as a migration does: the layout first (built ahead), then the state.
      const auto layout = w->state->save_layout();
      w->dev->queue_stopped(vd::kControlQueue);
      auto blob = w->state->save_state();
      if (const char* dump = std::getenv("VRDMA_FUZZ_DUMP_STATE"); dump != nullptr && blob) {  // to make seeds
        if (FILE* f = std::fopen(dump, "wbx")) {  // the first save only
          std::fwrite(blob->data(), 1, blob->size(), f);
          std::fclose(f);
        }
      }
      if (const char* dump = std::getenv("VRDMA_FUZZ_DUMP_LAYOUT"); dump != nullptr && blob) {
        if (FILE* f = std::fopen(dump, "wbx")) {
          std::fwrite(layout.data(), 1, layout.size(), f);
          std::fclose(f);
        }
      }
      w->dev->reset();
      (void)w->state->precreate(layout);
      if (blob) (void)w->state->load_state(*blob);
      w->state->drop_precreated();
    } else if (tag % 2 == 0)
      w->send(vd::kControlQueue, *w->ctl, *w->ctl_ring, data, len);
    else if (len >= sizeof(vd::Doorbell))
      w->send(vd::kDoorbellQueue, *w->db, *w->db_ring, data, len / sizeof(vd::Doorbell) * sizeof(vd::Doorbell));
    data += len;
    size -= len;
    (void)w->loop->run_once(0);  // engine completions into the guest's CQ rings
  }
  if (std::getenv("VRDMA_FUZZ_STATS") != nullptr) {  // to see what a corpus file reaches
    const auto s = w->dev->stats();
    std::fprintf(stderr, "commands %lu (%lu refused), doorbells %lu (%lu ignored), send WQEs %lu, WQE errors %lu, "
                 "objects pd %u mr %u cq %u qp %u ah %u srq %u\n", s.commands, s.command_errors, s.doorbells,
                 s.doorbell_errors, s.send_wqes, s.wqe_errors, s.pds, s.mrs, s.cqs, s.qps, s.ahs, s.srqs);
  }
  w->dev->reset();
  return 0;
}
