// Classic BPE training over counted words (used to make synthetic tokenizers that really
// compress text).
#include <algorithm>
#include <unordered_map>

#include "model/bpe.h"

namespace pd::model::internal {
namespace {

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct Word {
  std::vector<int32_t> symbols;
  int64_t count = 0;
};

class Trainer {
 public:
  explicit Trainer(const std::unordered_map<std::string, int64_t>& word_counts) {
    for (int b = 0; b < 256; ++b) AddToken(std::string(1, static_cast<char>(b)));
    // Sorted words make the result independent of the hash map's iteration order.
    std::vector<std::pair<std::string, int64_t>> sorted(word_counts.begin(), word_counts.end());
    std::sort(sorted.begin(), sorted.end());
    for (const auto& [text, count] : sorted) {
      if (text.size() < 2 || count <= 0) continue;
      Word word;
      word.count = count;
      for (unsigned char c : text) word.symbols.push_back(c);
      AddPairs(word, +1);
      words_.push_back(std::move(word));
    }
  }

  std::vector<LearnedMerge> Run(int max_merges) {
    std::vector<LearnedMerge> merges;
    while (static_cast<int>(merges.size()) < max_merges) {
      uint64_t best = 0;
      int64_t best_count = 1;  // a pair must occur at least twice to be worth a token
      for (const auto& [key, count] : pair_counts_) {
        if (count > best_count || (count == best_count && best_count > 1 && Before(key, best))) {
          best = key;
          best_count = count;
        }
      }
      if (best_count < 2) break;
      const auto left = static_cast<int32_t>(best >> 32);
      const auto right = static_cast<int32_t>(best & 0xFFFFFFFF);
      merges.push_back({tokens_[left], tokens_[right]});
      const int32_t result = AddToken(tokens_[left] + tokens_[right]);
      for (Word& word : words_) MergeInWord(&word, left, right, result);
    }
    return merges;
  }

 private:
  int32_t AddToken(const std::string& bytes) {
    auto [it, inserted] = token_ids_.emplace(bytes, static_cast<int32_t>(tokens_.size()));
    if (inserted) tokens_.push_back(bytes);
    return it->second;
  }

  bool Before(uint64_t a, uint64_t b) const {
    const auto& al = tokens_[a >> 32];
    const auto& bl = tokens_[b >> 32];
    if (al != bl) return al < bl;
    return tokens_[a & 0xFFFFFFFF] < tokens_[b & 0xFFFFFFFF];
  }

  void AddPairs(const Word& word, int sign) {
    for (size_t i = 0; i + 1 < word.symbols.size(); ++i) {
      const uint64_t key = PairKey(word.symbols[i], word.symbols[i + 1]);
      int64_t& count = pair_counts_[key];
      count += sign * word.count;
      if (count == 0) pair_counts_.erase(key);
    }
  }

  void MergeInWord(Word* word, int32_t left, int32_t right, int32_t result) {
    auto& s = word->symbols;
    bool present = false;
    for (size_t i = 0; i + 1 < s.size() && !present; ++i)
      present = s[i] == left && s[i + 1] == right;
    if (!present) return;
    AddPairs(*word, -1);
    std::vector<int32_t> merged;
    merged.reserve(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
        merged.push_back(result);
        ++i;
      } else {
        merged.push_back(s[i]);
      }
    }
    s.swap(merged);
    AddPairs(*word, +1);
  }

  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> token_ids_;
  std::vector<Word> words_;
  std::unordered_map<uint64_t, int64_t> pair_counts_;
};

}  // namespace

std::vector<LearnedMerge> TrainBpe(const std::unordered_map<std::string, int64_t>& word_counts,
                                   int max_merges) {
  Trainer trainer(word_counts);
  return trainer.Run(max_merges);
}

}  // namespace pd::model::internal
