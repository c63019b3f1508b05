// vrdmactl's dispatcher: `vrdmactl vf ...` (sriov/), and the integration subcommands.
// Exit status 0 on success, 1 on an operational error (a sentence on stderr), 2 on a usage error.
#pragma once

namespace vrdma::integration {

// argv as main() gets it (argv[0] is the program).
int vrdmactl_main(int argc, char** argv);

}  // namespace vrdma::integration
