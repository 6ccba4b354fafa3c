// Synthetic workloads for `pdserve bench`: prompt and output lengths drawn from distributions
// matching published dataset statistics, and request arrival times.
//
// Where the numbers come from:
//  - random: --random-input-len / --random-output-len, each scaled by U[1-r, 1+r] with
//    r = --random-range-ratio (vLLM's random dataset).
//  - sharegpt-like: log-normal fits to DistServe's ShareGPT sample for OPT-13B (1600 pairs,
//    data/distserve/sharegpt-opt13b-lengths.csv): prompt mean 759 / median 680 tokens,
//    output mean 186 / median 77 (DistServe, OSDI'24, chatbot workload).
//  - humaneval-like: log-normal with DistServe's reported HumanEval averages (code completion):
//    prompt mean ~171, output mean ~98 tokens, narrow spread.
//  - longbench-like: log-normal with DistServe's reported LongBench averages (summarization):
//    prompt mean ~1738, output mean ~90 tokens.
// The "-like" figures for HumanEval and LongBench are the papers' averages, not samples of the
// datasets; every length is multiplied by --length-scale and clamped to [1, max].
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"

namespace pd::bench {

struct LengthPair {
  int prompt_len = 0;
  int output_len = 0;
};

// A log-normal distribution given by its mean and median (median = e^mu, mean = e^(mu+s^2/2)).
struct LogNormalSpec {
  double mean = 0;
  double median = 0;
};

struct DatasetSpec {
  std::string name;  // random | sharegpt-like | humaneval-like | longbench-like
  int random_input_len = 1024;
  int random_output_len = 128;
  double random_range_ratio = 0.0;
  double length_scale = 1.0;
  int max_prompt_len = 1 << 20;  // clamp (e.g. max_model_len - 1)
  int max_output_len = 1 << 20;
  int max_total_len = 1 << 20;  // prompt + output (the server's max_model_len)
};

// The distributions of the three "-like" datasets: {prompt, output}.
struct LikeDistribution {
  LogNormalSpec prompt;
  LogNormalSpec output;
};
Result<LikeDistribution> LikeDatasetDistribution(const std::string& name);

// num_prompts length pairs, deterministic for a seed. InvalidArgument for an unknown dataset.
Result<std::vector<LengthPair>> SampleLengths(const DatasetSpec& spec, int num_prompts,
                                              uint64_t seed);

// Prompt token ids of a given length (ids in [first_id, first_id + range)), deterministic.
std::vector<int32_t> SyntheticPromptIds(int length, std::mt19937_64& rng, int first_id = 32,
                                        int range = 200);
// Prompt text of about `length` tokens (common words) for chat requests.
std::string SyntheticPromptText(int length, std::mt19937_64& rng);

// Arrival offsets in seconds from the start: gamma-distributed gaps with shape = burstiness and
// mean 1/request_rate (burstiness 1: Poisson). request_rate <= 0 or inf: everything at 0.
std::vector<double> ArrivalTimes(int n, double request_rate, double burstiness, uint64_t seed);

}  // namespace pd::bench
