// The verbs provider: the nicdrv API over rdma-core (libibverbs, librdmacm), for every RDMA NIC
// the kernel drives (mlx5, irdma, qedr, bnxt_re, rxe, siw, ...) and for an SR-IOV VF's RDMA
// function.
//
// Open it through the registry as "verbs:<name>[?options]", where <name> is
//   an RDMA device name          verbs:mlx5_0
//   a PCI function (VF or PF)    verbs:0000:3b:02.1  -> the ibdev under
//                                /sys/bus/pci/devices/<bdf>/infiniband/ (see ibdev_for_pci)
// Options:
//   sysfs_root=/path   where sysfs is mounted (default: $VRDMA_SYSFS_ROOT, else /sys); tests
//                      point it at a fixture tree
//
// What the hardware decides is reported, never faked: a capability the NIC lacks answers
// Errc::not_supported with the device's name. Specifically not supported on verbs:
//   MrOptions::requested_key and QpOptions::requested_qpn (the NIC picks keys and QPNs),
//   MrOptions::observer (the NIC writes by DMA; nobody sees the bytes),
//   QueuePair::export_state/import_state and Device::quiesce/resume (verbs NICs are migrated by
//   draining and re-creating their objects), and InfiniBand-link-layer addressing (AhAttr has no
//   LID yet; RoCE and iWARP work).
// And per device: atomics where atomic_cap is none, an RDMA READ into more SGEs than max_sge_rd,
// MrOptions::iova on siw (it drops the iova); on iWARP, UD QPs and address handles, immediate
// data, and RTR/RTS through QueuePair::modify (iWARP QPs reach RTS only through cm_resolve/
// cm_listen below). Where an iWARP device does not report QP state (siw), state() is what modify
// and the CM set, or ERR after an error completion or a fatal asynchronous event.
// WorkCompletion::sgid of a UD receive is read back from the first 40 bytes of its receive
// buffer, where the NIC put the GRH (grh_source below); the provider remembers each receive's
// first SGE for that.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "vrdma/common/result.hpp"
#include "vrdma/nicdrv/cm.hpp"
#include "vrdma/nicdrv/device.hpp"
#include "vrdma/nicdrv/registry.hpp"

namespace vrdma::nicdrv::verbs {

// Opens a verbs device (what the registry's "verbs:" prefix calls). No such device, or no RDMA
// stack on this host: Errc::no_device with a sentence saying which.
Result<std::shared_ptr<Device>> open(std::string_view spec, const DeviceOptions& opts);

// Every RDMA device libibverbs sees, as "verbs:<ibdev>" with its transport and link layer.
// Empty (never an error) on a host without RDMA devices or without the kernel RDMA stack.
std::vector<DeviceInfo> list();

// True if `s` has the form of a PCI address, DDDD:BB:DD.F (hex).
bool is_pci_address(std::string_view s) noexcept;

// The RDMA device of a PCI function: the one entry of <sysfs_root>/bus/pci/devices/<bdf>/infiniband/.
// not_found if the function does not exist or has no RDMA device (e.g. an iavf VF, or a VF whose
// driver is not bound), invalid_argument if `bdf` is not a PCI address.
Result<std::string> ibdev_for_pci(const std::filesystem::path& sysfs_root, std::string_view bdf);

// The sysfs root the provider uses when the device name does not say: $VRDMA_SYSFS_ROOT or /sys.
std::filesystem::path default_sysfs_root();

// The sender of a UD message from the 40 bytes a NIC puts before its payload: an IB GRH (IPv6
// version 6, SGID at byte 8), or for RoCE v2 over IPv4 an IPv4 header in the last 20 bytes
// (version 4 without options; when the first byte also says version 6, only a valid IPv4
// checksum makes it one, as in rdma-core's ibv_init_ah_from_wc), whose source becomes the
// IPv4-mapped GID. Anything else: nullopt. The bytes come from the network and are checked.
std::optional<Gid> grh_source(std::span<const std::uint8_t, 40> grh) noexcept;

// ---- Connection setup through librdmacm -----------------------------------------------------
// The provider-neutral connection API (cm.hpp) over librdmacm, synchronously: the QP is the
// caller's own verbs QP (created on the device that the CM says owns the route), moved through
// its states by the CM's attributes. RoCE peers that expect the IB CM and every iWARP peer
// (iWARP QPs only reach RTS through an MPA exchange on TCP) need it.
using CmParams = nicdrv::CmParams;
using CmConnection = nicdrv::CmConnection;
using CmListener = nicdrv::CmListener;

// Resolves the address and route to `dst_ip`:`port` (from `src_ip` if not empty).
Result<std::unique_ptr<CmConnection>> cm_resolve(std::string_view dst_ip, std::uint16_t port,
                                                 std::string_view src_ip = {}, const CmParams& params = {});
// Listens on `ip`:`port` (port 0: any; see CmListener::port()).
Result<std::unique_ptr<CmListener>> cm_listen(std::string_view ip, std::uint16_t port, int backlog = 16);

}  // namespace vrdma::nicdrv::verbs
