// libpvverbs: the driver side of the virtio RDMA device (docs/virtio-rdma.md), exposed as the
// `pv` provider of the nicdrv API ("pv:<vhost-user socket>[?ram_mib=N]", or inside a VM
// "pv:pci:<address|auto>[?ram_mib=N]"), so everything written
// against nicdrv (vrdma-perf, the provider conformance suite) runs over it unchanged.
//
// Transport: how the driver reaches the device is behind PvTransport. Here the driver is itself
// the vhost-user frontend (memfd guest RAM, eventfds), as DPDK's virtio-user is for containers;
// inside a VM, connect_pci() drives the virtio-pci function from user space.
//
// Memory: the device can only reach the transport's DMA memory, so buffers to register must
// come from Device::alloc_buffer(); reg_mr() of any other address fails with a sentence.
//
// Threads: every object may be used from any thread. Control commands serialise on the device;
// posting serialises per QP and on the shared doorbell queue; one event thread per device turns
// CQ events into each CQ's event fd.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "vrdma/common/result.hpp"
#include "vrdma/nicdrv/device.hpp"
#include "vrdma/nicdrv/registry.hpp"
#include "vrdma/vhost/driver_queue.hpp"

namespace vrdma::pv {

// A buffer the device sees: host pointer and guest-physical address.
struct DmaArea {
  std::uint8_t* host = nullptr;
  std::uint64_t gpa = 0;
  std::size_t len = 0;
};

// One buffer of a chain posted to a device queue (guest-physical address, length, writable).
using ChainBuf = vhost::DriverBuf;

// What the driver needs from the bus (vhost-user frontend here, virtio-pci in a VM).
class PvTransport {
 public:
  virtual ~PvTransport() = default;
  // Device config space (virtio_rdma.hpp Config).
  virtual Result<std::vector<std::uint8_t>> read_config(std::uint32_t offset, std::uint32_t len) = 0;
  // DMA memory: page-aligned, zeroed, freed by free_dma.
  virtual Result<DmaArea> alloc_dma(std::size_t len) = 0;
  virtual void free_dma(const DmaArea& a) = 0;
  // The DMA memory's whole size (free and in use).
  [[nodiscard]] virtual std::uint64_t dma_bytes() const = 0;
  // Host pointer -> guest-physical address, when [p, p+len) is DMA memory in one piece.
  virtual std::optional<std::uint64_t> gpa_of(const void* p, std::size_t len) const = 0;
  // Virtqueue operations; one caller at a time per queue.
  virtual Result<std::uint16_t> add(std::uint16_t queue, std::span<const ChainBuf> bufs) = 0;
  virtual Status publish_and_kick(std::uint16_t queue) = 0;
  // A notification of the queue whatever its ring says (a doorbell ring's records are not on it).
  virtual Status notify(std::uint16_t queue) = 0;
  virtual std::optional<std::pair<std::uint16_t, std::uint32_t>> get_used(std::uint16_t queue) = 0;
  [[nodiscard]] virtual std::uint16_t free_slots(std::uint16_t queue) const = 0;
  // Whether the device should notify (interrupt) when it returns the queue's buffers
  // (DriverQueue::set_interrupts); on by default.
  virtual void set_interrupts(std::uint16_t queue, bool on) = 0;
  // The queue's interrupt (call) eventfd, to poll on.
  [[nodiscard]] virtual int call_fd(std::uint16_t queue) const = 0;
  // Queues set up: the virtio RDMA device's required ones, and the state queue when the device
  // (or the frontend carrying it) has one.
  [[nodiscard]] virtual std::uint16_t num_queues() const = 0;

  // Moving to another backend under a running application (a container changing hosts, tests
  // of the device's migration): stop every ring and take the device state from the backend...
  virtual Result<std::vector<std::uint8_t>> suspend() {
    return make_error(Errc::not_supported, "this transport cannot move between backends");
  }
  // ...then connect to another backend, give it the same memory and that state, and restart
  // the rings where they stopped. The old backend is let go.
  virtual Status resume_on(const std::string& /*socket*/, std::span<const std::uint8_t> /*state*/) {
    return make_error(Errc::not_supported, "this transport cannot move between backends");
  }

