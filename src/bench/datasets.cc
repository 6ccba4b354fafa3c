#include "bench/datasets.h"

#include <algorithm>
#include <cmath>

namespace pd::bench {

namespace {

int Clamp(double v, int hi) { return std::max(1, std::min(hi, static_cast<int>(std::lround(v)))); }

std::lognormal_distribution<double> LogNormal(const LogNormalSpec& s) {
  const double mu = std::log(s.median);
  const double sigma = std::sqrt(std::max(0.0, 2.0 * std::log(s.mean / s.median)));
  return std::lognormal_distribution<double>(mu, sigma);
}

}  // namespace

Result<LikeDistribution> LikeDatasetDistribution(const std::string& name) {
  if (name == "sharegpt-like") return LikeDistribution{{759, 680}, {186, 77}};
  if (name == "humaneval-like") return LikeDistribution{{171, 160}, {98, 90}};
  if (name == "longbench-like") return LikeDistribution{{1738, 1600}, {90, 80}};
  return InvalidArgument(
      "unknown dataset '" + name +
      "' (random | sharegpt-like | humaneval-like | longbench-like | prefix_repetition | "
      "multi_turn)");
}

Result<std::vector<LengthPair>> SampleLengths(const DatasetSpec& spec, int num_prompts,
                                              uint64_t seed) {
  if (num_prompts < 1) return InvalidArgument("--num-prompts must be at least 1");
  if (!(spec.length_scale > 0)) return InvalidArgument("--length-scale must be positive");
  std::mt19937_64 rng(seed);
  std::vector<LengthPair> out;
  out.reserve(num_prompts);
  if (spec.name == "random") {
    if (spec.random_input_len < 1 || spec.random_output_len < 1)
      return InvalidArgument("--random-input-len and --random-output-len must be at least 1");
    if (spec.random_range_ratio < 0 || spec.random_range_ratio >= 1)
      return InvalidArgument("--random-range-ratio must be in [0, 1)");
    std::uniform_real_distribution<double> u(1.0 - spec.random_range_ratio,
                                             1.0 + spec.random_range_ratio);
    for (int i = 0; i < num_prompts; ++i) {
      LengthPair p{Clamp(spec.random_input_len * u(rng), spec.max_prompt_len),
                   Clamp(spec.random_output_len * u(rng), spec.max_output_len)};
      out.push_back(p);
    }
  } else {
    ASSIGN_OR_RETURN(LikeDistribution d, LikeDatasetDistribution(spec.name));
    auto prompt = LogNormal(d.prompt);
    auto output = LogNormal(d.output);
    for (int i = 0; i < num_prompts; ++i) {
      out.push_back({Clamp(prompt(rng) * spec.length_scale, spec.max_prompt_len),
                     Clamp(output(rng) * spec.length_scale, spec.max_output_len)});
    }
  }
  for (LengthPair& p : out) {
    // Keep prompt + output within the server's context: shorten the prompt first.
    if (p.prompt_len + p.output_len > spec.max_total_len) {
      p.output_len = std::max(1, std::min(p.output_len, spec.max_total_len / 2));
      p.prompt_len = std::max(1, spec.max_total_len - p.output_len);
    }
  }
  return out;
}

std::vector<int32_t> SyntheticPromptIds(int length, std::mt19937_64& rng, int first_id, int range) {
  std::uniform_int_distribution<int> d(first_id, first_id + range - 1);
  std::vector<int32_t> ids(length);
  for (auto& id : ids) id = d(rng);
  return ids;
}

std::string SyntheticPromptText(int length, std::mt19937_64& rng) {
  static const char* kWords[] = {"the",    "time",  "people",  "way",  "day",   "man",
                                 "thing",  "world", "life",    "hand", "part",  "child",
                                 "eye",    "place", "work",    "week", "case",  "point",
                                 "number", "group", "problem", "fact", "water", "story"};
  std::uniform_int_distribution<size_t> d(0, std::size(kWords) - 1);
  std::string text;
  for (int i = 0; i < length; ++i) {
    if (i) text += ' ';
    text += kWords[d(rng)];
  }
  return text;
}

std::vector<double> ArrivalTimes(int n, double request_rate, double burstiness, uint64_t seed) {
  std::vector<double> times(n, 0.0);
  if (!(request_rate > 0) || std::isinf(request_rate)) return times;
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  // Gamma(shape = burstiness, scale = 1 / (rate * burstiness)) has mean 1 / rate.
  std::gamma_distribution<double> gap(burstiness, 1.0 / (request_rate * burstiness));
  double t = 0;
  for (int i = 0; i < n; ++i) {
    times[i] = t;
    t += gap(rng);
  }
  return times;
}

}  // namespace pd::bench
