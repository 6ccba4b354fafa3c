#include "model/bpe.h"

#include <queue>
#include <utility>

namespace pd::model::internal {

BpeModel::BpeModel(BpeModelOptions options)
    : byte_ids_(options.byte_ids),
      ignore_merges_(options.ignore_merges),
      word_ids_(std::move(options.word_ids)) {
  rules_.reserve(options.merges.size());
  for (size_t rank = 0; rank < options.merges.size(); ++rank) {
    const BpeMerge& m = options.merges[rank];
    // A pair listed twice keeps its last rank, as HF tokenizers' map insertion does.
    rules_[Key(m.left, m.right)] = Rule{static_cast<int32_t>(rank), m.result};
  }
}

const BpeModel::Rule* BpeModel::Find(int32_t left, int32_t right) const {
  auto it = rules_.find(Key(left, right));
  return it == rules_.end() ? nullptr : &it->second;
}

namespace {

// The word's symbols: a doubly linked list over its bytes; a merged-away symbol has id -1.
struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
};

// A possible merge of the symbol at `pos` with the next one, ordered by (rank, position).
struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t result;
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

// Merges the adjacent pair of lowest (rank, position) until no ranked pair remains.
// find(left, right) returns the pair's rule ({rank, result}) or nullptr.
template <typename FindFn>
void MergeSymbols(std::vector<Symbol>& symbols, const FindFn& find) {
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  const auto push_pair = [&](int32_t pos, int32_t left_id, int32_t right_id) {
    if (const auto* r = find(left_id, right_id)) queue.push({r->rank, pos, r->result});
  };
  for (int32_t i = 0; symbols[i].next >= 0; i = symbols[i].next) {
    push_pair(i, symbols[i].id, symbols[i + 1].id);
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.id < 0 || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // A stale entry: one of its symbols has changed since it was queued.
    const auto* current = find(left.id, right.id);
    if (current == nullptr || current->result != top.result) continue;
    left.id = top.result;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    right.id = -1;
    if (left.prev >= 0) push_pair(left.prev, symbols[left.prev].id, left.id);
    if (left.next >= 0) push_pair(top.pos, left.id, symbols[left.next].id);
  }
}

}  // namespace

void BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.size() == 1) {
    ids->push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (ignore_merges_) {
    auto it = word_ids_.find(std::string(word));
    if (it != word_ids_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const int32_t n = static_cast<int32_t>(word.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] =
        Symbol{byte_ids_[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  MergeSymbols(symbols, [this](int32_t left, int32_t right) { return Find(left, right); });
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

}  // namespace pd::model::internal
