// TEST FIXTURE: see sriov_sysfs_simulator.hpp. Plays the kernel's part on a directory tree.
#include "sriov_sysfs_simulator.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace vrdma::sriov::test {
namespace fs = std::filesystem;

void write_file(const fs::path& p, const std::string& value) {
  std::ofstream f(p, std::ios::trunc);
  f << value << '\n';
  if (!f) throw std::runtime_error("simulator: cannot write " + p.string());
}

namespace {

std::string read_trimmed(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

void rel_link(const fs::path& target, const fs::path& link) {
  std::error_code ec;
  fs::remove(link, ec);
  fs::create_directory_symlink(fs::relative(target, link.parent_path()), link);
}

unsigned rid_of(const std::string& bdf) {
  unsigned dom = 0, bus = 0, dev = 0, fn = 0;
  if (std::sscanf(bdf.c_str(), "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4)
    throw std::runtime_error("simulator: bad bdf " + bdf);
  return (bus << 8) | (dev << 3) | fn;
}

}  // namespace

SriovSysfsSimulator::SriovSysfsSimulator() {
  std::string tmpl = (fs::temp_directory_path() / "vrdma-sysfs-sim-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("simulator: mkdtemp failed");
  tmp_ = tmpl;
  root_ = tmp_ / "sys";
  for (const char* d : {"bus/pci/devices", "bus/pci/drivers", "class/net", "class/infiniband", "kernel/iommu_groups",
                        "devices"})
    fs::create_directories(root_ / d);
  write_file(root_ / "bus/pci/drivers_probe", "");
  write_file(root_ / "bus/pci/drivers_autoprobe", "1");
  if (pipe(stop_pipe_) != 0) throw std::runtime_error("simulator: pipe failed");
  inotify_fd_ = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (inotify_fd_ < 0) throw std::runtime_error("simulator: inotify_init1 failed");
  watch(root_ / "bus/pci");
}

SriovSysfsSimulator::~SriovSysfsSimulator() {
  stop();
  ::close(inotify_fd_);
  ::close(stop_pipe_[0]);
  ::close(stop_pipe_[1]);
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

void SriovSysfsSimulator::watch(const fs::path& dir) {
  int wd = inotify_add_watch(inotify_fd_, dir.c_str(), IN_CLOSE_WRITE);
  if (wd < 0) throw std::runtime_error("simulator: cannot watch " + dir.string());
  watches_[wd] = dir;
}

int SriovSysfsSimulator::writes_seen() const {
  std::lock_guard<std::mutex> g(mu_);
  return writes_;
}

void SriovSysfsSimulator::load_driver(const std::string& name) {
  std::lock_guard<std::mutex> g(mu_);
  fs::path d = root_ / "bus/pci/drivers" / name;
  if (fs::exists(d)) return;
  fs::create_directories(d);
  for (const char* f : {"bind", "unbind", "new_id", "remove_id", "uevent"}) write_file(d / f, "");
  watch(d);
}

void SriovSysfsSimulator::unload_driver(const std::string& name) {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [bdf, fn] : fns_)
    if (fs::is_symlink(fn.dir / "driver") && fs::read_symlink(fn.dir / "driver").filename() == name) unbind(bdf);
  fs::remove_all(root_ / "bus/pci/drivers" / name);
}

void SriovSysfsSimulator::remove_iommu_group(const std::string& bdf) {
  std::lock_guard<std::mutex> g(mu_);
  fs::remove(fns_.at(bdf).dir / "iommu_group");
}

std::string SriovSysfsSimulator::vf_bdf(const SimPfSpec& pf, std::uint32_t i) const {
  unsigned dom = 0;
  std::sscanf(pf.bdf.c_str(), "%x:", &dom);
  unsigned rid = rid_of(pf.bdf) + pf.vf_offset + i * pf.vf_stride;
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", dom, (rid >> 8) & 0xff, (rid >> 3) & 0x1f, rid & 7);
}

void SriovSysfsSimulator::make_function(Fn& fn, int numa) {
  fs::create_directories(fn.dir);
  write_file(fn.dir / "vendor", fmt::format("0x{:04x}", fn.vendor));
  write_file(fn.dir / "device", fmt::format("0x{:04x}", fn.device));
  write_file(fn.dir / "class", "0x020000");
  write_file(fn.dir / "numa_node", std::to_string(numa));
  write_file(fn.dir / "driver_override", "(null)");
  rel_link(fn.dir, root_ / "bus/pci/devices" / fn.bdf);
  fs::path g = root_ / "kernel/iommu_groups" / std::to_string(fn.iommu_group);
  fs::create_directories(g / "devices");
  rel_link(fn.dir, g / "devices" / fn.bdf);
  rel_link(g, fn.dir / "iommu_group");
}

void SriovSysfsSimulator::add_pf(const SimPfSpec& s) {
  std::lock_guard<std::mutex> g(mu_);
  Fn fn;
  fn.bdf = s.bdf;
  fn.dir = root_ / "devices" / fmt::format("pci{}", s.root_port.substr(0, 7)) / s.root_port / s.bdf;
  fn.vendor = s.vendor;
  fn.device = s.device;
  fn.native_driver = s.driver;
  fn.ifname = s.ifname;
  fn.ibdev = s.ibdev;
  fn.rdma = s.ibdev.empty() ? SimRdma::none : s.rdma;
  fn.iommu_group = s.iommu_group;
  make_function(fn, s.numa_node);
  write_file(fn.dir / "sriov_totalvfs", std::to_string(s.total_vfs));
  write_file(fn.dir / "sriov_numvfs", "0");
  write_file(fn.dir / "sriov_offset", std::to_string(s.vf_offset));
  write_file(fn.dir / "sriov_stride", std::to_string(s.vf_stride));
  write_file(fn.dir / "sriov_vf_device", fmt::format("{:04x}", s.vf_device));
  write_file(fn.dir / "sriov_drivers_autoprobe", "1");
  pfs_[s.bdf] = s;
  fns_[s.bdf] = fn;
  watch(fn.dir);
  for (const auto& d : {s.driver, s.vf_driver}) {
    fs::path dd = root_ / "bus/pci/drivers" / d;
    if (!fs::exists(dd)) {
      fs::create_directories(dd);
      for (const char* f : {"bind", "unbind", "new_id", "remove_id", "uevent"}) write_file(dd / f, "");
      watch(dd);
    }
  }
  bind(s.bdf, s.driver);
}

void SriovSysfsSimulator::add_personality(Fn& fn) {
  if (!fn.ifname.empty()) {
    fs::path n = fn.dir / "net" / fn.ifname;
    fs::create_directories(n);
    unsigned rid = rid_of(fn.bdf);
    write_file(n / "address", fmt::format("02:5e:{:02x}:{:02x}:{:02x}:00", (rid >> 8) & 0xff, rid & 0xff,
                                          fn.vf_index & 0xff));
    write_file(n / "operstate", "up");
    write_file(n / "ifindex", std::to_string(10 + rid % 1000));
    rel_link(fn.dir, n / "device");
    rel_link(n, root_ / "class/net" / fn.ifname);
  }
  if (!fn.ibdev.empty() && fn.rdma != SimRdma::none) {
    fs::path ib = fn.dir / "infiniband" / fn.ibdev;
    fs::create_directories(ib / "ports/1/gids");
    fs::create_directories(ib / "ports/1/gid_attrs/types");
    fs::create_directories(ib / "ports/1/gid_attrs/ndevs");
    write_file(ib / "node_type", fn.rdma == SimRdma::iwarp ? "4: RNIC" : "1: CA");
    write_file(ib / "ports/1/link_layer", "Ethernet");
    write_file(ib / "ports/1/state", "4: ACTIVE");
    write_file(ib / "ports/1/phys_state", "5: LinkUp");
    write_file(ib / "ports/1/gids/0", "fe80:0000:0000:0000:005e:00ff:fe00:0001");
    write_file(ib / "ports/1/gids/1", "fe80:0000:0000:0000:005e:00ff:fe00:0001");
    if (fn.rdma == SimRdma::roce_v2_only) {
      // irdma on E810 offers RoCE v2 only.
      write_file(ib / "ports/1/gid_attrs/types/0", "RoCE v2");
      write_file(ib / "ports/1/gid_attrs/ndevs/0", fn.ifname);
    } else if (fn.rdma == SimRdma::roce) {
      // RoCE devices list one GID per type and address (IB/RoCE v1 and RoCE v2 pairs).
      write_file(ib / "ports/1/gid_attrs/types/0", "IB/RoCE v1");
      write_file(ib / "ports/1/gid_attrs/types/1", "RoCE v2");
      write_file(ib / "ports/1/gid_attrs/ndevs/0", fn.ifname);
      write_file(ib / "ports/1/gid_attrs/ndevs/1", fn.ifname);
      // An unpopulated GID slot: reading it fails (EINVAL on a host; EISDIR here).
      fs::create_directories(ib / "ports/1/gid_attrs/types/2");
    }
    rel_link(fn.dir, ib / "device");
    rel_link(ib, root_ / "class/infiniband" / fn.ibdev);
  }
}

void SriovSysfsSimulator::remove_personality(Fn& fn) {
  std::error_code ec;
  if (!fn.ifname.empty()) fs::remove(root_ / "class/net" / fn.ifname, ec);
  if (!fn.ibdev.empty()) fs::remove(root_ / "class/infiniband" / fn.ibdev, ec);
  fs::remove_all(fn.dir / "net", ec);
  fs::remove_all(fn.dir / "infiniband", ec);
}

void SriovSysfsSimulator::bind(const std::string& bdf, const std::string& driver) {
  auto it = fns_.find(bdf);
  fs::path dd = root_ / "bus/pci/drivers" / driver;
  if (it == fns_.end() || !fs::exists(dd) || fs::exists(it->second.dir / "driver")) return;
  Fn& fn = it->second;
  // As in the kernel, the driver's probe creates the netdev/RDMA device before the driver link
  // appears (driver_bound() runs after probe succeeds).
  if (driver == fn.native_driver) add_personality(fn);
  rel_link(dd, fn.dir / "driver");
  rel_link(fn.dir, dd / bdf);
}

void SriovSysfsSimulator::unbind(const std::string& bdf) {
  auto it = fns_.find(bdf);
  if (it == fns_.end() || !fs::is_symlink(it->second.dir / "driver")) return;
  Fn& fn = it->second;
  std::string drv = fs::read_symlink(fn.dir / "driver").filename().string();
  remove_personality(fn);
  std::error_code ec;
  fs::remove(root_ / "bus/pci/drivers" / drv / bdf, ec);
  fs::remove(fn.dir / "driver", ec);
}

void SriovSysfsSimulator::probe(const std::string& bdf) {
  auto it = fns_.find(bdf);
  if (it == fns_.end() || fs::exists(it->second.dir / "driver")) return;
  std::string ov = read_trimmed(it->second.dir / "driver_override");
  // Like the kernel: with driver_override set, only that driver may bind.
  if (!ov.empty() && ov != "(null)") bind(bdf, ov);
  else bind(bdf, it->second.native_driver);
}

void SriovSysfsSimulator::set_numvfs(const std::string& pf_bdf, std::uint32_t n) {
  const SimPfSpec& s = pfs_.at(pf_bdf);
  Fn& pf = fns_.at(pf_bdf);
  std::uint32_t cur = 0;
  while (fs::is_symlink(pf.dir / fmt::format("virtfn{}", cur))) ++cur;
  if (n == cur || n > s.total_vfs) return;
  if (n == 0) {
    for (std::uint32_t i = 0; i < cur; ++i) {
      std::string vb = vf_bdf(s, i);
      unbind(vb);
      Fn& vf = fns_.at(vb);
      std::error_code ec;
      fs::remove(root_ / "bus/pci/devices" / vb, ec);
      fs::remove_all(root_ / "kernel/iommu_groups" / std::to_string(vf.iommu_group), ec);
      fs::remove_all(vf.dir, ec);
      fs::remove(pf.dir / fmt::format("virtfn{}", i), ec);
      fns_.erase(vb);
    }
    return;
  }
  if (cur != 0) return;  // the kernel answers EBUSY here; the code under test must not try
  bool autoprobe = read_trimmed(pf.dir / "sriov_drivers_autoprobe") == "1";
  for (std::uint32_t i = 0; i < n; ++i) {
    Fn vf;
    vf.bdf = vf_bdf(s, i);
    vf.dir = pf.dir.parent_path() / vf.bdf;
    vf.vendor = s.vendor;
    vf.device = s.vf_device;
    vf.native_driver = s.vf_driver;
    vf.is_vf = true;
    vf.pf = pf_bdf;
    vf.vf_index = i;
    vf.ifname = s.ifname.empty() ? "" : fmt::format("{}v{}", s.ifname.substr(0, 10), i);
    if (!s.vf_ibdev_prefix.empty()) {
      vf.ibdev = fmt::format("{}{}", s.vf_ibdev_prefix, ib_counters_[s.vf_ibdev_prefix]++);
      vf.rdma = s.rdma;
    }
    vf.iommu_group = next_group_++;
    make_function(vf, s.numa_node);
    rel_link(pf.dir, vf.dir / "physfn");
    fns_[vf.bdf] = vf;
    // The kernel probes a new VF (when autoprobe is on) before the sriov_numvfs write returns;
    // the virtfnN link is made last so a waiter sees a fully set-up VF.
    if (autoprobe) bind(vf.bdf, s.vf_driver);
    rel_link(vf.dir, pf.dir / fmt::format("virtfn{}", i));
  }
}

void SriovSysfsSimulator::on_write(const fs::path& dir, const std::string& file) {
  std::string v = read_trimmed(dir / file);
  ++writes_;
  if (file == "sriov_numvfs" && pfs_.count(dir.filename().string())) {
    set_numvfs(dir.filename().string(), static_cast<std::uint32_t>(std::strtoul(v.c_str(), nullptr, 10)));
  } else if (v.empty()) {
    return;
  } else if (file == "drivers_probe") {
    probe(v);
  } else if (file == "bind" && dir.parent_path().filename() == "drivers") {
    bind(v, dir.filename().string());
  } else if (file == "unbind" && dir.parent_path().filename() == "drivers") {
    unbind(v);
  }
}

void SriovSysfsSimulator::run() {
  alignas(inotify_event) std::array<char, 8192> buf{};
  for (;;) {
    std::array<pollfd, 2> p{{{inotify_fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}}};
    if (::poll(p.data(), p.size(), -1) < 0) continue;
    if (p[1].revents) return;
    ssize_t n = ::read(inotify_fd_, buf.data(), buf.size());
    if (n <= 0) continue;
    std::lock_guard<std::mutex> g(mu_);
    for (ssize_t off = 0; off < n;) {
      inotify_event ev{};
      std::memcpy(&ev, buf.data() + off, sizeof ev);
      std::string name(buf.data() + off + sizeof(inotify_event));
      off += static_cast<ssize_t>(sizeof(inotify_event) + ev.len);
      auto w = watches_.find(ev.wd);
      if (w == watches_.end() || name.empty() || !fs::exists(w->second)) continue;
      try {
        on_write(w->second, name);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "simulator: %s\n", e.what());
      }
    }
  }
}

void SriovSysfsSimulator::start() {
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
}

void SriovSysfsSimulator::stop() {
  if (!thread_.joinable()) return;
  char c = 1;
  if (::write(stop_pipe_[1], &c, 1) != 1) std::abort();
  thread_.join();
}

void SriovSysfsSimulator::add_standard_nics() {
  // QLogic FastLinQ QL41000 dual port: port 0 RoCE, port 1 iWARP (qedr "Universal RDMA").
  add_pf({"0000:3b:00.0", "0000:3a:00.0", 0x1077, 0x8070, 0x8090, "qede", "qede", 16, 2, 1, 0, 30, "ens1f0",
          "qedr0", SimRdma::roce, "qedr_vf"});
  add_pf({"0000:3b:00.1", "0000:3a:00.0", 0x1077, 0x8070, 0x8090, "qede", "qede", 16, 17, 1, 0, 31, "ens1f1",
          "qedr1", SimRdma::iwarp, ""});
  // Intel E810-C: irdma RoCE v2 on the PF; iavf VFs carry no RDMA function.
  add_pf({"0000:5e:00.0", "0000:5d:00.0", 0x8086, 0x1593, 0x1889, "ice", "iavf", 128, 8, 1, 0, 40, "ens2f0",
          "irdma0", SimRdma::roce_v2_only, ""});
  // Mellanox ConnectX-5: mlx5_core PF and VFs, each with an mlx5_ib RoCE device.
  add_pf({"0000:af:00.0", "0000:ae:00.0", 0x15b3, 0x1017, 0x1018, "mlx5_core", "mlx5_core", 8, 2, 1, 1, 50,
          "ens3f0np0", "mlx5_0", SimRdma::roce, "mlx5_"});
  ib_counters_["mlx5_"] = 1;
}

}  // namespace vrdma::sriov::test
