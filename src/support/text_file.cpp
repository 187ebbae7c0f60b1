#include "support/text_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "support/error.h"

namespace mk {

std::string read_text_file(const std::string& path) {
  if (path == "-") {
    std::stringstream ss;
    ss << std::cin.rdbuf();
    if (std::cin.bad()) fail("standard input: read failed: {}", std::strerror(errno));
    return ss.str();
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) fail("{}: is a directory, expected a file", path);
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open: {}", path, errno != 0 ? std::strerror(errno) : "unknown error");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("{}: read failed: {}", path, std::strerror(errno));
  return ss.str();
}

}  // namespace mk
