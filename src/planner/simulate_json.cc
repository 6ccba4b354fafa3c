#include "planner/simulate_json.h"

#include <nlohmann/json.hpp>

namespace pd::planner {
namespace {

using json = nlohmann::ordered_json;

// A summary under the bench's names: attainment shares, latencies in milliseconds.
json SummaryJson(const Summary& s) {
  json j;
  j["num_requests"] = s.num_requests;
  j["failed"] = s.num_failed;
  j["attainment"] = {
      {"ttft", s.ttft_attainment}, {"tpot", s.tpot_attainment}, {"both", s.attainment}};
  j["p50_ttft_ms"] = 1e3 * s.ttft_p50_s;
  j["p90_ttft_ms"] = 1e3 * s.ttft_p90_s;
  j["mean_ttft_ms"] = 1e3 * s.ttft_mean_s;
  j["p50_tpot_ms"] = 1e3 * s.tpot_p50_s;
  j["p90_tpot_ms"] = 1e3 * s.tpot_p90_s;
  j["mean_tpot_ms"] = 1e3 * s.tpot_mean_s;
  return j;
}

json Header(const char* mode, const PlannerInputs& in) {
  json j;
  j["schema"] = "pdserve-simulate-v1";
  j["mode"] = mode;
  j["model"] = in.shape.name;
  j["hardware"] = in.hw.name;
  j["slo_ms"] = {{"ttft", 1e3 * in.slo.ttft_s}, {"tpot", 1e3 * in.slo.tpot_s}};
  j["attainment_target"] = in.attainment;
  return j;
}

}  // namespace

std::string SimulatedRatesToJson(const SimulatedRates& r, const PlannerInputs& in) {
  json j = Header("rates", in);
  j["deployment"] = r.deployment;
  j["disaggregated"] = r.disaggregated;
  j["latency_model"] = r.latency_model;
  j["num_requests"] = in.arrivals.num_requests;
  j["rates"] = json::array();
  for (const SimulatedRate& p : r.rates) {
    json e;
    e["request_rate"] = p.rate;
    e.update(SummaryJson(p.summary));
    j["rates"].push_back(std::move(e));
  }
  j["goodput"] = r.goodput ? json{{"goodput", *r.goodput}} : json(nullptr);
  return j.dump(2) + "\n";
}

std::string ReplaysToJson(const std::vector<TraceReplay>& rows, const PlannerInputs& in) {
  json j = Header("traces", in);
  j["traces"] = json::array();
  for (const TraceReplay& t : rows) {
    json e;
    e["name"] = t.name;
    e["system"] = t.system;
    e["deployment"] = t.spec.Describe();
    e["assumed"] = t.assumed;
    e["request_rate"] = t.rate;
    e["num_requests"] = t.num_requests;
    e["simulated"] = SummaryJson(t.simulated);
    e["measured"] = SummaryJson(t.measured);
    j["traces"].push_back(std::move(e));
  }
  return j.dump(2) + "\n";
}

}  // namespace pd::planner
