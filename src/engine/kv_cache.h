// The paged KV cache: one region per rank, pages of page_size tokens, layouts NHD and HND.
//
// A region holds, for every layer and every page, one contiguous block of page_bytes():
//   region:      (num_layers, num_pages, page_bytes)  offset = (layer*num_pages + page)*page_bytes
//   HND page:    (num_kv_heads, 2, page_size, head_dim)  2 = K then V: a head range is contiguous
//   NHD page:    (page_size, num_kv_heads, 2, head_dim)  a head range is strided per token
//   latent page: (page_size, latent_dim)                  MLA (latent_dim > 0), token after token
// MLA models keep no per-head K and V: a latent row is the token's RMSNorm(c) * kv_a_layernorm
// (kv_lora_rank values) then its rotated rope key (qk_rope_head_dim values; with rope_interleave
// the rotated pairs (2i, 2i+1) stay in the checkpoint's order), the same on every rank. `layout`
// does not apply to it (num_kv_heads is 1, head_dim is latent_dim).
// FP8 (fp8_e4m3, vLLM's name): one byte per element, the e4m3fn code of value / scale (round to
// nearest even, saturating to +-448), read back as code * scale; the scales are per layer and per
// tensor as vLLM defines them (k_scale for K, v_scale for V; an MLA latent row uses k_scale).
// Page ids are shared by all layers (and by all ranks of an instance): a sequence's page table
// names one id per page_size tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "model/kv_scales.h"

namespace pd::engine {

enum class KvLayout { kNHD, kHND };
enum class KvDType { kF32, kBF16, kFP8E4M3 };

std::string_view KvLayoutName(KvLayout layout);  // "nhd" | "hnd"
Result<KvLayout> ParseKvLayout(std::string_view name);
std::string_view KvDTypeName(KvDType dtype);  // "f32" | "bf16" | "fp8_e4m3"
// Also accepts "float32", "bfloat16" and vLLM's "fp8" (an alias of fp8_e4m3).
Result<KvDType> ParseKvDType(std::string_view name);
inline size_t KvDTypeBytes(KvDType dtype) {
  return dtype == KvDType::kF32 ? 4 : (dtype == KvDType::kBF16 ? 2 : 1);
}

struct KvCacheSpec {
  int num_layers = 0;
  int num_kv_heads = 0;  // heads this rank owns
  int head_dim = 0;
  int page_size = 16;
  KvLayout layout = KvLayout::kHND;
  KvDType dtype = KvDType::kF32;
  int latent_dim = 0;  // > 0: an MLA latent cache (kv_lora_rank + qk_rope_head_dim)
  // fp8_e4m3: each layer's scales (num_layers entries, or empty: 1.0 everywhere); other dtypes
  // ignore them, as vLLM does.
  std::vector<model::KvScales> scales;

  size_t elem_bytes() const { return KvDTypeBytes(dtype); }
  model::KvScales LayerScales(int layer) const {
    if (dtype != KvDType::kFP8E4M3 || scales.empty()) return {};
    return scales[static_cast<size_t>(layer)];
  }
  size_t page_bytes() const {
    if (latent_dim > 0) return static_cast<size_t>(page_size) * latent_dim * elem_bytes();
    return static_cast<size_t>(page_size) * num_kv_heads * 2 * head_dim * elem_bytes();
  }
  // Element offset, inside one page block, of K (kv=0) or V (kv=1) for (token, head, dim 0).
  size_t ElemOffset(int token, int head, int kv) const {
    if (layout == KvLayout::kHND)
      return ((static_cast<size_t>(head) * 2 + kv) * page_size + token) * head_dim;
    return ((static_cast<size_t>(token) * num_kv_heads + head) * 2 + kv) * head_dim;
  }
};

// One rank's KV memory: memfd-backed and page-aligned, so it can be mapped by another process
// and registered with the fabric. Thread safety: the memory is written by the forward pass of
// the owning rank and read by the transfer engine; callers order those accesses.
// 0 unless dtype is fp8_e4m3; then a hash of every layer's (k_scale, v_scale) bits (1.0 where
// scales is empty), so two caches whose bytes mean different values differ.
uint64_t KvScalesFingerprint(const KvCacheSpec& spec);

class KvRegion {
 public:
  static Result<std::unique_ptr<KvRegion>> Create(const KvCacheSpec& spec, int num_pages);
  ~KvRegion();
  KvRegion(const KvRegion&) = delete;
  KvRegion& operator=(const KvRegion&) = delete;

