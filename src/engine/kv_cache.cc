#include "engine/kv_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <string>

#include "common/check.h"
#include "engine/kv_events.h"
#include "engine/prefix_cache.h"

namespace pd::engine {
namespace {

std::string ErrnoText(const char* call, int err) {
  return std::string(call) + ": " + std::to_string(err) + " " + std::strerror(err);
}

Status ValidateSpec(const KvCacheSpec& spec, int num_pages) {
  if (spec.num_layers <= 0 || spec.num_kv_heads <= 0 || spec.head_dim <= 0 || spec.page_size <= 0)
    return InvalidArgument("KV cache spec needs positive num_layers, num_kv_heads, head_dim and " +
                           std::string("page_size; got layers=") + std::to_string(spec.num_layers) +
                           " kv_heads=" + std::to_string(spec.num_kv_heads) +
                           " head_dim=" + std::to_string(spec.head_dim) +
                           " page_size=" + std::to_string(spec.page_size));
  if (!spec.scales.empty() && static_cast<int>(spec.scales.size()) != spec.num_layers)
    return InvalidArgument("KV cache spec has " + std::to_string(spec.scales.size()) +
                           " layers' scales for " + std::to_string(spec.num_layers) + " layers");
  for (size_t l = 0; l < spec.scales.size(); ++l) {
    const model::KvScales& s = spec.scales[l];
    if (!(s.k_scale > 0.0f) || !(s.v_scale > 0.0f) || !std::isfinite(s.k_scale) ||
        !std::isfinite(s.v_scale))
      return InvalidArgument("KV cache layer " + std::to_string(l) + ": k_scale " +
                             std::to_string(s.k_scale) + ", v_scale " + std::to_string(s.v_scale) +
                             " (both must be positive and finite)");
  }
  if (num_pages <= 0)
    return InvalidArgument("KV region needs a positive number of pages, got " +
                           std::to_string(num_pages));
  return OkStatus();
}

}  // namespace

std::string_view KvLayoutName(KvLayout layout) { return layout == KvLayout::kNHD ? "nhd" : "hnd"; }

Result<KvLayout> ParseKvLayout(std::string_view name) {
  if (name == "nhd" || name == "NHD") return KvLayout::kNHD;
  if (name == "hnd" || name == "HND") return KvLayout::kHND;
  return InvalidArgument("unknown KV layout '" + std::string(name) + "' (expected nhd or hnd)");
}

std::string_view KvDTypeName(KvDType dtype) {
  switch (dtype) {
    case KvDType::kF32:
      return "f32";
    case KvDType::kBF16:
      return "bf16";
    case KvDType::kFP8E4M3:
      return "fp8_e4m3";
  }
  return "unknown";
}

Result<KvDType> ParseKvDType(std::string_view name) {
  if (name == "f32" || name == "float32") return KvDType::kF32;
  if (name == "bf16" || name == "bfloat16") return KvDType::kBF16;
  if (name == "fp8_e4m3" || name == "fp8") return KvDType::kFP8E4M3;
  return InvalidArgument("unknown KV dtype '" + std::string(name) +
                         "' (expected f32, bf16 or fp8_e4m3)");
}

uint64_t KvScalesFingerprint(const KvCacheSpec& spec) {
  if (spec.dtype != KvDType::kFP8E4M3) return 0;
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the scales' bits
  auto put = [&h](float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    for (int i = 0; i < 4; ++i) h = (h ^ ((bits >> (8 * i)) & 0xffu)) * 0x100000001b3ull;
  };
  for (int l = 0; l < spec.num_layers; ++l) {
    const model::KvScales s = spec.LayerScales(l);
    put(s.k_scale);
    put(s.v_scale);
  }
  return h == 0 ? 1 : h;
}

Result<std::unique_ptr<KvRegion>> KvRegion::Create(const KvCacheSpec& spec, int num_pages) {
  RETURN_IF_ERROR(ValidateSpec(spec, num_pages));
  const size_t os_page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t raw = static_cast<size_t>(num_pages) * spec.num_layers * spec.page_bytes();
  const size_t size = (raw + os_page - 1) / os_page * os_page;
  std::unique_ptr<KvRegion> region(new KvRegion());
  region->spec_ = spec;
  region->num_pages_ = num_pages;
  region->fd_ = memfd_create("pdserve-kv", MFD_CLOEXEC);
  if (region->fd_ < 0) return Internal(ErrnoText("memfd_create", errno));
  if (ftruncate(region->fd_, static_cast<off_t>(size)) != 0)
    return ResourceExhausted(ErrnoText("ftruncate", errno) + " (KV region of " +
                             std::to_string(size) + " bytes)");
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, region->fd_, 0);
  if (p == MAP_FAILED)
    return ResourceExhausted(ErrnoText("mmap", errno) + " (KV region of " + std::to_string(size) +
                             " bytes)");
  region->base_ = static_cast<uint8_t*>(p);
  region->size_bytes_ = size;  // a fresh memfd reads as zeros
  return region;
}

