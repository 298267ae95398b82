// SPDX-License-Identifier: Apache-2.0
#include <iostream>

#include "commands.hpp"

int main(int argc, char** argv) {
  std::vector<std::string> tokens(argv + 1, argv + argc);
  return tangram::cli::run(tokens, {std::cout, std::cerr});
}
