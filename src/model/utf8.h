// UTF-8 well-formedness helpers shared by the tokenizers (internal to src/model).
//
// Source: the Unicode Standard, table 3-7 "Well-Formed UTF-8 Byte Sequences": the ranges exclude
// overlong forms, UTF-16 surrogates (ED A0..BF) and code points above U+10FFFF.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace mk::utf8 {

// Length of the sequence a lead byte starts (0: not a valid lead byte) and the range its second
// byte must lie in; later bytes must be continuation bytes 80..BF.
struct LeadInfo {
  int length;
  uint8_t second_lo, second_hi;
};

inline LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};  // continuation byte, C0/C1 or F5..FF
}

// Number of bytes of s[i..] that form a valid prefix of one UTF-8 sequence (at least 1 when
// i < s.size()), and whether that prefix is the complete sequence. An ill-formed lead byte gives
// {1, false}; a lead byte followed by a byte that cannot continue it gives the maximal subpart.
struct SequenceScan {
  size_t length;
  bool complete;
};

inline SequenceScan scan_sequence(std::string_view s, size_t i) {
  const LeadInfo info = lead_info(static_cast<uint8_t>(s[i]));
  if (info.length == 0) return {1, false};
  size_t j = 1;
  while (j < static_cast<size_t>(info.length)) {
    if (i + j >= s.size()) return {j, false};
    const auto c = static_cast<uint8_t>(s[i + j]);
    const uint8_t lo = j == 1 ? info.second_lo : 0x80;
    const uint8_t hi = j == 1 ? info.second_hi : 0xBF;
    if (c < lo || c > hi) return {j, false};
    ++j;
  }
  return {j, true};
}

}  // namespace mk::utf8