KvRegion::~KvRegion() {
  if (base_ != nullptr) munmap(base_, size_bytes_);
  if (fd_ >= 0) close(fd_);
}

PagePool::PagePool(int num_pages, int prefix_page_size)
    : num_total_(num_pages), prefix_page_size_(prefix_page_size) {
  PD_CHECK(num_pages >= 0) << "negative page count " << num_pages;
  PD_CHECK(prefix_page_size >= 0) << "negative prefix cache page size " << prefix_page_size;
  MutexLock lock(&mu_);
  free_list_.reserve(num_pages);
  // Lowest ids are handed out first (pop from the back).
  for (int i = num_pages - 1; i >= 0; --i) free_list_.push_back(i);
  refcount_.assign(num_pages, 0);
  if (prefix_page_size > 0) {
    lru_prev_.assign(num_pages, -1);
    lru_next_.assign(num_pages, -1);
    index_ = std::make_unique<PrefixIndex>(num_pages, prefix_page_size);
  }
}

PagePool::~PagePool() = default;

void PagePool::LruPushBack(int32_t page) {
  lru_prev_[page] = lru_tail_;
  lru_next_[page] = -1;
  if (lru_tail_ >= 0) {
    lru_next_[lru_tail_] = page;
  } else {
    lru_head_ = page;
  }
  lru_tail_ = page;
  ++lru_size_;
}

void PagePool::LruUnlink(int32_t page) {
  const int32_t prev = lru_prev_[page], next = lru_next_[page];
  (prev >= 0 ? lru_next_[prev] : lru_head_) = next;
  (next >= 0 ? lru_prev_[next] : lru_tail_) = prev;
  lru_prev_[page] = lru_next_[page] = -1;
  --lru_size_;
}

void PagePool::EvictOne() {
  PD_CHECK(lru_head_ >= 0) << "no cached page to evict";
  std::vector<int32_t> removed;
  std::vector<uint64_t> keys;
  index_->Remove(lru_head_, &removed, events_ != nullptr ? &keys : nullptr);
  if (events_ != nullptr) {
    for (uint64_t key : keys) events_->OnRemoved(key);
  }
  for (int32_t p : removed) {
    if (refcount_[p] != 0) continue;  // referenced: freed by its last Release, uncached now
    LruUnlink(p);
    free_list_.push_back(p);
  }
}

std::vector<int32_t> PagePool::AllocateLocked(int n) {
  while (static_cast<int>(free_list_.size()) < n) EvictOne();
  std::vector<int32_t> pages(free_list_.end() - n, free_list_.end());
  std::reverse(pages.begin(), pages.end());
  free_list_.resize(free_list_.size() - n);
  for (int32_t p : pages) refcount_[p] = 1;
  return pages;
}

Result<std::vector<int32_t>> PagePool::Allocate(int n) {
  if (n < 0) return InvalidArgument("cannot allocate " + std::to_string(n) + " pages");
  MutexLock lock(&mu_);
  const size_t available = free_list_.size() + lru_size_;
  if (static_cast<size_t>(n) > available)
    return ResourceExhausted("KV page pool: asked for " + std::to_string(n) + " pages, " +
                             std::to_string(available) + " free of " + std::to_string(num_total_));
  return AllocateLocked(n);
}

void PagePool::AddRef(std::span<const int32_t> pages) {
  MutexLock lock(&mu_);
  for (int32_t p : pages) {
    PD_CHECK(p >= 0 && p < num_total_) << "page id " << p << " out of range";
    PD_CHECK(refcount_[p] > 0) << "AddRef on free page " << p;
    ++refcount_[p];
  }
}

void PagePool::ReleaseOne(int32_t p) {
  PD_CHECK(p >= 0 && p < num_total_) << "page id " << p << " out of range";
  PD_CHECK(refcount_[p] > 0) << "double release of page " << p;
  if (--refcount_[p] != 0) return;
  if (index_ != nullptr && index_->IsCached(p)) {
    LruPushBack(p);
  } else {
    free_list_.push_back(p);
  }
}

void PagePool::Release(std::span<const int32_t> pages) {
  MutexLock lock(&mu_);
  if (index_ == nullptr) {
    for (int32_t p : pages) ReleaseOne(p);
    return;
  }
  // A sequence's last pages first: they are evicted before the prefix they extend.
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) ReleaseOne(*it);
}

