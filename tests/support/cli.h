// Running the megakernel CLI (MK_CLI_PATH, set by tests/CMakeLists.txt) from tests, and reading the
// JSON fixtures the e2e tests share.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace mk::test {

// Runs `cmd` with /bin/sh and returns its stdout; *status = the exit code (128 + signal when killed).
inline std::string run_shell(const std::string& cmd, int* status) {
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  if (!p) {
    *status = -1;
    return out;
  }
  std::array<char, 65536> buf;
  for (size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
  const int st = pclose(p);
  *status = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
  return out;
}

// `megakernel ARGS` with stdout and stderr together.
inline std::string run_cli(const std::string& args, int* status) {
  return run_shell(std::string(MK_CLI_PATH) + " " + args + " 2>&1", status);
}

// `megakernel ARGS` with stdout returned and stderr in *err.
inline std::string run_cli(const std::string& args, int* status, std::string* err) {
  const std::string err_path =
      (std::filesystem::path(::testing::TempDir()) / ("mk_cli_err_" + std::to_string(getpid()) + ".txt")).string();
  std::string out = run_shell(std::string(MK_CLI_PATH) + " " + args + " 2>" + err_path, status);
  std::ifstream e(err_path);
  std::stringstream ss;
  ss << e.rdbuf();
  *err = ss.str();
  std::filesystem::remove(err_path);
  return out;
}

// A JSON file parsed, or a test failure naming the missing file (and null).
inline nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "missing " << path;
  if (!f.good()) return nullptr;
  return nlohmann::json::parse(f);
}

// stories260K's llama2.c greedy references: an array of {"prompt", "steps", "prompt_ids", "generated_ids"}.
inline nlohmann::json stories_reference() {
  return read_json(std::string(MK_SHARED_DIR) + "/models/stories260K/reference_greedy.json");
}

}  // namespace mk::test
