// Prefix caching (vLLM's automatic prefix caching): full KV pages stay indexed by what they hold,
// so a request whose prompt starts with tokens another request already ran shares those pages
// instead of computing them again.
//
// A full page is named by a chained key: key[i] = PageKey(key[i-1], the page's page_size token
// ids), key[-1] = PrefixCacheRoot(model fingerprint, KV format). A key names the page's tokens and
// everything before them, so equal keys mean equal KV (the same model computes the same KV for the
// same tokens at the same positions).
//
// Collisions never hand back another prompt's KV: the key is only where the index looks. A node
// also stores its page's token ids and its parent page (the page holding the page_size tokens
// before it); Match accepts page i only when its tokens equal the query's and its parent is the
// page it accepted for i-1 (page 0: the root). By induction an accepted page was computed after
// exactly the query's earlier tokens. Parents are exact because a cached node's parent is always
// cached: Remove takes a page's descendants out with it, so a page id that is reused later never
// inherits children.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "engine/kv_cache.h"

namespace pd::engine {

// The root of every key chain: the model (e.g. the handshake's ModelFingerprint; 0 is allowed in
// a process that serves one model) and the KV format (dtype, layout, page size, latent width and,
// for fp8_e4m3, the scales).
uint64_t PrefixCacheRoot(uint64_t model_fingerprint, const KvCacheSpec& spec);
// The key of one full page after `parent` (the previous page's key, or the root).
uint64_t PageKey(uint64_t parent, std::span<const int32_t> page_tokens);
// Extends *keys (the keys of the first keys->size() full pages of `tokens`) to every full page of
// `tokens`.
void ExtendPageKeys(uint64_t root, std::span<const int32_t> tokens, int page_size,
                    std::vector<uint64_t>* keys);

// The index of cached pages: which page holds which key, each page's tokens and parent, and the
// tree of parents and children. It knows nothing of reference counts (PagePool does).
// Thread safety: not thread-safe; PagePool holds it under its mutex.
class PrefixIndex {
 public:
  PrefixIndex(int num_pages, int page_size);

  int page_size() const { return page_size_; }
  // The cached pages holding the longest prefix of the query: keys[i] is the key of the query's
  // page i, tokens its token ids (at least keys.size() * page_size of them).
  std::vector<int32_t> Match(std::span<const uint64_t> keys, std::span<const int32_t> tokens) const;
  // Indexes `page` as holding the KV of `page_tokens` after `parent` (-1: the root) under `key`.
  // False (nothing changes) when the key is already held by another page or `parent` is not
  // cached; true when it is indexed now or already was with this key.
  bool Insert(int32_t page, int32_t parent, uint64_t key, std::span<const int32_t> page_tokens);
  // Takes `page` and all its descendants out of the index; appends them to *removed (and their
  // keys to *removed_keys when not null).
  void Remove(int32_t page, std::vector<int32_t>* removed,
              std::vector<uint64_t>* removed_keys = nullptr);
  bool IsCached(int32_t page) const { return nodes_[page].cached; }
  int num_cached() const { return static_cast<int>(by_key_.size()); }
  // The index's own invariants (every cached page's key maps to it, its parent is cached and
  // lists it as a child, the counts agree); Internal naming the first broken one.
  Status CheckConsistency() const;

 private:
  struct Node {
    bool cached = false;
    uint64_t key = 0;
    int32_t parent = -1;
    std::vector<int32_t> tokens;    // (page_size) the page's token ids
    std::vector<int32_t> children;  // cached pages whose parent this is
  };
  void Unlink(int32_t page);  // out of its parent's children

  const int page_size_;
  std::vector<Node> nodes_;  // one per page id
  std::unordered_map<uint64_t, int32_t> by_key_;
};

}  // namespace pd::engine
