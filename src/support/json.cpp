#include "support/json.h"

#include "support/text_file.h"

#include <fstream>
#include <sstream>

namespace mk {

nlohmann::ordered_json read_json_file(const std::string& path) {
  return parse_json(read_text_file(path), text_file_name(path));
}

}  // namespace mk
