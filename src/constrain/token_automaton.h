// A regular language as an engine::OutputConstraint: the NFA (nfa.h) determinised lazily into a
// byte-level DFA, one state per set of NFA states actually reached, and for each DFA state a
// request reaches, the mask of the vocabulary's tokens that may follow (one walk of the
// vocabulary's trie through the DFA), cached. A request's ConstraintState is one DFA state id, so
// it copies freely (speculative decoding's position-by-position check clones it).
//
// Bounds: at most kMaxDfaStates DFA states per automaton (a move that would create one more leads
// nowhere, so the sampler lets the constraint go, see sampler.h) and kMaxMaskBytes of cached masks
// (beyond it a state's mask is not cached: the sampler asks token by token).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "constrain/nfa.h"
#include "engine/output_constraint.h"

namespace pd::constrain {

// The vocabulary's token bytes as a trie (tokens that write no text, or nothing, left out).
// Thread safety: immutable once built.
class VocabTrie {
 public:
  explicit VocabTrie(const engine::TokenTexts& texts);
  struct Node {
    int32_t first_edge = 0;  // edges_[first_edge, first_edge + num_edges)
    int32_t num_edges = 0;
    int32_t first_token = 0;  // token_ids_[first_token, first_token + num_tokens): end here
    int32_t num_tokens = 0;
  };
  struct Edge {
    uint8_t byte = 0;
    int32_t child = 0;
  };
  const std::vector<Node>& nodes() const { return nodes_; }  // nodes_[0]: the root
  const std::vector<Edge>& edges() const { return edges_; }
  const std::vector<int32_t>& token_ids() const { return token_ids_; }
  int vocab_size() const { return vocab_size_; }

 private:
  int32_t Build(const std::vector<const std::string*>& bytes, const std::vector<int32_t>& ids,
                size_t begin, size_t end, size_t depth);

  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  std::vector<int32_t> token_ids_;
  int vocab_size_ = 0;
};

// Thread safety: thread-safe; the lazily built DFA and masks are guarded by mu_.
class TokenAutomaton final : public engine::OutputConstraint {
 public:
  static constexpr int32_t kDead = -1;
  static constexpr int kMaxDfaStates = 1 << 16;
  static constexpr size_t kMaxMaskBytes = size_t{64} << 20;

  static Result<std::shared_ptr<const TokenAutomaton>> Create(
      const RegexNode& regex, std::shared_ptr<const engine::TokenTexts> texts,
      std::shared_ptr<const VocabTrie> trie);

  std::unique_ptr<engine::ConstraintState> Start() const override;

  struct StateInfo {
    size_t distance = engine::ConstraintState::kNever;  // fewest bytes to a whole sentence
    bool accepting = false;
    bool has_exit = false;  // some byte leads to a live state
  };
  int32_t start_state() const { return start_; }
  // The state after `bytes` from `state`; kDead when they cannot follow.
  int32_t Walk(int32_t state, std::string_view bytes) const;
  StateInfo Info(int32_t state) const;
  // The tokens that may follow `state`; null when the mask budget is spent.
  const engine::TokenMask* Mask(int32_t state) const;
  int num_states() const;

 private:
  TokenAutomaton(Nfa nfa, std::shared_ptr<const engine::TokenTexts> texts,
                 std::shared_ptr<const VocabTrie> trie);
  int32_t NextLocked(int32_t state, uint8_t byte) const REQUIRES(mu_);
  // The DFA state of the empty-move closure of `seeds`, made when new.
  int32_t StateForLocked(const std::vector<int32_t>& seeds) const REQUIRES(mu_);
  std::unique_ptr<engine::TokenMask> ComputeMaskLocked(int32_t state) const REQUIRES(mu_);

  const Nfa nfa_;
  const std::shared_ptr<const VocabTrie> trie_;
  int32_t start_ = kDead;

  mutable Mutex mu_;
  struct DfaState {
    std::vector<int32_t> nfa_states;  // sorted: the byte and match states of the set
    StateInfo info;
    std::array<int32_t, 256> next;  // kUnknown until computed
    std::unique_ptr<engine::TokenMask> mask;
  };
  mutable std::vector<std::unique_ptr<DfaState>> states_ GUARDED_BY(mu_);
  mutable std::unordered_map<std::string, int32_t> ids_ GUARDED_BY(mu_);  // key: nfa_states
  mutable size_t mask_bytes_ GUARDED_BY(mu_) = 0;
  mutable std::vector<uint32_t> mark_ GUARDED_BY(mu_);  // (nfa states) closure scratch
  mutable uint32_t stamp_ GUARDED_BY(mu_) = 0;
};

}  // namespace pd::constrain
