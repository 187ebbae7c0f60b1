// Format-independent parts of the tokenizer interface: EOS checks, whole-sequence decoding and the
// streaming UTF-8 assembler used when printing tokens as they are generated.
#include "model/tokenizer.h"

#include <algorithm>

#include "model/utf8.h"
#include "support/error.h"

namespace mk {

bool Tokenizer::is_eos(int32_t id) const {
  if (id < 0) return false;
  if (id == eos_id) return true;
  return std::find(extra_eos_ids.begin(), extra_eos_ids.end(), id) != extra_eos_ids.end();
}

std::vector<int32_t> Tokenizer::encode_prompt(std::string_view text) const {
  return encode(text, true);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  Utf8Stream stream;
  std::string text;
  int32_t prev = -1;
  for (int32_t id : ids) {
    text += stream.push(token_bytes(prev, id));
    prev = id;
  }
  return text + stream.flush();
}

namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
}  // namespace

// Scans pending_ from the start. Complete well-formed sequences are copied out; each maximal
// ill-formed subpart (a bad lead byte, or a valid prefix cut off by a byte that cannot continue it)
// becomes one U+FFFD, the substitution the Unicode standard recommends (also what browsers and
// Python's "replace" error handler do). A well-formed but incomplete sequence at the end stays
// pending until more bytes arrive or the stream is flushed.
std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  out.reserve(pending_.size());
  const std::string_view s = pending_;
  size_t i = 0;
  while (i < s.size()) {
    const utf8::SequenceScan scan = utf8::scan_sequence(s, i);
    if (scan.complete) {
      out.append(s.substr(i, scan.length));
    } else if (i + scan.length == s.size() && utf8::lead_info(static_cast<uint8_t>(s[i])).length != 0) {
      break;  // a valid prefix that may still complete: keep it for the next push
    } else {
      out += kReplacement;
    }
    i += scan.length;
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::flush() {
  std::string out = push({});
  // Whatever is still pending is a well-formed prefix that never completed: one U+FFFD.
  if (!pending_.empty()) {
    out += kReplacement;
    pending_.clear();
  }
  return out;
}

}  // namespace mk
