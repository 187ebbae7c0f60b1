// Stable 64-bit hashing for on-disk cache keys (compiled kernels, later programs).
//
// FNV-1a 64 (Fowler/Noll/Vo, http://www.isthe.com/chongo/tech/comp/fnv/): tiny, byte-order
// independent and identical on every platform and run, unlike std::hash. Not cryptographic: cache
// entries also store their key and size so a damaged or colliding file is detected on read.
#pragma once
#include <cstdint>
#include <string_view>

namespace mk {

class Fnv1a64 {
 public:
  static constexpr uint64_t kOffsetBasis = 0xcbf29ce484222325ull;
  static constexpr uint64_t kPrime = 0x100000001b3ull;

  Fnv1a64& add(std::string_view bytes) {
    for (unsigned char c : bytes) h_ = (h_ ^ c) * kPrime;
    return *this;
  }
  // Adds a field and a terminator, so ("ab", "c") and ("a", "bc") hash differently.
  Fnv1a64& field(std::string_view bytes) {
    add(bytes);
    h_ = (h_ ^ 0xffu) * kPrime;  // 0xff never occurs in UTF-8 text
    return *this;
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = kOffsetBasis;
};

inline uint64_t fnv1a64(std::string_view bytes) { return Fnv1a64().add(bytes).value(); }

}  // namespace mk
