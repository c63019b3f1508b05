// A plain text table for operators: columns as wide as their widest cell, two spaces apart, no
// trailing blanks (vrdmactl vf list, vrdmactl list).
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace vrdma {

void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows);

}  // namespace vrdma
