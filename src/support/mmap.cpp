#include "support/mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "support/error.h"

namespace mk {

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  struct stat pre {};
  if (::stat(path.c_str(), &pre) == 0 && !S_ISREG(pre.st_mode) && !S_ISDIR(pre.st_mode))
    fail("{}: not a regular file", path);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path, std::strerror(e));
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    fail("{}: is a directory, expected a file", path);
  }
  auto f = std::shared_ptr<MappedFile>(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ == 0) {
    // /proc and /sys files report size 0 but read as text: a model cannot be mapped from them
    char c = 0;
    const bool has_data = ::read(fd, &c, 1) == 1;
    ::close(fd);
    if (has_data) fail("{}: the file reports size 0 but holds data (a /proc or /sys file?); it cannot be mapped", path);
    fail("{}: file is empty", path);
  }
  void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) fail("{}: mmap failed: {}", path, std::strerror(e));
  f->data_ = static_cast<const uint8_t*>(p);
  f->mapped_ = true;
  return f;
}

std::shared_ptr<MappedFile> MappedFile::from_bytes(std::string bytes, std::string name) {
  auto f = std::shared_ptr<MappedFile>(new MappedFile());
  f->owned_ = std::move(bytes);
  f->data_ = reinterpret_cast<const uint8_t*>(f->owned_.data());
  f->size_ = f->owned_.size();
  f->path_ = std::move(name);
  return f;
}

void MappedFile::drop_pages(const void* p, size_t n) const {
  const auto a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(data_);
  if (!mapped_ || a < base || n > size_ || a - base > size_ - n) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (a + page - 1) / page * page, hi = (a + n) / page * page;
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (mapped_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace mk
