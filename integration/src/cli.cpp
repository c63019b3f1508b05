#include "vrdma/integration/cli.hpp"

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "vrdma/integration/domain_xml.hpp"
#include "vrdma/integration/hook.hpp"
#include "vrdma/integration/migrate.hpp"
#include "vrdma/integration/migration_vf.hpp"
#include "vrdma/sriov/cli.hpp"

namespace vrdma::integration {

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: vrdmactl vf <list|enable|disable|assign|release|show|reconcile|network-xml> [options]\n"
               "       vrdmactl migrate DOMAIN DEST_URI [--connect SRC_URI] [--migrateuri URI] [--timeout S]\n"
               "       vrdmactl migration-vf up|show|release   (this host's VF for rdma:// migrations)\n"
               "       vrdmactl device <status|migrate> --control PATH [--to tcp:IP:PORT] [--timeout S]\n"
               "       vrdmactl domain attach --socket PATH --engine ENGINE [--xml FILE] [options]   (prints the XML)\n"
               "       vrdmactl hook qemu DOMAIN OPERATION SUB-OPERATION [EXTRA]   (libvirt's hook; XML on stdin)\n"
               "Run 'vrdmactl vf --help', 'vrdmactl migrate --help' or 'vrdmactl device' for the options.\n");
  return 2;
}

}  // namespace

int vrdmactl_main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::vector<std::string> rest(argv + 2, argv + argc);
  if (std::strcmp(argv[1], "vf") == 0) return sriov::vf_cli_main(argc, argv);
  if (std::strcmp(argv[1], "migrate") == 0) return migrate_cli(rest);
  if (std::strcmp(argv[1], "migration-vf") == 0) return migration_vf_cli(rest);
  if (std::strcmp(argv[1], "device") == 0) return device_cli(rest);
  if (std::strcmp(argv[1], "domain") == 0) return domain_cli(rest);
  if (std::strcmp(argv[1], "hook") == 0) {
    if (rest.empty() || rest[0] != "qemu") {
      std::fprintf(stderr, "usage: vrdmactl hook qemu DOMAIN OPERATION SUB-OPERATION [EXTRA]\n");
      return 2;
    }
    return hook_qemu_run(std::vector<std::string>(rest.begin() + 1, rest.end()), std::cin, std::cout, std::cerr);
  }
  return usage();
}

}  // namespace vrdma::integration
