// vrdmactl: the project's CLI (docs/integration.md). The subcommands live in the modules'
// libraries; integration/src/cli.cpp dispatches.
#include "vrdma/integration/cli.hpp"

int main(int argc, char** argv) { return vrdma::integration::vrdmactl_main(argc, argv); }