  // Migration the backends carry out themselves (migration/: the old vrdmad streams the device
  // state to the new one when the rings stop), the way QEMU drives a vhost-user device: stop
  // every ring and keep the connection... With `logged`, dirty logging goes on first (LOG_SHMFD,
  // SET_LOG_BASE, LOG_ALL), as a VMM does for a live migration: the backend then writes its
  // state into the guest's state area when the rings stop, and the new backend needs nothing
  // from the old one (docs/virtio-rdma.md "State in guest memory").
  // Before the stop, optionally: connect to the backend at `socket` and give it the features
  // and the memory, the way a destination VMM's backend is connected long before the switchover;
  // start_on(socket) then only starts the rings. A backend that cannot take the device fails
  // here, before anything stopped.
  virtual Status prepare_on(const std::string& /*socket*/) { return {}; }
  virtual Status stop_rings(bool /*logged*/ = false) {
    return make_error(Errc::not_supported, "this transport cannot move between backends");
  }
  // ...start the rings where they stopped on the backend at `socket`, keeping the old
  // connection until commit_switch()...
  virtual Status start_on(const std::string& /*socket*/) {
    return make_error(Errc::not_supported, "this transport cannot move between backends");
  }
  virtual void commit_switch() {}
  // ...or let the new backend go and start the rings on the old one again.
  virtual Status restart_here() { return make_error(Errc::not_supported, "this transport cannot move between backends"); }
};

// The vhost-user transport: connects to vrdmad at `socket` with `ram_mib` MiB of memfd RAM.
Result<std::unique_ptr<PvTransport>> connect_vhost_user(const std::string& socket, std::uint64_t ram_mib,
                                                        int timeout_ms = 5000);

// The virtio-pci transport, inside a VM (docs/virtio-rdma.md "Inside a VM"): drives the PCI
// function at `pci_address` ("0000:00:04.0", or "auto": the first virtio function bound to
// uio_pci_generic) from user space: BARs mapped through sysfs, the modern virtio-pci interface,
// INTx through /dev/uioN, and `ram_mib` MiB of DMA memory from 2 MiB hugepages whose
// guest-physical addresses come from /proc/self/pagemap. Needs root, the function bound to
// uio_pci_generic (pvverbs-bind does it) and free hugepages (vm.nr_hugepages).
Result<std::unique_ptr<PvTransport>> connect_pci(const std::string& pci_address, std::uint64_t ram_mib);

// Opens a pv device over a transport (the nicdrv provider does this for "pv:<socket>").
Result<std::shared_ptr<nicdrv::Device>> open(std::unique_ptr<PvTransport> t, std::string name);
Result<std::shared_ptr<nicdrv::Device>> open(std::string_view spec, const nicdrv::DeviceOptions& o);

// Moves a pv device to another vrdmad (see PvTransport::suspend/resume_on). Between the two
// calls the application may keep posting (the work waits in its rings) but must not create or
// modify objects. Every posted work request completes exactly once, on whichever side.
Result<std::vector<std::uint8_t>> suspend(nicdrv::Device& dev);
Status resume_on(nicdrv::Device& dev, const std::string& socket, std::span<const std::uint8_t> state);

// The PD's DMA memory region (REG_DMA_MR; a kernel driver's local_dma_lkey): its lkey covers
// all guest memory, addressed by guest-physical address (gpa_of()), local access only (`access`
// is none or local_write). One per PD; released with the returned object.
Result<std::shared_ptr<nicdrv::MemoryRegion>> reg_dma_mr(nicdrv::ProtectionDomain& pd, nicdrv::Access access);
// The guest-physical address of [p, p+len) in a pv device's DMA memory (its buffers).
std::optional<std::uint64_t> gpa_of(nicdrv::Device& dev, const void* p, std::size_t len);

// How the device state reaches the new backend in migrate().
enum class StateVia {
  backends,      // the old vrdmad streams it to the new one: it must have been told where
                 // ({"cmd":"migrate","to":...} on its control socket; the new one runs with --incoming tcp:...)
  guest_memory,  // dirty logging goes on before the rings stop, so the old vrdmad writes the state
                 // into the guest's state area, where the new one (--incoming guest) reads it
};

// Moves a pv device to the vrdmad at `socket` the way a VM migrates. Every ring stops here (the
// state goes), the rings start there, and once the new backend answers a control command within
// `probe` the old connection is let go. If the new backend cannot be reached or does not answer
// (it refused the state, say), the rings start here again and the device carries on where it
// was, nothing lost. The application may keep posting throughout.
Status migrate(nicdrv::Device& dev, const std::string& socket, std::chrono::milliseconds probe = std::chrono::seconds(10),
               StateVia via = StateVia::backends);

}  // namespace vrdma::pv
