// `vrdmactl vf list|enable|disable|assign|release|show|reconcile|network-xml`. Table output by
// default, JSON with --json. Exit status 0 on success, 1 on an operational error (the sentence
// goes to `err`), 2 on a usage error.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace vrdma::sriov {

// args excludes the program name and the "vf" word: {"list", "--json", "--sysfs-root", "/tmp/x"}.
int vf_cli_run(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// argv[0] is the program, argv[1] must be "vf" (as dispatched by vrdmactl).
int vf_cli_main(int argc, char** argv);

}  // namespace vrdma::sriov
