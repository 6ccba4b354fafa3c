// `pdserve validate-sim`'s command-line flags, shared by its calibration and report code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pd::apps::validate_sim {

struct ValidateFlags {
  std::string model;
  std::string profile;  // "" : profile here (--quick)
  int threads = 1;
  std::vector<double> rates;  // empty: 20%, 40%, 60% of the calibrated capacity
  int port = 8700;
  uint64_t seed = 1;
  int input_len = 128;
  int output_len = 32;
  double range_ratio = 0.5;
  double seconds_per_rate = 60.0;
  int max_prompts = 300;
  // Bench rounds per rate (same seed): the measured side is their median, and under the paired
  // rule the simulated side the median of as many simulations. Five, not three: over 9 runs
  // (2026-11-30 23:46 - 2026-12-01 00:49) 126 of 135 cells within 10% and all 15 in 5 runs,
  // where the same runs' rounds taken three at a time gave 13.1 cells a run and all 15 in 30%.
  int rounds = 5;
  int sampling_seeds = 8;   // reseeded simulations per rate: the spread a workload's sample gives
  int corun_pairs = 3;      // per probe set
  double ttft_slo_s = 0.0;  // 0: 3x the idle TTFT of a mean prompt
  double tpot_slo_s = 0.0;  // 0: 2x the idle TPOT
  int max_num_seqs = 64;
  int max_num_batched_tokens = 512;
  std::string matmul = "f32";  // the instances' and the profile's --matmul
  bool pin_cores = true;
  bool corun = true;  // measure and simulate the instances slowing each other down
  std::string out;
  std::string up_log = "/tmp/pdserve-validate-sim-up.log";
  // `pdserve up --trace FILE`: the instances' Chrome traces; the decode instance's steps in the
  // bench rounds are then printed beside the calibrated simulation's, per batch size.
  std::string trace;
};

}  // namespace pd::apps::validate_sim
