#include "engine/kv_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/check.h"

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

std::string_view KvDTypeName(KvDType dtype) { return dtype == KvDType::kF32 ? "f32" : "bf16"; }

Result<KvDType> ParseKvDType(std::string_view name) {
  if (name == "f32" || name == "float32") return KvDType::kF32;
  if (name == "bf16" || name == "bfloat16") return KvDType::kBF16;
  return InvalidArgument("unknown KV dtype '" + std::string(name) + "' (expected f32 or bf16)");
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

PagePool::PagePool(int num_pages) : num_total_(num_pages) {
  PD_CHECK(num_pages >= 0) << "negative page count " << num_pages;
  free_list_.reserve(num_pages);
  // Lowest ids are handed out first (pop from the back).
  for (int i = num_pages - 1; i >= 0; --i) free_list_.push_back(i);
  refcount_.assign(num_pages, 0);
}

Result<std::vector<int32_t>> PagePool::Allocate(int n) {
  if (n < 0) return InvalidArgument("cannot allocate " + std::to_string(n) + " pages");
  MutexLock lock(&mu_);
  if (static_cast<size_t>(n) > free_list_.size())
    return ResourceExhausted("KV page pool: asked for " + std::to_string(n) + " pages, " +
                             std::to_string(free_list_.size()) + " free of " +
                             std::to_string(num_total_));
  std::vector<int32_t> pages(free_list_.end() - n, free_list_.end());
  std::reverse(pages.begin(), pages.end());
  free_list_.resize(free_list_.size() - n);
  for (int32_t p : pages) refcount_[p] = 1;
  return pages;
}

void PagePool::AddRef(std::span<const int32_t> pages) {
  MutexLock lock(&mu_);
  for (int32_t p : pages) {
    PD_CHECK(p >= 0 && p < num_total_) << "page id " << p << " out of range";
    PD_CHECK(refcount_[p] > 0) << "AddRef on free page " << p;
    ++refcount_[p];
  }
}

void PagePool::Release(std::span<const int32_t> pages) {
  MutexLock lock(&mu_);
  for (int32_t p : pages) {
    PD_CHECK(p >= 0 && p < num_total_) << "page id " << p << " out of range";
    PD_CHECK(refcount_[p] > 0) << "double release of page " << p;
    if (--refcount_[p] == 0) free_list_.push_back(p);
  }
}

int PagePool::num_free() const {
  MutexLock lock(&mu_);
  return static_cast<int>(free_list_.size());
}

int PagePool::RefCount(int32_t page) const {
  MutexLock lock(&mu_);
  PD_CHECK(page >= 0 && page < num_total_) << "page id " << page << " out of range";
  return refcount_[page];
}

}  // namespace pd::engine
