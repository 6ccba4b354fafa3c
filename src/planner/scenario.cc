#include "planner/scenario.h"

#include <cstdio>
#include <memory>
#include <random>

#include "planner/hardware.h"
#include "planner/search.h"
#include "planner/simulator.h"

namespace pd::planner {
namespace {

// Instances of one deployment, and how many nodes and decode nodes it spans.
struct Layout {
  std::string name;
  std::vector<InstanceConfig> instances;
  int nodes = 0;
  int decode_nodes = 0;
  double rate_scale = 1.0;  // offered rate = rate_per_decode_node × decode_nodes × rate_scale
};

// Long prompts must fit one prefill step: no chunking, room for the longest prompt.
void WidenBatch(InstanceConfig* c, int max_prompt) {
  c->policy.max_num_batched_tokens = std::max(c->policy.max_num_batched_tokens, 4 * max_prompt);
}

Result<InstanceConfig> Make(const PlannerInputs& in, Role role, int tp, int node, int max_prompt) {
  ASSIGN_OR_RETURN(InstanceConfig c, MakeInstance(in, role, {tp, 1}, node));
  WidenBatch(&c, max_prompt);
  return c;
}

// 1 prefill TP8 node, then `decode_nodes` decode nodes: TP8 instances, or 8 DP ranks each.
Result<Layout> Disaggregated(const PlannerInputs& tp_in, const PlannerInputs& dp_in,
                             int decode_nodes, bool dp, int max_prompt) {
  Layout l;
  l.nodes = 1 + decode_nodes;
  l.decode_nodes = decode_nodes;
  const int per_node = tp_in.hw.devices_per_node;
  ASSIGN_OR_RETURN(InstanceConfig p, Make(tp_in, Role::kPrefill, per_node, 0, max_prompt));
  l.instances.push_back(p);
  for (int n = 1; n <= decode_nodes; ++n) {
    for (int r = 0; r < (dp ? per_node : 1); ++r) {
      ASSIGN_OR_RETURN(InstanceConfig d, dp ? Make(dp_in, Role::kDecode, 1, n, max_prompt)
                                            : Make(tp_in, Role::kDecode, per_node, n, max_prompt));
      l.instances.push_back(d);
    }
  }
  return l;
}

}  // namespace

std::vector<LengthPair> LongPromptChatLengths(int prompt_mean, int output_mean, int count,
                                              uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&rng](int mean) {
    const uint64_t lo = std::max(1, mean / 2), span = std::max(1, mean) + 1;
    return static_cast<int>(lo + rng() % span);
  };
  std::vector<LengthPair> out(count);
  for (auto& p : out) {
    p.prompt_len = uniform(prompt_mean);
    p.output_len = uniform(output_mean);
  }
  return out;
}

