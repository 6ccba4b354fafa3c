// `pdserve validate-sim`: the cluster simulator against the real system on this machine.
//
// `pdserve up` (1 prefill + 1 decode instance, each pinned to its own core, traced) runs as a
// child process. Probe sets (three before the first round, one after each) calibrate the latency
// model (validate_probes.h) and fix the SLOs and the compared rates (20/40/60% of the calibrated
// capacity unless given). An uncompared load run (300 requests at the highest rate), then per
// round and rate an uncompared calibration run (CalRunPrompts requests, its own seed) and the
// compared bench run (the same seed every round). After the rounds the traces are read: each
// calibration run gives the figures only load shows (validate_calibration.h: the prefill and
// decode steps' stretch, the decode co-run factor and step-by-step slowness, the prefill loop
// gap, the KV hand-over point, the latency outside the engines per request), and each compared
// round is simulated with the calibration run just before it (the paired rule; a figure that run
// lacks, the load run's). Per rate and metric, the median over the rounds of the simulated
// figures stands beside the median of the measured ones.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace pd::planner {

struct ValidateSimOptions {
  std::string model;
  std::string profile;        // latency model from `pdserve profile`; "": a quick profile here
  int threads = 1;            // compute threads per instance
  std::vector<double> rates;  // empty: 20/40/60% of the calibrated capacity
  int port = 8700;            // the router's; the instances take the next two
  uint64_t seed = 1;
  int input_len = 128, output_len = 32;  // the random dataset
  double range_ratio = 0.5;
  int max_prompts = 300;  // requests per round and rate at most (60 s of arrivals)
  int rounds = 5;
  bool corun = true;        // measure and simulate the instances slowing each other down
  double ttft_slo_s = 0.0;  // 0: 3x the idle TTFT of a mean prompt
  double tpot_slo_s = 0.0;  // 0: the TPOT of the batch-8 decode probe
  int max_num_seqs = 64, max_num_batched_tokens = 512;
  std::string matmul = "f32";  // the instances' --matmul
  bool pin_cores = true;
  std::string trace = "/tmp/pdserve-validate-sim-trace.json";  // `pdserve up --trace`
  std::string up_log = "/tmp/pdserve-validate-sim-up.log";
  std::string out;  // also the comparison as JSON
};

// Runs the whole comparison, printing it; InvalidArgument on bad options, else the first failure.
Status RunValidateSim(const ValidateSimOptions& o);

}  // namespace pd::planner
