#include "vrdma/integration/cli.hpp"

#include <cstdio>
#include <cstring>

#include "vrdma/sriov/cli.hpp"

namespace vrdma::integration {

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: vrdmactl vf <list|enable|disable|assign|release|show|reconcile|network-xml> [options]\n"
               "Run 'vrdmactl vf --help' for the options of each command.\n");
  return 2;
}

}  // namespace

int vrdmactl_main(int argc, char** argv) {
  if (argc < 2) return usage();
  if (std::strcmp(argv[1], "vf") == 0) return sriov::vf_cli_main(argc, argv);
  return usage();
}

}  // namespace vrdma::integration
