// vrdmactl: the project's CLI. Today it knows one subcommand, `vf` (sriov/); integration/ will
// take this binary over and add the others.
#include <cstdio>
#include <cstring>

#include "vrdma/sriov/cli.hpp"

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "vf") == 0) return vrdma::sriov::vf_cli_main(argc, argv);
  std::fprintf(stderr,
               "usage: vrdmactl vf <list|enable|disable|assign|release|show|reconcile|network-xml> [options]\n"
               "Run 'vrdmactl vf --help' for the options of each command.\n");
  return 2;
}