int PagePool::num_free() const {
  MutexLock lock(&mu_);
  return static_cast<int>(free_list_.size()) + lru_size_;
}

int PagePool::RefCount(int32_t page) const {
  MutexLock lock(&mu_);
  PD_CHECK(page >= 0 && page < num_total_) << "page id " << page << " out of range";
  return refcount_[page];
}

std::vector<int32_t> PagePool::MatchPrefix(std::span<const uint64_t> keys,
                                           std::span<const int32_t> tokens) const {
  MutexLock lock(&mu_);
  if (index_ == nullptr) return {};
  return index_->Match(keys, tokens);
}

Result<std::vector<int32_t>> PagePool::AcquirePrefix(std::span<const int32_t> hits, int num_new) {
  if (num_new < 0) return InvalidArgument("cannot allocate " + std::to_string(num_new) + " pages");
  MutexLock lock(&mu_);
  int idle_hits = 0;  // hits in the LRU list: taking them leaves fewer pages to evict
  for (int32_t p : hits) {
    PD_CHECK(p >= 0 && p < num_total_) << "page id " << p << " out of range";
    PD_CHECK(index_ != nullptr && index_->IsCached(p)) << "prefix hit page " << p << " not cached";
    if (refcount_[p] == 0) ++idle_hits;
  }
  const int available = static_cast<int>(free_list_.size()) + lru_size_ - idle_hits;
  if (num_new > available)
    return ResourceExhausted("KV page pool: asked for " + std::to_string(num_new) +
                             " pages after a cached prefix of " + std::to_string(hits.size()) +
                             ", " + std::to_string(available) + " free of " +
                             std::to_string(num_total_));
  for (int32_t p : hits) {
    if (refcount_[p]++ == 0) LruUnlink(p);
  }
  std::vector<int32_t> pages(hits.begin(), hits.end());
  std::vector<int32_t> fresh = AllocateLocked(num_new);
  pages.insert(pages.end(), fresh.begin(), fresh.end());
  return pages;
}

bool PagePool::Register(int32_t page, int32_t parent, uint64_t key,
                        std::span<const int32_t> page_tokens) {
  MutexLock lock(&mu_);
  if (index_ == nullptr) return false;
  PD_CHECK(page >= 0 && page < num_total_ && refcount_[page] > 0)
      << "registering page " << page << ", which is not referenced";
  const bool was_cached = index_->IsCached(page);
  if (!index_->Insert(page, parent, key, page_tokens)) return false;
  if (!was_cached && events_ != nullptr) events_->OnStored(key);
  return true;
}

void PagePool::SetEventLog(KvEventLog* log) {
  MutexLock lock(&mu_);
  events_ = log;
}

int PagePool::num_cached() const {
  MutexLock lock(&mu_);
  return index_ == nullptr ? 0 : index_->num_cached();
}

int PagePool::num_evictable() const {
  MutexLock lock(&mu_);
  return lru_size_;
}

Status PagePool::CheckConsistency() const {
  MutexLock lock(&mu_);
  auto bad = [](int32_t p, const std::string& what) {
    return Internal("KV page pool: page " + std::to_string(p) + " " + what);
  };
  std::vector<int> on_free(num_total_, 0), on_lru(num_total_, 0);
  for (int32_t p : free_list_) {
    if (p < 0 || p >= num_total_) return bad(p, "on the free list is out of range");
    if (++on_free[p] > 1) return bad(p, "is on the free list twice");
  }
  int lru_count = 0;
  for (int32_t p = lru_head_; p >= 0; p = lru_next_[p]) {
    if (++on_lru[p] > 1 || ++lru_count > num_total_) return bad(p, "is in the LRU list twice");
  }
  if (lru_count != lru_size_)
    return Internal("KV page pool: the LRU list holds " + std::to_string(lru_count) +
                    " pages but counts " + std::to_string(lru_size_));
  for (int32_t p = 0; p < num_total_; ++p) {
    const bool cached = index_ != nullptr && index_->IsCached(p);
    if (refcount_[p] < 0) return bad(p, "has a negative reference count");
    if (refcount_[p] > 0 && (on_free[p] || on_lru[p])) return bad(p, "is referenced and free");
    if (refcount_[p] == 0 && on_free[p] + on_lru[p] != 1)
      return bad(p, "is unreferenced but neither free nor cached-evictable");
    if (on_lru[p] && !cached) return bad(p, "is in the LRU list but not cached");
    if (on_free[p] && cached) return bad(p, "is on the free list but cached");
  }
  return index_ == nullptr ? OkStatus() : index_->CheckConsistency();
}

}  // namespace pd::engine
