// Unicode text operations for tokenizer normalizers, on valid UTF-8, built on utf8proc
// (https://juliastrings.github.io/utf8proc/, the Unicode Character Database), not hand tables.
// Each mirrors the Hugging Face `tokenizers` normalizer of the same name (normalizers/*.rs).
#pragma once
#include <string>
#include <string_view>

namespace mk {

enum class UnicodeForm { NFC, NFD, NFKC, NFKD };

// Unicode normalization form (UAX #15). Throws mk::Error for invalid UTF-8.
std::string unicode_normalize(std::string_view s, UnicodeForm form);
// Lowercase: each character's full lowercase mapping (Rust char::to_lowercase, as tokenizers'
// Lowercase does: per character, so no final-sigma context; U+0130 becomes "i" + U+0307).
std::string unicode_lowercase(std::string_view s);
// Strip: removes White_Space characters (Unicode property) from the left and/or right end.
std::string unicode_strip(std::string_view s, bool left, bool right);
// StripAccents: removes nonspacing marks (general category Mn); meant to follow NFD/NFKD.
std::string unicode_strip_accents(std::string_view s);
// The Unicode White_Space property (PropList.txt), as Rust's char::is_whitespace.
bool unicode_is_whitespace(char32_t c);
// The byte offset of the first byte that does not start a valid UTF-8 character in s (an invalid or
// truncated sequence, a surrogate, past U+10FFFF); s.size() when all of s is valid.
size_t utf8_invalid_offset(std::string_view s);

}  // namespace mk
