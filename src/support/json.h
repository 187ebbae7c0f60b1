// Parsing untrusted JSON (config.json, generation_config.json, tokenizer.json, safetensors headers).
//
// nlohmann-json parses iteratively but copies, compares and dumps recursively, so a file nested
// 20,000 deep overflows the stack later. parse_json refuses nesting deeper than kMaxJsonDepth while
// parsing (a parser callback tracks the depth), and refuses an object that names a key twice:
// nlohmann (like Python's json) would silently keep the last value, and the two readers of one
// file must never disagree. Errors throw mk::Error naming the source; clip() bounds any echo of
// input in a message.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "support/error.h"
#include "support/printable.h"

namespace mk {

// Deepest nesting of objects/arrays accepted (real HF files nest fewer than 10 levels).
inline constexpr int kMaxJsonDepth = 64;

// At most `max` bytes of `s` for an error message, with the total length when cut.
// Control bytes and invalid UTF-8 are escaped (\xNN), as printable() does.
inline std::string clip(std::string_view s, size_t max = 64) { return printable(s, max); }
// A JSON value for an error message, clipped.
template <class J>
std::string clip_json(const J& v, size_t max = 64) {
  return clip(v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), max);
}

// nlohmann's message without its "[json.exception.parse_error.101] " tag: "parse error at line 1,
// column 2: syntax error while parsing value - ...".
inline std::string json_error_text(const nlohmann::json::exception& e) {
  std::string what = e.what();
  if (what.rfind("[json.exception.", 0) == 0)
    if (const size_t tag_end = what.find("] "); tag_end != std::string::npos) what.erase(0, tag_end + 2);
  return what;
}

// Parses `text`; `source` names the file in errors. `duplicate_what` names top-level keys in the
// duplicate-key message (e.g. "tensor" for a safetensors header); empty = "key".
template <class J = nlohmann::ordered_json>
J parse_json(std::string_view text, const std::string& source, const std::string& duplicate_what = "") {
  std::vector<std::unordered_set<std::string>> keys;  // one set per open object
  auto cb = [&](int depth, nlohmann::json::parse_event_t event, J& parsed) -> bool {
    using E = nlohmann::json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start:
        if (depth >= kMaxJsonDepth) fail("{}: JSON nested deeper than {} levels", source, kMaxJsonDepth);
        if (event == E::object_start) keys.emplace_back();
        break;
      case E::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case E::key:
        if (!keys.empty() && !keys.back().insert(parsed.template get_ref<const std::string&>()).second) {
          const std::string& k = parsed.template get_ref<const std::string&>();
          if (depth == 1 && !duplicate_what.empty())
            fail("{}: {} {} is given twice", source, duplicate_what, clip(k));
          fail("{}: key {:?} appears twice in one JSON object (depth {}); refusing to pick one", source, clip(k), depth);
        }
        break;
      default: break;
    }
    return true;
  };
  try {
    return J::parse(text.begin(), text.end(), cb);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", source, clip(json_error_text(e), 200));
  }
}

// Reads and parses a JSON file (see parse_json); throws mk::Error naming the file when it is
// missing or invalid.
nlohmann::ordered_json read_json_file(const std::string& path);

}  // namespace mk
