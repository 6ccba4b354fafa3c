#include "constrain/nfa.h"

#include <deque>

namespace pd::constrain {
namespace {

int EncodedLength(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void Encode(uint32_t cp, uint8_t* out) {
  const int n = EncodedLength(cp);
  if (n == 1) {
    out[0] = static_cast<uint8_t>(cp);
    return;
  }
  for (int i = n - 1; i > 0; --i) {
    out[i] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    cp >>= 6;
  }
  out[0] = static_cast<uint8_t>((0xF00 >> n) | cp);  // 110xxxxx, 1110xxxx, 11110xxx
}

void Split(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>* out) {
  if (lo > hi) return;
  for (uint32_t boundary : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= boundary && hi > boundary) {
      Split(lo, boundary, out);
      Split(boundary + 1, hi, out);
      return;
    }
  }
  const int n = EncodedLength(lo);
  // Until the range covers whole blocks of continuation bytes, cut off its ragged ends.
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) == (hi & ~m)) continue;
    if ((lo & m) != 0) {
      Split(lo, lo | m, out);
      Split((lo | m) + 1, hi, out);
      return;
    }
    if ((hi & m) != m) {
      Split(lo, (hi & ~m) - 1, out);
      Split(hi & ~m, hi, out);
      return;
    }
  }
  uint8_t a[4], b[4];
  Encode(lo, a);
  Encode(hi, b);
  ByteRangeSeq seq;
  for (int i = 0; i < n; ++i) seq.push_back({a[i], b[i]});
  out->push_back(std::move(seq));
}

class Compiler {
 public:
  Result<Nfa> Run(const RegexNode& root) {
    nfa_.match = Add({NfaState::Kind::kMatch});
    ASSIGN_OR_RETURN(nfa_.start, Compile(root, nfa_.match));
    ComputeDistances();
    return std::move(nfa_);
  }

 private:
  int32_t Add(NfaState s) {
    nfa_.states.push_back(s);
    return static_cast<int32_t>(nfa_.states.size() - 1);
  }
  int32_t Split(int32_t a, int32_t b) { return Add({NfaState::Kind::kSplit, 0, 0, a, b}); }

  Status CheckSize() const {
    if (nfa_.states.size() > static_cast<size_t>(kMaxNfaStates))
      return InvalidArgument("regex: the automaton would exceed " + std::to_string(kMaxNfaStates) +
                             " states (lower the repetition bounds or lengths)");
    return OkStatus();
  }

  // Returns the state that matches `node`, then continues at `next`.
  Result<int32_t> Compile(const RegexNode& node, int32_t next) {
    RETURN_IF_ERROR(CheckSize());
    switch (node.kind) {
      case RegexNode::Kind::kEmpty:
        return next;
      case RegexNode::Kind::kClass:
        return CompileClass(node, next);
      case RegexNode::Kind::kConcat:
        for (auto it = node.children.rbegin(); it != node.children.rend(); ++it) {
          ASSIGN_OR_RETURN(next, Compile(*it, next));
        }
        return next;
      case RegexNode::Kind::kAlt: {
        int32_t first = -1;
        for (auto it = node.children.rbegin(); it != node.children.rend(); ++it) {
          ASSIGN_OR_RETURN(int32_t s, Compile(*it, next));
          first = first < 0 ? s : Split(s, first);
        }
        return first < 0 ? next : first;
      }
      case RegexNode::Kind::kRepeat:
        return CompileRepeat(node, next);
    }
    return next;
  }

  Result<int32_t> CompileRepeat(const RegexNode& node, int32_t next) {
    const RegexNode& child = node.children[0];
    int32_t cur = next;
    if (node.max < 0) {  // child*: a split that loops through child back to itself
      const int32_t loop = Split(-1, next);
      ASSIGN_OR_RETURN(int32_t body, Compile(child, loop));
      nfa_.states[loop].next = body;
      cur = loop;
    } else {  // (child (child (...)?)?)? for the optional copies
      for (int i = node.min; i < node.max; ++i) {
        ASSIGN_OR_RETURN(int32_t body, Compile(child, cur));
        cur = Split(body, next);
      }
    }
    for (int i = 0; i < node.min; ++i) {
      ASSIGN_OR_RETURN(cur, Compile(child, cur));
    }
    return cur;
  }

  Result<int32_t> CompileClass(const RegexNode& node, int32_t next) {
    int32_t first = -1;
    for (const auto& [lo, hi] : node.ranges) {
      for (const ByteRangeSeq& seq : Utf8Sequences(lo, hi)) {
        int32_t s = next;
        for (auto it = seq.rbegin(); it != seq.rend(); ++it)
          s = Add({NfaState::Kind::kByte, it->first, it->second, s, -1});
        first = first < 0 ? s : Split(s, first);
      }
    }
    if (first < 0) return Add({NfaState::Kind::kByte, 1, 0, next, -1});  // the empty class
    return first;
  }

  // A 0-1 breadth-first search backwards from the match state: byte moves cost 1, splits 0.
  void ComputeDistances() {
    const size_t n = nfa_.states.size();
    std::vector<int32_t> offsets(n + 1, 0), edges;
    auto for_each_edge = [&](auto&& fn) {
      for (size_t s = 0; s < n; ++s) {
        const NfaState& st = nfa_.states[s];
        if (st.kind == NfaState::Kind::kByte && st.lo <= st.hi) fn(st.next, s);
        if (st.kind == NfaState::Kind::kSplit) {
          fn(st.next, s);
          if (st.alt >= 0) fn(st.alt, s);
        }
      }
    };
    for_each_edge([&](int32_t to, size_t) { ++offsets[to + 1]; });
    for (size_t i = 0; i < n; ++i) offsets[i + 1] += offsets[i];
    edges.resize(offsets[n]);
    std::vector<int32_t> fill(offsets.begin(), offsets.end() - 1);
    for_each_edge([&](int32_t to, size_t from) { edges[fill[to]++] = static_cast<int32_t>(from); });
    nfa_.distance.assign(n, kUnreachable);
    std::deque<int32_t> queue{nfa_.match};
    nfa_.distance[nfa_.match] = 0;
    while (!queue.empty()) {
      const int32_t s = queue.front();
      queue.pop_front();
      for (int32_t e = offsets[s]; e < offsets[s + 1]; ++e) {
        const int32_t from = edges[e];
        const bool byte = nfa_.states[from].kind == NfaState::Kind::kByte;
        const uint32_t d = nfa_.distance[s] + (byte ? 1 : 0);
        if (d >= nfa_.distance[from]) continue;
        nfa_.distance[from] = d;
        if (byte) {
          queue.push_back(from);
        } else {
          queue.push_front(from);
        }
      }
    }
  }

  Nfa nfa_;
};

}  // namespace

std::vector<ByteRangeSeq> Utf8Sequences(uint32_t lo, uint32_t hi) {
  std::vector<ByteRangeSeq> out;
  Split(lo, hi, &out);
  return out;
}

Result<Nfa> CompileNfa(const RegexNode& root) { return Compiler().Run(root); }

}  // namespace pd::constrain
