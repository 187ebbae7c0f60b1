// Paged KV cache bookkeeping (vLLM's PagedAttention, Kwon et al., SOSP 2023): the pool of
// kv_pool_blocks blocks of kv_block_size rows is handed out to sequences by a free list. A
// sequence's block table (backend/step_batch.h) lists its blocks in position order. The allocator
// only counts and hands out block ids; the backend owns the memory.
//
// Prefix caching (vLLM's automatic prefix caching): a block whose block_size rows all hold KV is
// keyed by its tokens chained to the key of the block before it (the KV of a row depends on every
// token up to it), so a key names a whole token prefix. Blocks are reference-counted; a keyed block
// that its last sequence releases stays cached: counted free, handed out again only when the plain
// free list is empty (least recently released first, the ends of prefixes before their starts),
// and until then a later sequence whose tokens begin with the same prefix takes it
// (acquire_prefix) instead of computing those rows again. Shared blocks are only read: a sequence
// writes rows past its cached prefix, in blocks of its own.
#pragma once
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace mk {

class KvBlockAllocator {
 public:
  // n_blocks blocks of block_size rows each. Throws mk::Error when either is not positive.
  KvBlockAllocator(int64_t n_blocks, int64_t block_size);
  // Blocks needed to hold n_tokens rows.
  int64_t blocks_for(int64_t n_tokens) const { return (n_tokens + block_size_ - 1) / block_size_; }
  // Takes n blocks (the free list first, then the least recently released cached blocks, which lose
  // their keys) and appends them to `table`; returns false (and takes none) when fewer than n are free.
  bool allocate(int64_t n, std::vector<int32_t>& table);
  // Drops one reference to every block of `table` (a block no sequence holds becomes free, or cached
  // when keyed) and clears it. A block that is not currently held (double free, id outside the pool)
  // is an internal error (MK_CHECK).
  void release(std::vector<int32_t>& table);
  int64_t n_free() const { return static_cast<int64_t>(free_.size() + lru_.size()); }  // cached included
  int64_t n_used() const { return n_blocks_ - n_free(); }  // held by at least one sequence
  int64_t n_cached() const { return static_cast<int64_t>(lru_.size()); }  // free, still holding a keyed prefix
  int64_t n_blocks() const { return n_blocks_; }
  int64_t block_size() const { return block_size_; }

  // The key of a full block of `tokens` (block_size ids) after the prefix keyed `parent` (0: the
  // first block of a sequence). FNV-1a 64 (support/hash.h); lookups also compare tokens and parent.
  static uint64_t chain_key(uint64_t parent, std::span<const int32_t> tokens);
  // Appends to `table` the cached or held blocks that hold the longest prefix of `tokens` in whole
  // blocks, at most max_blocks of them, taking a reference to each; returns how many, and sets `key`
  // to the last one's key (unchanged when none).
  int64_t acquire_prefix(std::span<const int32_t> tokens, int64_t max_blocks, std::vector<int32_t>& table,
                         uint64_t& key);
  // Keys a held block whose block_size rows hold the KV of `tokens` after the prefix keyed `parent`;
  // returns its key. When another block already has that key, this one stays unkeyed (freed, not
  // cached, on release) and the key is still returned: it names the same prefix.
  uint64_t add_key(int32_t block, uint64_t parent, std::span<const int32_t> tokens);

 private:
  struct Entry {
    int32_t refs = 0;
    bool keyed = false;
    uint64_t key = 0, parent = 0;
    std::vector<int32_t> tokens;           // the block's tokens, when keyed
    std::list<int32_t>::iterator in_lru;   // when keyed and refs == 0
  };
  void unkey(int32_t b);
  int64_t n_blocks_, block_size_;
  std::vector<int32_t> free_;  // unkeyed, unheld: a stack (the most recently freed block is reused first)
  std::list<int32_t> lru_;     // keyed, unheld: front = released longest ago (evicted first)
  std::vector<Entry> e_;
  std::unordered_map<uint64_t, int32_t> by_key_;
};

}  // namespace mk
