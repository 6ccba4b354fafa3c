#include "bench/workloads.h"

#include <algorithm>
#include <random>
#include <string>

#include "bench/datasets.h"

namespace pd::bench {
namespace {

bool IsChat(const GenerationRequest& r) { return r.path.find("chat") != std::string::npos; }

Status OutOfRange(const char* flag, int value, const std::string& want) {
  return InvalidArgument(std::string(flag) + " must be " + want + ", got " + std::to_string(value));
}

}  // namespace

Result<std::vector<GenerationRequest>> PrefixRepetitionRequests(const PrefixRepetitionSpec& spec,
                                                                int num_prompts, uint64_t seed,
                                                                int max_total_len,
                                                                const GenerationRequest& base) {
  if (spec.prefix_len < 0)
    return OutOfRange("--prefix-repetition-prefix-len", spec.prefix_len, ">= 0");
  if (spec.suffix_len < 0)
    return OutOfRange("--prefix-repetition-suffix-len", spec.suffix_len, ">= 0");
  if (spec.prefix_len + spec.suffix_len < 1)
    return InvalidArgument(
        "--prefix-repetition-prefix-len + --prefix-repetition-suffix-len must be >= 1");
  if (spec.num_prefixes < 1)
    return OutOfRange("--prefix-repetition-num-prefixes", spec.num_prefixes, ">= 1");
  if (spec.output_len < 1)
    return OutOfRange("--prefix-repetition-output-len", spec.output_len, ">= 1");
  const int total = spec.prefix_len + spec.suffix_len + spec.output_len;
  if (total > max_total_len)
    return InvalidArgument(
        "prefix_repetition: prefix + suffix + output = " + std::to_string(total) +
        " tokens exceeds the server's limit of " + std::to_string(max_total_len));
  std::mt19937_64 rng(seed * 7919 + 3);
  const bool chat = IsChat(base);
  std::vector<std::vector<int32_t>> prefix_ids(spec.num_prefixes);
  std::vector<std::string> prefix_text(spec.num_prefixes);
  for (int k = 0; k < spec.num_prefixes; ++k) {
    if (chat) {
      prefix_text[k] = SyntheticPromptText(spec.prefix_len, rng);
    } else {
      prefix_ids[k] = SyntheticPromptIds(spec.prefix_len, rng);
    }
  }
  std::vector<GenerationRequest> out;
  out.reserve(num_prompts);
  for (int i = 0; i < num_prompts; ++i) {
    const int k = i % spec.num_prefixes;
    GenerationRequest r = base;
    r.prompt_len = spec.prefix_len + spec.suffix_len;
    r.max_tokens = spec.output_len;
    if (chat) {
      const std::string suffix = SyntheticPromptText(spec.suffix_len, rng);
      r.prompt_text =
          prefix_text[k] + (prefix_text[k].empty() || suffix.empty() ? "" : " ") + suffix;
    } else {
      r.prompt_ids = prefix_ids[k];
      const std::vector<int32_t> suffix = SyntheticPromptIds(spec.suffix_len, rng);
      r.prompt_ids.insert(r.prompt_ids.end(), suffix.begin(), suffix.end());
    }
    out.push_back(std::move(r));
  }
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

Result<std::vector<GenerationRequest>> MultiTurnRequests(const MultiTurnSpec& spec, int num_prompts,
                                                         uint64_t seed, int max_total_len,
                                                         const GenerationRequest& base) {
  if (spec.num_turns < 1) return OutOfRange("--multi-turn-num-turns", spec.num_turns, ">= 1");
  if (spec.user_len < 1) return OutOfRange("--multi-turn-user-len", spec.user_len, ">= 1");
  if (spec.output_len < 1) return OutOfRange("--multi-turn-output-len", spec.output_len, ">= 1");
  // A chat template adds a few tokens around each message: 16 a turn leaves them room.
  const int per_turn = spec.user_len + spec.output_len + (IsChat(base) ? 16 : 1);
  const int64_t total = int64_t{per_turn} * spec.num_turns;
  if (total > max_total_len)
    return InvalidArgument("multi_turn: a conversation's last turn needs about " +
                           std::to_string(total) + " tokens, over the server's limit of " +
                           std::to_string(max_total_len) +
                           " (lower --multi-turn-num-turns, --multi-turn-user-len or "
                           "--multi-turn-output-len)");
  std::mt19937_64 rng(seed * 7919 + 5);
  std::vector<GenerationRequest> out;
  out.reserve(num_prompts);
  for (int i = 0; i < num_prompts; ++i) {
    GenerationRequest r = base;
    r.conversation = i / spec.num_turns;
    r.turn = i % spec.num_turns;
    r.prompt_text = SyntheticPromptText(spec.user_len, rng);
    r.prompt_len = (r.turn + 1) * spec.user_len + r.turn * spec.output_len;  // the server says
    r.max_tokens = spec.output_len;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace pd::bench
