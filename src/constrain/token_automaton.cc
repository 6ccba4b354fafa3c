#include "constrain/token_automaton.h"

#include <algorithm>
#include <numeric>

namespace pd::constrain {
namespace {

constexpr int32_t kUnknown = -2;

// One request's DFA state. Thread safety: not thread-safe; the request's sampler owns it.
class AutomatonState final : public engine::ConstraintState {
 public:
  AutomatonState(const TokenAutomaton* automaton, int32_t state)
      : automaton_(automaton), state_(state), info_(automaton->Info(state)) {}

  std::unique_ptr<ConstraintState> Clone() const override {
    return std::make_unique<AutomatonState>(*this);
  }
  bool Allows(std::string_view bytes) const override {
    return automaton_->Walk(state_, bytes) != TokenAutomaton::kDead;
  }
  size_t CompletionBytesAfter(std::string_view bytes) const override {
    const int32_t next = automaton_->Walk(state_, bytes);
    return next == TokenAutomaton::kDead ? kNever : automaton_->Info(next).distance;
  }
  void Advance(std::string_view bytes) override {
    state_ = automaton_->Walk(state_, bytes);
    info_ = automaton_->Info(state_);
  }
  bool complete() const override { return info_.accepting && !info_.has_exit; }
  bool accepting() const override { return info_.accepting; }
  const engine::TokenMask* AllowedTokens() const override { return automaton_->Mask(state_); }

 private:
  const TokenAutomaton* automaton_;
  int32_t state_;
  TokenAutomaton::StateInfo info_;
};

}  // namespace

VocabTrie::VocabTrie(const engine::TokenTexts& texts) : vocab_size_(texts.size()) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < texts.size(); ++id) {
    if (texts.writes[id] && !texts.bytes[id].empty()) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return texts.bytes[a] < texts.bytes[b] || (texts.bytes[a] == texts.bytes[b] && a < b);
  });
  std::vector<const std::string*> bytes;
  for (int32_t id : ids) bytes.push_back(&texts.bytes[id]);
  Build(bytes, ids, 0, ids.size(), 0);
}

// The node for the sorted tokens [begin, end), which share their first `depth` bytes.
int32_t VocabTrie::Build(const std::vector<const std::string*>& bytes,
                         const std::vector<int32_t>& ids, size_t begin, size_t end, size_t depth) {
  const auto self = static_cast<int32_t>(nodes_.size());
  nodes_.push_back({});
  nodes_[self].first_token = static_cast<int32_t>(token_ids_.size());
  while (begin < end && bytes[begin]->size() == depth) token_ids_.push_back(ids[begin++]);
  nodes_[self].num_tokens = static_cast<int32_t>(token_ids_.size()) - nodes_[self].first_token;
  // Children are built after this node's edges are reserved, so its edges stay contiguous.
  std::vector<std::pair<uint8_t, std::pair<size_t, size_t>>> groups;
  for (size_t i = begin; i < end;) {
    const auto b = static_cast<uint8_t>((*bytes[i])[depth]);
    size_t j = i;
    while (j < end && static_cast<uint8_t>((*bytes[j])[depth]) == b) ++j;
    groups.push_back({b, {i, j}});
    i = j;
  }
  nodes_[self].first_edge = static_cast<int32_t>(edges_.size());
  nodes_[self].num_edges = static_cast<int32_t>(groups.size());
  edges_.resize(edges_.size() + groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const int32_t child =
        Build(bytes, ids, groups[g].second.first, groups[g].second.second, depth + 1);
    edges_[nodes_[self].first_edge + g] = {groups[g].first, child};
  }
  return self;
}

TokenAutomaton::TokenAutomaton(Nfa nfa, std::shared_ptr<const engine::TokenTexts> texts,
                               std::shared_ptr<const VocabTrie> trie)
    : OutputConstraint(std::move(texts)), nfa_(std::move(nfa)), trie_(std::move(trie)) {}

Result<std::shared_ptr<const TokenAutomaton>> TokenAutomaton::Create(
    const RegexNode& regex, std::shared_ptr<const engine::TokenTexts> texts,
    std::shared_ptr<const VocabTrie> trie) {
  if (texts == nullptr || trie == nullptr || trie->vocab_size() != texts->size())
    return InvalidArgument("token automaton: token texts and their trie are required");
  ASSIGN_OR_RETURN(Nfa nfa, CompileNfa(regex));
  std::shared_ptr<TokenAutomaton> a(
      new TokenAutomaton(std::move(nfa), std::move(texts), std::move(trie)));
  {
    MutexLock lock(&a->mu_);
    a->mark_.assign(a->nfa_.states.size(), 0);
    a->start_ = a->StateForLocked({a->nfa_.start});
  }
  return std::shared_ptr<const TokenAutomaton>(std::move(a));
}

std::unique_ptr<engine::ConstraintState> TokenAutomaton::Start() const {
  return std::make_unique<AutomatonState>(this, start_);
}