Result<std::vector<R1ScenarioRow>> RunR1Scenario(const R1ScenarioOptions& o) {
  if (o.prompt_mean < 2 || o.output_mean < 2 || !(o.rate_per_decode_node > 0) ||
      !(o.duration_s > 0)) {
    return InvalidArgument("R1 scenario: lengths must be >= 2, rate and duration positive");
  }
  PlannerInputs in;
  ASSIGN_OR_RETURN(in.shape, BuiltinModelShape(o.model));
  ASSIGN_OR_RETURN(in.hw, BuiltinHardware(o.hardware));
  if (!in.shape.is_moe())
    return InvalidArgument("R1 scenario: " + o.model + " is not an MoE model");
  const int per_node = in.hw.devices_per_node;
  const AnalyticalLatencyModel tp_model(in.shape, in.hw);
  in.model = in.colocated_model = &tp_model;
  PlannerInputs dp_in = in;
  const AnalyticalLatencyModel dp_model(in.shape, in.hw, MoeParallelism{per_node, 0.0});
  dp_in.model = &dp_model;
  dp_in.moe_dp = per_node;
  const int max_prompt = o.prompt_mean * 3 / 2 + 1;

  std::vector<Layout> layouts;
  {
    Layout l;
    l.name = "colocated TP8";
    l.nodes = l.decode_nodes = 1;
    ASSIGN_OR_RETURN(InstanceConfig c, Make(in, Role::kColocated, per_node, 0, max_prompt));
    l.instances.push_back(c);
    layouts.push_back(std::move(l));
  }
  ASSIGN_OR_RETURN(Layout pd, Disaggregated(in, dp_in, 3, false, max_prompt));
  pd.name = "1P:3D TP8";
  layouts.push_back(std::move(pd));
  ASSIGN_OR_RETURN(Layout pd_dp, Disaggregated(in, dp_in, 3, true, max_prompt));
  pd_dp.name = "1P:3D DP8 decode";
  layouts.push_back(std::move(pd_dp));
  ASSIGN_OR_RETURN(Layout rank, Disaggregated(in, dp_in, 1, true, max_prompt));
  rank.name = "1P:1D DP8, per rank";
  rank.rate_scale = per_node;  // the rate per DP rank, not per node
  layouts.push_back(std::move(rank));

  ClusterLinks links;
  links.intra_node_bw = in.hw.intra_node_bw;
  links.inter_node_bw = in.hw.inter_node_bw * per_node;
  links.kv_bytes_per_token = in.shape.KvBytesPerToken();
  const std::vector<LengthPair> lengths =
      LongPromptChatLengths(o.prompt_mean, o.output_mean, 1000, o.seed);
  SimOptions sim;
  sim.slo = o.slo;
  sim.first_token_on_decode = true;
  std::vector<R1ScenarioRow> rows;
  for (const Layout& l : layouts) {
    R1ScenarioRow row;
    row.deployment = l.name;
    row.nodes = l.nodes;
    row.rate_per_decode_node = o.rate_per_decode_node * l.rate_scale;
    row.rate = row.rate_per_decode_node * l.decode_nodes;
    ArrivalOptions a;
    a.num_requests = std::max(50, static_cast<int>(o.duration_s * row.rate));
    a.seed = o.seed;
    const std::vector<SimRequest> reqs = AtRate(MakeUnitRateWorkload(lengths, a), row.rate);
    ASSIGN_OR_RETURN(SimResult r, Simulate(l.instances, links, reqs, sim));
    row.summary = Summarize(r.requests, o.slo);
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string FormatR1Table(const std::vector<R1ScenarioRow>& rows, const R1ScenarioOptions& o) {
  auto per_s = [](double tpot_s) { return tpot_s > 0 ? 1.0 / tpot_s : 0.0; };
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "%-20s %5s %8s %9s %9s %9s %9s %9s %10s\n", "deployment",
                "nodes", "req/s", "req/s/DN", "tok/s/u", "tok/s/u", "TTFT p50", "TTFT p90",
                "attainment");
  out += line;
  std::snprintf(line, sizeof line, "%-20s %5s %8s %9s %9s %9s %9s %9s %10s\n", "", "", "", "",
                "p50", "p90 TPOT", "(ms)", "(ms)", "");
  out += line;
  for (const R1ScenarioRow& r : rows) {
    const Summary& s = r.summary;
    std::snprintf(line, sizeof line, "%-20s %5d %8.2f %9.2f %9.1f %9.1f %9.0f %9.0f %9.1f%%\n",
                  r.deployment.c_str(), r.nodes, r.rate, r.rate_per_decode_node,
                  per_s(s.tpot_p50_s), per_s(s.tpot_p90_s), s.ttft_p50_s * 1e3, s.ttft_p90_s * 1e3,
                  100 * s.attainment);
    out += line;
  }
  std::snprintf(line, sizeof line,
                "attainment: TTFT <= %.3g s and TPOT <= %.3g s (%.0f tokens/s per user)\n",
                o.slo.ttft_s, o.slo.tpot_s, 1.0 / o.slo.tpot_s);
  out += line;
  return out;
}

}  // namespace pd::planner
