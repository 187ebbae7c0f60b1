// A whole text file (chat templates, --messages, tokenize -f, JSON configs) as bytes. Throws
// mk::Error naming the path: "is a directory, expected a file" (an ifstream reads a directory as
// an empty file), "cannot open: <reason>", "read failed: <reason>". Pipes and character devices
// (/dev/stdin) are read to their end; an empty file is an empty string.
#pragma once
#include <string>

namespace mk {

std::string read_text_file(const std::string& path);

}  // namespace mk
