#include "vrdma/integration/cli.hpp"

#include <iostream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "vrdma/common/cli.hpp"
#include "vrdma/integration/hook.hpp"
#include "vrdma/sriov/cli.hpp"

namespace vrdma::integration {

namespace {

constexpr const char* kHookUsage = "vrdmactl hook qemu DOMAIN OPERATION SUB-OPERATION [EXTRA]";

// libvirt runs the hook with its own argument order and the domain XML on stdin (hook.hpp).
int hook_cli(const std::vector<std::string>& args) {
  if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
    std::cout << "usage: " << kHookUsage << "\n"
              << "libvirt's qemu hook (installed as /etc/libvirt/hooks/qemu.d/vrdma): it reads the domain XML on "
              << "standard input, starts and stops the domain's vrdmad, and rewrites its sockets for a migration.\n";
    return 0;
  }
  if (args.empty() || args[0] != "qemu" || args.size() < 4) {
    std::cerr << "vrdmactl hook: libvirt calls it as '" << kHookUsage
              << "' with the domain XML on standard input (run 'vrdmactl hook --help')\n";
    return 2;
  }
  return hook_qemu_run(std::vector<std::string>(args.begin() + 1, args.end()), std::cin, std::cout, std::cerr);
}

}  // namespace

int vrdmactl_main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  // `vf` has its own parser (sriov/cli.cpp); the hook keeps libvirt's argument order.
  if (!args.empty() && args[0] == "vf") return sriov::vf_cli_run({args.begin() + 1, args.end()}, std::cout, std::cerr);
  if (!args.empty() && args[0] == "hook") return hook_cli({args.begin() + 1, args.end()});

  CLI::App app{"vrdmactl: the virtio RDMA device for libvirt guests: attach it to a domain, migrate the domain, "
               "look at a running backend, manage the host's SR-IOV VFs",
               "vrdmactl"};
  cli::prepare(app);
  app.require_subcommand(1);
  app.add_subcommand("vf", "SR-IOV VFs: list, enable, disable, assign, release, show, reconcile, network-xml "
                           "(run 'vrdmactl vf --help')");
  app.add_subcommand("hook", "libvirt's qemu hook: " + std::string(kHookUsage) + " (libvirt runs it)");
  Commands commands;
  add_domain_commands(app, commands);
  add_list_command(app, commands);
  add_migrate_command(app, commands);
  add_device_commands(app, commands);
  add_migration_vf_commands(app, commands);
  if (auto rc = cli::parse(app, args)) return *rc;
  for (const auto& c : commands)
    if (c.app->parsed()) return c.run();
  std::cerr << "vrdmactl: say what to do (run 'vrdmactl --help')\n";
  return 2;
}

}  // namespace vrdma::integration
