// TEST FIXTURE, NOT PRODUCTION CODE: a simulated SR-IOV sysfs tree.
//
// The real SR-IOV sysfs cannot exist on a test machine without the NICs, so this builds a
// directory tree with the layout of real hosts (Documentation/ABI/testing/sysfs-bus-pci,
// sysfs-class-infiniband, sysfs-class-net):
//   devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/{vendor,device,numa_node,sriov_*,virtfnN,driver,...}
//   bus/pci/devices/<bdf> -> ../../../devices/...,  bus/pci/drivers/<drv>/{bind,unbind,<bdf>}
//   kernel/iommu_groups/<n>/devices/<bdf>, class/net/<if>, class/infiniband/<ibdev>/ports/1/...
// and a small simulator thread (inotify) that plays the kernel's part when the code under test
// writes sriov_numvfs (VFs appear/disappear, autoprobe binds them), driver unbind/bind files and
// drivers_probe (honouring driver_override). Everything lives in a temporary directory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace vrdma::sriov::test {

enum class SimRdma { none, roce, roce_v2_only, iwarp };

struct SimPfSpec {
  std::string bdf;             // "0000:3b:00.0"
  std::string root_port;       // "0000:3a:00.0": parent bridge, under pci0000:3a
  std::uint16_t vendor = 0, device = 0, vf_device = 0;
  std::string driver, vf_driver;
  std::uint32_t total_vfs = 8;
  std::uint32_t vf_offset = 2, vf_stride = 1;  // VF routing id = PF's + offset + i*stride
  int numa_node = 0;
  int iommu_group = 0;
  std::string ifname;          // PF netdev
  std::string ibdev;           // PF RDMA device ("" = none)
  SimRdma rdma = SimRdma::roce;
  std::string vf_ibdev_prefix; // "" = VFs have no RDMA function (E810 iavf)
};

class SriovSysfsSimulator {
 public:
  // Builds an empty tree (bus/pci, class/net, class/infiniband); start() runs the reactor.
  SriovSysfsSimulator();
  ~SriovSysfsSimulator();
  SriovSysfsSimulator(const SriovSysfsSimulator&) = delete;
  SriovSysfsSimulator& operator=(const SriovSysfsSimulator&) = delete;

  [[nodiscard]] const std::filesystem::path& root() const { return root_; }

  // A FastLinQ QL41000 (two ports: .0 RoCE v1/v2, .1 iWARP), an Intel E810 (irdma RoCE v2 on the
  // PF, iavf VFs without RDMA) and a ConnectX-5 (mlx5 RoCE on PF and VFs).
  void add_standard_nics();
  void add_pf(const SimPfSpec& spec);
  void load_driver(const std::string& name);    // creates bus/pci/drivers/<name>
  void unload_driver(const std::string& name);  // unbinds its devices and removes the directory
  void remove_iommu_group(const std::string& bdf);

  void start();  // starts the inotify reactor thread
  void stop();

  // Counters so tests can see the simulator did react.
  [[nodiscard]] int writes_seen() const;

 private:
  struct Fn {
    std::string bdf;
    std::filesystem::path dir;
    std::uint16_t vendor = 0, device = 0;
    std::string native_driver;
    bool is_vf = false;
    std::string pf;  // VF: its PF
    std::uint32_t vf_index = 0;
    std::string ifname, ibdev;
    SimRdma rdma = SimRdma::none;
    int iommu_group = -1;
  };

  void run();
  void on_write(const std::filesystem::path& dir, const std::string& file);
  void make_function(Fn& fn, int numa);
  void set_numvfs(const std::string& pf_bdf, std::uint32_t n);
  void bind(const std::string& bdf, const std::string& driver);
  void unbind(const std::string& bdf);
  void probe(const std::string& bdf);
  void add_personality(Fn& fn);
  void remove_personality(Fn& fn);
  void watch(const std::filesystem::path& dir);
  std::string vf_bdf(const SimPfSpec& pf, std::uint32_t i) const;

  std::filesystem::path tmp_, root_;
  std::map<std::string, Fn> fns_;
  std::map<std::string, SimPfSpec> pfs_;
  std::map<std::string, int> ib_counters_;
  int next_group_ = 100;
  int inotify_fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  std::map<int, std::filesystem::path> watches_;
  mutable std::mutex mu_;
  std::thread thread_;
  int writes_ = 0;
};

// Writes `value` + "\n" to a file (as `echo value > path`).
void write_file(const std::filesystem::path& p, const std::string& value);

}  // namespace vrdma::sriov::test
