// A whole text file (chat templates, --messages, tokenize -f, JSON configs) as bytes. Throws
// mk::Error naming the path: "is a directory, expected a file" (an ifstream reads a directory as
// an empty file), "cannot open: <reason>", "read failed: <reason>". Pipes and character devices
// (/dev/stdin) are read to their end; an empty file is an empty string. The path "-" is standard
// input, as in most command-line tools (--messages -, tokenize -f -); errors call it that.
#pragma once
#include <string>

namespace mk {

std::string read_text_file(const std::string& path);

// The name errors give a path read_text_file takes: "standard input" for "-", else the path.
inline std::string text_file_name(const std::string& path) { return path == "-" ? "standard input" : path; }

}  // namespace mk
