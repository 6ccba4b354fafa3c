// Byte-level BPE: a word's bytes start as single-byte tokens, then the adjacent pair of lowest
// merge rank is merged until no ranked pair remains (HF tokenizers' algorithm: a priority queue
// ordered by (rank, position) over a linked list of symbols). Also a small BPE trainer.
//
// Thread safety: BpeModel is immutable after construction; EncodeWord may run on many threads.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace pd::model::internal {

struct BpeMerge {
  int32_t left = 0;
  int32_t right = 0;
  int32_t result = 0;
};

struct BpeModelOptions {
  std::array<int32_t, 256> byte_ids{};  // id of the single-byte token of each byte
  std::vector<BpeMerge> merges;         // in rank order (rank = index)
  // HF's ignore_merges (Llama-3): a word that is itself a vocab token is emitted as that token.
  bool ignore_merges = false;
  std::unordered_map<std::string, int32_t> word_ids;  // raw bytes -> id; used with ignore_merges
};

class BpeModel {
 public:
  BpeModel() = default;
  explicit BpeModel(BpeModelOptions options);

  // Appends the ids of one pre-tokenized word (raw bytes, non-empty).
  void EncodeWord(std::string_view word, std::vector<int32_t>* ids) const;

 private:
  struct Rule {
    int32_t rank;
    int32_t result;
  };
  static uint64_t Key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  const Rule* Find(int32_t left, int32_t right) const;

  std::array<int32_t, 256> byte_ids_{};
  std::unordered_map<uint64_t, Rule> rules_;
  bool ignore_merges_ = false;
  std::unordered_map<std::string, int32_t> word_ids_;
};

// Learns up to `max_merges` merges from words with counts (classic BPE training: count adjacent
// pairs, merge the most frequent, repeat; ties go to the smallest (left, right) token bytes).
// Stops early when no pair occurs at least twice. Returns the merges as token byte strings.
struct LearnedMerge {
  std::string left;
  std::string right;
};
std::vector<LearnedMerge> TrainBpe(const std::unordered_map<std::string, int64_t>& word_counts,
                                   int max_merges);

}  // namespace pd::model::internal
