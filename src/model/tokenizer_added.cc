#include "model/tokenizer_added.h"

#include <algorithm>
#include <functional>

namespace pd::model::internal {
namespace {

size_t TwoBytes(std::string_view s, size_t pos) {
  return (static_cast<size_t>(static_cast<unsigned char>(s[pos])) << 8) |
         static_cast<unsigned char>(s[pos + 1]);
}

}  // namespace

void AddedTokenMatcher::Add(const std::string& content, int32_t id) {
  if (content.empty()) return;
  ids_[content] = id;
  auto& lengths = lengths_by_first_byte_[static_cast<unsigned char>(content[0])];
  const auto size = static_cast<uint32_t>(content.size());
  if (std::find(lengths.begin(), lengths.end(), size) == lengths.end()) {
    lengths.push_back(size);
    std::sort(lengths.begin(), lengths.end(), std::greater<>());
  }
  if (content.size() >= 2) first_two_bytes_.set(TwoBytes(content, 0));
}

AddedTokenMatcher::Match AddedTokenMatcher::Find(std::string_view text, size_t from) const {
  if (ids_.empty()) return {};
  for (size_t pos = from; pos < text.size(); ++pos) {
    const auto& lengths = lengths_by_first_byte_[static_cast<unsigned char>(text[pos])];
    if (lengths.empty()) continue;
    const bool two_ok = pos + 1 < text.size() && first_two_bytes_.test(TwoBytes(text, pos));
    for (uint32_t length : lengths) {
      if (pos + length > text.size()) continue;
      if (length >= 2 && !two_ok) continue;
      auto it = ids_.find(text.substr(pos, length));
      if (it != ids_.end()) return Match{pos, length, it->second};
    }
  }
  return {};
}

}  // namespace pd::model::internal
