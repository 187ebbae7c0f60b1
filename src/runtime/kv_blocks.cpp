#include "runtime/kv_blocks.h"

#include "support/error.h"

namespace mk {

KvBlockAllocator::KvBlockAllocator(int64_t n_blocks, int64_t block_size)
    : n_blocks_(n_blocks), block_size_(block_size) {
  if (n_blocks <= 0) fail("KV pool must have at least one block, got {}", n_blocks);
  if (block_size <= 0) fail("KV block size must be positive, got {}", block_size);
  if (n_blocks > INT32_MAX) fail("KV pool of {} blocks is too large", n_blocks);
  free_.reserve(static_cast<size_t>(n_blocks));
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));  // block 0 is taken first
  used_.assign(static_cast<size_t>(n_blocks), false);
}

bool KvBlockAllocator::allocate(int64_t n, std::vector<int32_t>& table) {
  MK_CHECK(n >= 0);
  if (n > n_free()) return false;
  for (int64_t i = 0; i < n; ++i) {
    int32_t b = free_.back();
    free_.pop_back();
    used_[static_cast<size_t>(b)] = true;
    table.push_back(b);
  }
  return true;
}

void KvBlockAllocator::release(std::vector<int32_t>& table) {
  for (int32_t b : table) {
    MK_CHECK(b >= 0 && b < n_blocks_ && used_[static_cast<size_t>(b)], "KV block {} released but not allocated", b);
    used_[static_cast<size_t>(b)] = false;
    free_.push_back(b);
  }
  table.clear();
}

}  // namespace mk
