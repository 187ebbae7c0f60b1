// Bounds-checked little-endian reader over a byte span. Every read checks the remaining length
// first and throws mk::Error naming the file, the field and the offset when it would run past the end.
#pragma once
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "support/error.h"

namespace mk {

class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> bytes, std::string source) : bytes_(bytes), source_(std::move(source)) {}

  size_t offset() const { return pos_; }
  size_t size() const { return bytes_.size(); }
  size_t remaining() const { return bytes_.size() - pos_; }
  const std::string& source() const { return source_; }

  void need(size_t n, std::string_view what) const {
    if (n > remaining())
      fail("{}: truncated while reading {} at offset {} (need {} bytes, {} left)", source_, what, pos_, n,
           remaining());
  }
  template <class T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string_view read_bytes(size_t n, std::string_view what) {
    need(n, what);
    std::string_view s(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  void skip(size_t n, std::string_view what) {
    need(n, what);
    pos_ += n;
  }
  void seek(size_t off, std::string_view what) {
    if (off > bytes_.size()) fail("{}: {} offset {} is past the end of the file ({} bytes)", source_, what, off, bytes_.size());
    pos_ = off;
  }

 private:
  std::span<const uint8_t> bytes_;
  std::string source_;
  size_t pos_ = 0;
};

}  // namespace mk
