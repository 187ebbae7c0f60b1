// Bytes read from a file (a GGUF key, a tensor name), made safe to echo in an error message.
#pragma once
#include <string>
#include <string_view>

namespace mk {

// Control bytes and bytes that are not valid UTF-8 become \xNN; valid UTF-8 stays as it is; more
// than `max` input bytes are cut, with the total length appended ("... (N bytes)").
std::string printable(std::string_view s, size_t max = 64);

}  // namespace mk