int32_t TokenAutomaton::StateForLocked(const std::vector<int32_t>& seeds) const {
  if (++stamp_ == 0) {  // wrapped: forget every old mark
    std::fill(mark_.begin(), mark_.end(), 0);
    stamp_ = 1;
  }
  std::vector<int32_t> stack = seeds, set;
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    if (mark_[s] == stamp_ || nfa_.distance[s] == kUnreachable) continue;
    mark_[s] = stamp_;
    const NfaState& st = nfa_.states[s];
    if (st.kind == NfaState::Kind::kSplit) {
      if (st.alt >= 0) stack.push_back(st.alt);
      stack.push_back(st.next);
    } else {
      set.push_back(s);
    }
  }
  if (set.empty()) return kDead;
  std::sort(set.begin(), set.end());
  std::string key(reinterpret_cast<const char*>(set.data()), set.size() * sizeof(int32_t));
  auto it = ids_.find(key);
  if (it != ids_.end()) return it->second;
  if (states_.size() >= static_cast<size_t>(kMaxDfaStates)) return kDead;
  auto state = std::make_unique<DfaState>();
  state->next.fill(kUnknown);
  for (int32_t s : set) {
    const NfaState& st = nfa_.states[s];
    state->info.distance = std::min<size_t>(state->info.distance, nfa_.distance[s]);
    if (st.kind == NfaState::Kind::kMatch) state->info.accepting = true;
    if (st.kind == NfaState::Kind::kByte && st.lo <= st.hi &&
        nfa_.distance[st.next] != kUnreachable) {
      state->info.has_exit = true;
    }
  }
  state->nfa_states = std::move(set);
  const auto id = static_cast<int32_t>(states_.size());
  states_.push_back(std::move(state));
  ids_.emplace(std::move(key), id);
  return id;
}

int32_t TokenAutomaton::NextLocked(int32_t state, uint8_t byte) const {
  if (state == kDead) return kDead;
  int32_t next = states_[state]->next[byte];
  if (next != kUnknown) return next;
  std::vector<int32_t> seeds;
  for (int32_t s : states_[state]->nfa_states) {
    const NfaState& st = nfa_.states[s];
    if (st.kind == NfaState::Kind::kByte && st.lo <= byte && byte <= st.hi)
      seeds.push_back(st.next);
  }
  next = seeds.empty() ? kDead : StateForLocked(seeds);
  // A move refused only for want of room is not remembered: the same byte is tried again later.
  if (next != kDead || seeds.empty() || states_.size() < static_cast<size_t>(kMaxDfaStates))
    states_[state]->next[byte] = next;
  return next;
}

int32_t TokenAutomaton::Walk(int32_t state, std::string_view bytes) const {
  MutexLock lock(&mu_);
  for (char c : bytes) {
    state = NextLocked(state, static_cast<uint8_t>(c));
    if (state == kDead) break;
  }
  return state;
}

TokenAutomaton::StateInfo TokenAutomaton::Info(int32_t state) const {
  if (state == kDead) return {};
  MutexLock lock(&mu_);
  return states_[state]->info;
}

int TokenAutomaton::num_states() const {
  MutexLock lock(&mu_);
  return static_cast<int>(states_.size());
}

const engine::TokenMask* TokenAutomaton::Mask(int32_t state) const {
  if (state == kDead) return nullptr;
  MutexLock lock(&mu_);
  DfaState& s = *states_[state];
  if (s.mask != nullptr) return s.mask.get();
  const size_t bytes = (static_cast<size_t>(trie_->vocab_size()) + 63) / 64 * sizeof(uint64_t);
  if (mask_bytes_ + bytes > kMaxMaskBytes) return nullptr;
  s.mask = ComputeMaskLocked(state);
  mask_bytes_ += bytes;
  return s.mask.get();
}

// One depth-first walk of the vocabulary trie through the DFA: a subtree is skipped as soon as its
// prefix leads nowhere, so the cost is the trie nodes whose prefixes can follow, not the vocab.
std::unique_ptr<engine::TokenMask> TokenAutomaton::ComputeMaskLocked(int32_t state) const {
  auto mask = std::make_unique<engine::TokenMask>();
  mask->bits.assign((static_cast<size_t>(trie_->vocab_size()) + 63) / 64, 0);
  const auto& nodes = trie_->nodes();
  const auto& edges = trie_->edges();
  const auto& ids = trie_->token_ids();
  if (nodes.empty()) return mask;
  std::vector<std::pair<int32_t, int32_t>> stack;  // (trie node, DFA state)
  const VocabTrie::Node& root = nodes[0];
  for (int32_t e = root.first_edge; e < root.first_edge + root.num_edges; ++e)
    stack.push_back({edges[e].child, NextLocked(state, edges[e].byte)});
  while (!stack.empty()) {
    auto [node_id, s] = stack.back();
    stack.pop_back();
    if (s == kDead) continue;
    const VocabTrie::Node& node = nodes[node_id];
    for (int32_t t = node.first_token; t < node.first_token + node.num_tokens; ++t)
      mask->bits[ids[t] / 64] |= uint64_t{1} << (ids[t] % 64);
    for (int32_t e = node.first_edge; e < node.first_edge + node.num_edges; ++e)
      stack.push_back({edges[e].child, NextLocked(s, edges[e].byte)});
  }
  return mask;
}

}  // namespace pd::constrain
