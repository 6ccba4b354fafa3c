// Finds added tokens (e.g. "<|im_end|>") written literally in text: leftmost, then longest.
// Built for ~150k tokens: a 64k-bit filter on each token's first two bytes and, per first byte,
// the distinct token lengths (longest first) probed in one hash map. Text without a candidate
// start costs one table lookup per byte.
//
// Thread safety: immutable after construction; Find may run on many threads at once.
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace pd::model::internal {

// Hashes std::string and std::string_view alike so maps can be probed without copying.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class AddedTokenMatcher {
 public:
  struct Match {
    size_t pos = 0;
    size_t size = 0;
    int32_t id = -1;
  };

  void Reserve(size_t num_tokens) { ids_.reserve(num_tokens); }
  void Add(const std::string& content, int32_t id);  // content non-empty
  bool empty() const { return ids_.empty(); }

  // The leftmost match at or after `from` (the longest among those starting there); id -1 if none.
  Match Find(std::string_view text, size_t from) const;

 private:
  StringIdMap ids_;
  std::array<std::vector<uint32_t>, 256> lengths_by_first_byte_;  // distinct, descending
  std::bitset<65536> first_two_bytes_;  // of every token two bytes or longer
};

}  // namespace pd::model::internal
