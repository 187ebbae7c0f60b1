// Read-only memory-mapped file. Errors (missing file, unreadable, empty) throw mk::Error naming the path.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace mk {

class MappedFile {
 public:
  static std::shared_ptr<MappedFile> open(const std::string& path);
  // Wraps bytes held in memory (tests build damaged files this way).
  static std::shared_ptr<MappedFile> from_bytes(std::string bytes, std::string name = "<memory>");
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }
  // Gives the whole pages of [p, p + n) back to the kernel when they are part of this mapping
  // (madvise MADV_DONTNEED; a later read faults them in again from the file, unchanged); otherwise,
  // and for bytes held in memory, does nothing. For data that has been copied elsewhere.
  void drop_pages(const void* p, size_t n) const;

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  std::string owned_;
  std::string path_;
};

}  // namespace mk
