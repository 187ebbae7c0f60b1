// Paged KV cache bookkeeping (vLLM's PagedAttention, Kwon et al., SOSP 2023): the pool of
// kv_pool_blocks blocks of kv_block_size rows is handed out to sequences by a free list. A
// sequence's block table (backend/step_batch.h) lists its blocks in position order. The allocator
// only counts and hands out block ids; the backend owns the memory.
#pragma once
#include <cstdint>
#include <vector>

namespace mk {

class KvBlockAllocator {
 public:
  // n_blocks blocks of block_size rows each. Throws mk::Error when either is not positive.
  KvBlockAllocator(int64_t n_blocks, int64_t block_size);
  // Blocks needed to hold n_tokens rows.
  int64_t blocks_for(int64_t n_tokens) const { return (n_tokens + block_size_ - 1) / block_size_; }
  // Takes n blocks off the free list and appends them to `table`; returns false (and takes none)
  // when fewer than n are free.
  bool allocate(int64_t n, std::vector<int32_t>& table);
  // Returns every block of `table` to the free list and clears it. A block that is not currently
  // allocated (double free, id outside the pool) is an internal error (MK_CHECK).
  void release(std::vector<int32_t>& table);
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t n_used() const { return n_blocks_ - n_free(); }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t block_size() const { return block_size_; }

 private:
  int64_t n_blocks_, block_size_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
  std::vector<bool> used_;
};

}  // namespace mk
