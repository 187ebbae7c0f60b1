#include "runtime/kv_blocks.h"

#include <algorithm>

#include "support/error.h"
#include "support/hash.h"

namespace mk {

KvBlockAllocator::KvBlockAllocator(int64_t n_blocks, int64_t block_size)
    : n_blocks_(n_blocks), block_size_(block_size) {
  if (n_blocks <= 0) fail("KV pool must have at least one block, got {}", n_blocks);
  if (block_size <= 0) fail("KV block size must be positive, got {}", block_size);
  if (n_blocks > INT32_MAX) fail("KV pool of {} blocks is too large", n_blocks);
  free_.reserve(static_cast<size_t>(n_blocks));
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));  // block 0 is taken first
  e_.resize(static_cast<size_t>(n_blocks));
}

void KvBlockAllocator::unkey(int32_t b) {
  Entry& e = e_[static_cast<size_t>(b)];
  by_key_.erase(e.key);
  e.keyed = false;
  e.tokens.clear();
}

bool KvBlockAllocator::allocate(int64_t n, std::vector<int32_t>& table) {
  MK_CHECK(n >= 0);
  if (n > n_free()) return false;
  for (int64_t i = 0; i < n; ++i) {
    int32_t b;
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    } else {  // evict the cached prefix block released longest ago
      b = lru_.front();
      lru_.pop_front();
      unkey(b);
    }
    e_[static_cast<size_t>(b)].refs = 1;
    table.push_back(b);
  }
  return true;
}

void KvBlockAllocator::release(std::vector<int32_t>& table) {
  // Last block first: a prefix's later blocks are older in the cache than its first ones, so
  // eviction shortens cached prefixes from their ends.
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    const int32_t b = *it;
    MK_CHECK(b >= 0 && b < n_blocks_ && e_[static_cast<size_t>(b)].refs > 0, "KV block {} released but not allocated", b);
    Entry& e = e_[static_cast<size_t>(b)];
    if (--e.refs > 0) continue;
    if (e.keyed)
      e.in_lru = lru_.insert(lru_.end(), b);
    else
      free_.push_back(b);
  }
  table.clear();
}

uint64_t KvBlockAllocator::chain_key(uint64_t parent, std::span<const int32_t> tokens) {
  Fnv1a64 h;
  h.add(std::string_view(reinterpret_cast<const char*>(&parent), sizeof parent));
  h.add(std::string_view(reinterpret_cast<const char*>(tokens.data()), tokens.size_bytes()));
  const uint64_t k = h.value();
  return k == 0 ? 1 : k;  // 0 is the empty prefix
}

int64_t KvBlockAllocator::acquire_prefix(std::span<const int32_t> tokens, int64_t max_blocks, std::vector<int32_t>& table,
                                         uint64_t& key) {
  const auto bs = static_cast<size_t>(block_size_);
  const int64_t n = std::min<int64_t>(max_blocks, static_cast<int64_t>(tokens.size() / bs));
  uint64_t parent = 0;
  int64_t got = 0;
  for (; got < n; ++got) {
    const auto block_tokens = tokens.subspan(static_cast<size_t>(got) * bs, bs);
    const uint64_t k = chain_key(parent, block_tokens);
    auto it = by_key_.find(k);
    if (it == by_key_.end()) break;
    Entry& e = e_[static_cast<size_t>(it->second)];
    if (e.parent != parent || !std::equal(e.tokens.begin(), e.tokens.end(), block_tokens.begin(), block_tokens.end()))
      break;  // a hash collision: not this prefix
    if (e.refs++ == 0) lru_.erase(e.in_lru);
    table.push_back(it->second);
    parent = k;
  }
  if (got > 0) key = parent;
  return got;
}

uint64_t KvBlockAllocator::add_key(int32_t block, uint64_t parent, std::span<const int32_t> tokens) {
  MK_CHECK(block >= 0 && block < n_blocks_ && e_[static_cast<size_t>(block)].refs > 0, "KV block {} keyed but not held",
           block);
  MK_CHECK(static_cast<int64_t>(tokens.size()) == block_size_);
  const uint64_t k = chain_key(parent, tokens);
  Entry& e = e_[static_cast<size_t>(block)];
  if (e.keyed) return e.key;  // taken from the cache: keyed already
  if (by_key_.emplace(k, block).second) {
    e.keyed = true;
    e.key = k;
    e.parent = parent;
    e.tokens.assign(tokens.begin(), tokens.end());
  }
  return k;
}

}  // namespace mk
