#include "support/json.h"

#include <fstream>
#include <sstream>

namespace mk {

nlohmann::ordered_json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_json(ss.str(), path);
}

}  // namespace mk
