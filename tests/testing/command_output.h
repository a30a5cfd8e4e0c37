#pragma once

// Runs a shell command and returns what it printed on stdout (header-only:
// the reference tests that compare with PyTorch through a Python script
// link different parts of ddp).

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

namespace ddp::testing {

// `command`'s standard output. A command that cannot be started, or that
// exits with a non-zero status, is a test failure (not a skip): the caller
// then finds no or too few lines and says what it expected.
inline std::string command_output(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  EXPECT_NE(pipe, nullptr) << "could not run " << command;
  if (pipe == nullptr) {
    return {};
  }
  std::string output;
  char buffer[1 << 16];
  size_t read = 0;
  while ((read = std::fread(buffer, 1, sizeof(buffer), pipe.get())) > 0) {
    output.append(buffer, read);
  }
  EXPECT_EQ(pclose(pipe.release()), 0) << command << " failed (can it import torch?)";
  return output;
}

} // namespace ddp::testing
