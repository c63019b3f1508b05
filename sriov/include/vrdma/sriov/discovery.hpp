// PF/VF discovery from sysfs: which PCI functions are SR-IOV PFs and VFs, which driver, IOMMU
// group and NUMA node each has, and which netdevs and RDMA devices (with link layer and
// transports) belong to each. Layout per Documentation/ABI/testing/sysfs-bus-pci and
// sysfs-class-infiniband; the root is configurable so tests run on a fixture tree.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "vrdma/common/result.hpp"
#include "vrdma/sriov/parse.hpp"

namespace vrdma::sriov {

// Where sysfs is mounted ("/sys" on a host; a fixture directory in tests), and how long to wait
// for the kernel (or the test's simulator) to make a write visible.
struct SysfsRoot {
  std::filesystem::path root = "/sys";
  std::chrono::milliseconds settle_timeout{5000};

  [[nodiscard]] std::filesystem::path pci_device(const PciAddress& a) const;  // bus/pci/devices/<bdf>
  [[nodiscard]] std::filesystem::path pci_driver(std::string_view name) const;  // bus/pci/drivers/<name>
};

struct RdmaPort {
  std::uint32_t port = 0;
  std::string link_layer;              // "Ethernet", "InfiniBand"
  std::vector<Transport> transports;   // from node_type and the GID types the port offers
  std::string state;                   // "4: ACTIVE" etc., as sysfs says
};

struct RdmaDevice {
  std::string name;  // ibdev, e.g. "qedr0", "mlx5_2", "irdma0"
  NodeType node_type = NodeType::unspecified;
  std::vector<RdmaPort> ports;
  [[nodiscard]] std::vector<Transport> transports() const;  // union over ports
};

enum class FunctionKind { pf, vf };

struct PciFunction {
  PciAddress addr;
  FunctionKind kind = FunctionKind::pf;
  std::uint16_t vendor = 0;
  std::uint16_t device = 0;
  std::string driver;           // bound driver ("" if none)
  std::string driver_override;  // "" if none
  std::optional<int> iommu_group;
  int numa_node = -1;
  std::vector<std::string> netdevs;
  std::vector<RdmaDevice> rdma;
  // PF only.
  std::uint32_t total_vfs = 0;
  std::uint32_t num_vfs = 0;
  std::vector<PciAddress> vfs;  // index = VF number (virtfnN)
  // VF only.
  std::optional<PciAddress> pf;
  std::optional<std::uint32_t> vf_index;

  [[nodiscard]] bool is_pf() const { return kind == FunctionKind::pf; }
  [[nodiscard]] std::string model() const;  // "QLogic FastLinQ 41000" ... or "15b3:1018"
  // The driver that gives this function its RDMA/netdev personality ("qede", "mlx5_core", "iavf").
  [[nodiscard]] std::string native_driver() const;
};

struct Inventory {
  std::vector<PciFunction> functions;  // sorted by address

  [[nodiscard]] const PciFunction* find(const PciAddress& a) const;
  [[nodiscard]] const PciFunction* find_by_netdev(std::string_view ifname) const;
  [[nodiscard]] std::vector<const PciFunction*> pfs() const;
  [[nodiscard]] std::vector<const PciFunction*> vfs_of(const PciAddress& pf) const;
};

// Reads the whole SR-IOV picture. Only a missing or unreadable bus/pci/devices directory is an
// error; a function whose attributes cannot be read is skipped with a warning in the log.
Result<Inventory> discover(const SysfsRoot& sysfs);

// Resolves an operator's "--pf" argument: a BDF or the name of one of the PF's netdevs.
Result<PciAddress> resolve_pf(const Inventory& inv, std::string_view pf_or_ifname);

}  // namespace vrdma::sriov
