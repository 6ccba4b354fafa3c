#include "engine/prefix_cache.h"

#include <algorithm>
#include <string>

#include "common/check.h"

namespace pd::engine {
namespace {

// A 64-bit finaliser (murmur3's fmix64): every input bit reaches every output bit.
uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

uint64_t Combine(uint64_t h, uint64_t value) {
  return Mix(h ^ (value + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2)));
}

std::string PageText(int32_t page) { return "page " + std::to_string(page); }

}  // namespace

uint64_t PrefixCacheRoot(uint64_t model_fingerprint, const KvCacheSpec& spec) {
  uint64_t h = Mix(model_fingerprint ^ 0x70647365727665ull);  // "pdserve"
  h = Combine(h, static_cast<uint64_t>(spec.dtype));
  h = Combine(h, spec.latent_dim > 0 ? 2 : static_cast<uint64_t>(spec.layout));
  h = Combine(h, static_cast<uint64_t>(spec.page_size));
  h = Combine(h, static_cast<uint64_t>(spec.latent_dim));
  // fp8_e4m3: what the codes are worth (the checkpoint's scales) is part of the format too.
  if (spec.dtype == KvDType::kFP8E4M3) h = Combine(h, KvScalesFingerprint(spec));
  return h;
}

uint64_t PageKey(uint64_t parent, std::span<const int32_t> page_tokens) {
  uint64_t h = Combine(parent, page_tokens.size());
  for (int32_t t : page_tokens) h = Combine(h, static_cast<uint32_t>(t));
  return h;
}

void ExtendPageKeys(uint64_t root, std::span<const int32_t> tokens, int page_size,
                    std::vector<uint64_t>* keys) {
  const size_t full = tokens.size() / static_cast<size_t>(page_size);
  for (size_t i = keys->size(); i < full; ++i) {
    const uint64_t parent = i == 0 ? root : (*keys)[i - 1];
    keys->push_back(PageKey(parent, tokens.subspan(i * page_size, page_size)));
  }
}

PrefixIndex::PrefixIndex(int num_pages, int page_size) : page_size_(page_size), nodes_(num_pages) {
  PD_CHECK(page_size > 0) << "prefix cache page size " << page_size;
}

std::vector<int32_t> PrefixIndex::Match(std::span<const uint64_t> keys,
                                        std::span<const int32_t> tokens) const {
  PD_CHECK(tokens.size() >= keys.size() * page_size_) << "fewer tokens than keyed pages";
  std::vector<int32_t> pages;
  int32_t parent = -1;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = by_key_.find(keys[i]);
    if (it == by_key_.end()) break;
    const Node& node = nodes_[it->second];
    const auto page_tokens = tokens.subspan(i * page_size_, page_size_);
    if (node.parent != parent || !std::equal(page_tokens.begin(), page_tokens.end(),
                                             node.tokens.begin(), node.tokens.end())) {
      break;  // a key collision: another prefix's page
    }
    pages.push_back(it->second);
    parent = it->second;
  }
  return pages;
}

bool PrefixIndex::Insert(int32_t page, int32_t parent, uint64_t key,
                         std::span<const int32_t> page_tokens) {
  PD_CHECK(page >= 0 && page < static_cast<int32_t>(nodes_.size())) << PageText(page);
  PD_CHECK(static_cast<int>(page_tokens.size()) == page_size_)
      << "a cached page holds " << page_size_ << " tokens, got " << page_tokens.size();
  Node& node = nodes_[page];
  if (node.cached) {
    PD_CHECK(node.key == key && node.parent == parent)
        << PageText(page) << " is cached under another key or parent";
    return true;
  }
  if (parent >= 0 && !nodes_[parent].cached) return false;
  if (by_key_.count(key) != 0) return false;  // another page already holds this prefix
  node.cached = true;
  node.key = key;
  node.parent = parent;
  node.tokens.assign(page_tokens.begin(), page_tokens.end());
  node.children.clear();
  if (parent >= 0) nodes_[parent].children.push_back(page);
  by_key_.emplace(key, page);
  return true;
}

void PrefixIndex::Unlink(int32_t page) {
  const int32_t parent = nodes_[page].parent;
  if (parent < 0) return;
  std::vector<int32_t>& siblings = nodes_[parent].children;
  siblings.erase(std::find(siblings.begin(), siblings.end(), page));
}

void PrefixIndex::Remove(int32_t page, std::vector<int32_t>* removed,
                         std::vector<uint64_t>* removed_keys) {
  PD_CHECK(nodes_[page].cached) << PageText(page) << " is not cached";
  Unlink(page);
  std::vector<int32_t> stack = {page};  // explicit: chains can be thousands of pages deep
  while (!stack.empty()) {
    const int32_t p = stack.back();
    stack.pop_back();
    Node& node = nodes_[p];
    stack.insert(stack.end(), node.children.begin(), node.children.end());
    by_key_.erase(node.key);
    if (removed_keys != nullptr) removed_keys->push_back(node.key);
    node = Node();
    removed->push_back(p);
  }
}

Status PrefixIndex::CheckConsistency() const {
  size_t cached = 0;
  for (int32_t p = 0; p < static_cast<int32_t>(nodes_.size()); ++p) {
    const Node& node = nodes_[p];
    if (!node.cached) {
      if (!node.children.empty()) return Internal(PageText(p) + " is not cached but has children");
      continue;
    }
    ++cached;
    auto it = by_key_.find(node.key);
    if (it == by_key_.end() || it->second != p)
      return Internal(PageText(p) + " is cached but its key does not map to it");
    if (node.parent >= 0) {
      const Node& parent = nodes_[node.parent];
      if (!parent.cached) return Internal(PageText(p) + "'s parent is not cached");
      if (std::count(parent.children.begin(), parent.children.end(), p) != 1)
        return Internal(PageText(p) + " is not listed once among its parent's children");
    }
    for (int32_t c : node.children) {
      if (!nodes_[c].cached || nodes_[c].parent != p)
        return Internal(PageText(p) + " lists " + PageText(c) + " as a child wrongly");
    }
  }
  if (cached != by_key_.size())
    return Internal("the prefix index maps " + std::to_string(by_key_.size()) + " keys but " +
                    std::to_string(cached) + " pages are cached");
  return OkStatus();
}

}  // namespace pd::engine
