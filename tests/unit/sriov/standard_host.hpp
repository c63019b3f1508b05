// TEST FIXTURE: the simulated host most SR-IOV tests start from: the standard NICs
// (SriovSysfsSimulator::add_standard_nics) in a running simulator, and the SysfsRoot the code under
// test reads it through (3 s for the simulator's thread to settle a change).
#pragma once

#include <chrono>

#include "sriov_sysfs_simulator.hpp"
#include "vrdma/sriov/discovery.hpp"

namespace vrdma::sriov::test {

struct StandardHost {
  SriovSysfsSimulator sim;
  SysfsRoot sysfs;
  StandardHost() {
    sim.add_standard_nics();
    sim.start();
    sysfs.root = sim.root();
    sysfs.settle_timeout = std::chrono::milliseconds(3000);
  }
};

}  // namespace vrdma::sriov::test