  const KvCacheSpec& spec() const { return spec_; }
  int num_pages() const { return num_pages_; }
  uint8_t* base() { return base_; }
  size_t size_bytes() const { return size_bytes_; }
  int fd() const { return fd_; }  // the memfd, for sharing with another process
  size_t BlockOffset(int layer, int page) const {
    return (static_cast<size_t>(layer) * num_pages_ + page) * spec_.page_bytes();
  }
  uint8_t* Block(int layer, int page) { return base_ + BlockOffset(layer, page); }

 private:
  KvRegion() = default;
  KvCacheSpec spec_;
  int num_pages_ = 0;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  size_t size_bytes_ = 0;
};

class PrefixIndex;  // prefix_cache.h
class KvEventLog;   // kv_events.h

// Allocates page ids with reference counts. With a prefix cache (prefix_page_size > 0), full
// pages can be registered under a chained key (prefix_cache.h): a registered page whose last
// reference goes stays cached, evictable in least-recently-released order, until Allocate needs
// it (evicting a page evicts the pages cached after it too); a later request's matching prefix
// takes it back with AcquirePrefix. Cached-evictable pages count as free.
// Thread safety: all methods lock mu_.
class PagePool {
 public:
  explicit PagePool(int num_pages, int prefix_page_size = 0);
  ~PagePool();

  // n pages with refcount 1, or ResourceExhausted (and nothing allocated).
  Result<std::vector<int32_t>> Allocate(int n) EXCLUDES(mu_);
  void AddRef(std::span<const int32_t> pages) EXCLUDES(mu_);
  // Drops one reference of each page; a page whose count reaches 0 is free again (cached and
  // evictable when registered; the span's last pages are evicted first).
  void Release(std::span<const int32_t> pages) EXCLUDES(mu_);
  // Free pages, cached-evictable ones included.
  int num_free() const EXCLUDES(mu_);
  int num_total() const { return num_total_; }
  int RefCount(int32_t page) const EXCLUDES(mu_);

  // --- Prefix cache (all no-ops or empty without one) ---
  bool prefix_caching() const { return prefix_page_size_ > 0; }
  // The cached pages holding the longest prefix of the query (see PrefixIndex::Match); takes no
  // reference.
  std::vector<int32_t> MatchPrefix(std::span<const uint64_t> keys,
                                   std::span<const int32_t> tokens) const EXCLUDES(mu_);
  // One reference on each of `hits` (cached pages from MatchPrefix, not evicted since) and
  // num_new new pages: hits then new, or ResourceExhausted with nothing taken.
  Result<std::vector<int32_t>> AcquirePrefix(std::span<const int32_t> hits, int num_new)
      EXCLUDES(mu_);
  // Registers a referenced page as holding `page_tokens` after `parent` (-1: the first page)
  // under `key`; false when another page holds the key or the parent is not cached.
  bool Register(int32_t page, int32_t parent, uint64_t key, std::span<const int32_t> page_tokens)
      EXCLUDES(mu_);
  // Borrowed, may be null: told every key indexed and evicted from now on (set it before the
  // first Register).
  void SetEventLog(KvEventLog* log) EXCLUDES(mu_);
  int num_cached() const EXCLUDES(mu_);     // pages in the prefix index
  int num_evictable() const EXCLUDES(mu_);  // cached pages nobody references
  // Recounts everything: each page is exactly one of free (on the free list), cached-evictable
  // (in the LRU list, refcount 0) or referenced; the lists hold no page twice; the index is
  // consistent. Internal naming the first page that is wrong.
  Status CheckConsistency() const EXCLUDES(mu_);

 private:
  void LruPushBack(int32_t page) REQUIRES(mu_);
  void LruUnlink(int32_t page) REQUIRES(mu_);
  // Evicts the least recently released cached page (and its cached descendants) to the free list.
  void EvictOne() REQUIRES(mu_);
  std::vector<int32_t> AllocateLocked(int n) REQUIRES(mu_);
  void ReleaseOne(int32_t page) REQUIRES(mu_);

  const int num_total_;
  const int prefix_page_size_;
  mutable Mutex mu_;
  std::vector<int32_t> free_list_ GUARDED_BY(mu_);
  std::vector<int32_t> refcount_ GUARDED_BY(mu_);
  // The LRU list of cached pages with refcount 0, linked by page id (-1 ends it); head: evicted
  // first.
  std::vector<int32_t> lru_prev_ GUARDED_BY(mu_);
  std::vector<int32_t> lru_next_ GUARDED_BY(mu_);
  int32_t lru_head_ GUARDED_BY(mu_) = -1;
  int32_t lru_tail_ GUARDED_BY(mu_) = -1;
  int lru_size_ GUARDED_BY(mu_) = 0;
  std::unique_ptr<PrefixIndex> index_ GUARDED_BY(mu_);  // null without a prefix cache
  KvEventLog* events_ GUARDED_BY(mu_) = nullptr;
};

}  // namespace pd::engine
