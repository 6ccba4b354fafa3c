#include "planner/search.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "planner/setup.h"
#include "planner/test_data.h"

namespace pd::planner {
namespace {

// A small synthetic problem that runs in well under a second.
PlannerInputs SmallInputs(const LatencyModel* model) {
  PlannerInputs in;
  in.shape = *BuiltinModelShape("opt-13b");
  in.hw = *BuiltinHardware("a100-80gb");
  in.model = model;
  in.cluster = {1, 4, 3.125e9};
  in.lengths = {{200, 20}, {800, 60}, {400, 5}, {1200, 120}, {100, 200}};
  in.arrivals.num_requests = 120;
  in.max_requests = 300;
  in.min_duration_s = 20;
  in.tp_choices = {1, 2, 4};
  in.max_pp = 2;
  in.iterations = 8;
  return in;
}

TableLatencyModel SyntheticModel() {
  TableLatencyModel m("synthetic");
  for (int tp : {1, 2, 4}) {
    StepCoeffs c;
    c.prefill = {18.0 / tp + 2, 0.1 / tp + 0.002, 7e-6 / tp};
    c.decode_small = c.decode_large = {20.0 / tp + 2, 6e-4 / tp, 0.04};
    m.Set(tp, c);
  }
  return m;
}

TEST(Search, GoodputNeverDropsWhenTheSloLoosens) {
  TableLatencyModel model = SyntheticModel();
  PlannerInputs tight = SmallInputs(&model);
  tight.slo = {0.2, 0.05};
  PlannerInputs loose = tight;
  loose.slo = {0.6, 0.12};
  auto a = SearchPlacement(tight);
  auto b = SearchPlacement(loose);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto check = [](const std::vector<PhaseChoice>& t, const std::vector<PhaseChoice>& l) {
    ASSERT_EQ(t.size(), l.size());
    for (size_t i = 0; i < t.size(); ++i) {
      EXPECT_LE(t[i].goodput, l[i].goodput) << "TP" << t[i].par.tp << " PP" << t[i].par.pp;
    }
  };
  check(a->prefill_table, b->prefill_table);
  check(a->decode_table, b->decode_table);
  check(a->colocated_table, b->colocated_table);
  EXPECT_LE(a->colocated.per_device(), b->colocated.per_device());
  EXPECT_LE(a->high.estimated_goodput / a->high.unit_devices,
            b->high.estimated_goodput / b->high.unit_devices);
  // The loose SLO admits strictly more somewhere, or the test proves nothing.
  EXPECT_LT(a->colocated.per_device(), b->colocated.per_device());
  EXPECT_GT(a->best.goodput, 0.0);
}

TEST(Search, PlanJsonNamesRolesCountsAndParallelism) {
  TableLatencyModel model = SyntheticModel();
  PlannerInputs in = SmallInputs(&model);
  in.slo = {0.6, 0.12};
  auto r = SearchPlacement(in);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto j = nlohmann::json::parse(PlanToJson(*r, in));
  EXPECT_EQ(j["format"], "pdserve-plan-v1");
  const auto& insts = j["plan"]["instances"];
  ASSERT_EQ(insts.size(), 2u);
  EXPECT_EQ(insts[0]["role"], "prefill");
  EXPECT_EQ(insts[1]["role"], "decode");
  int devices = 0;
  for (const auto& i : insts) {
    EXPECT_GE(i["count"].get<int>(), 1);
    devices += i["count"].get<int>() * i["tp"].get<int>() * i["pp"].get<int>();
  }
  EXPECT_EQ(devices, j["plan"]["devices"].get<int>());
  EXPECT_LE(devices, 4);
  EXPECT_EQ(j["colocated_baseline"]["instances"][0]["role"], "colocated");
}

TEST(Search, ImpossibleSloIsAClearError) {
  TableLatencyModel model = SyntheticModel();
  PlannerInputs in = SmallInputs(&model);
  in.slo = {0.001, 0.001};  // below one step
  auto r = SearchPlacement(in);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  in.model = nullptr;
  EXPECT_EQ(SearchPlacement(in).status().code(), StatusCode::kInvalidArgument);
}

TEST(Search, KvCapacityPrefersDistServeTableOnA100) {
  PD_REQUIRE_DISTSERVE_DATA();
  auto table = LoadKvCapacityCsv(testing::DistServePath("a100-profile/max_num_tokens.csv"));
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  TableLatencyModel model = SyntheticModel();
  PlannerInputs in = SmallInputs(&model);
  in.kv_table = &*table;
  EXPECT_EQ(KvCapacity(in, {1, 1}), 66144);
  // OPT-66B does not fit one A100: no row, and the analytical sizing agrees.
  in.shape = *BuiltinModelShape("opt-66b");
  EXPECT_EQ(KvCapacity(in, {1, 1}), 0);
  EXPECT_EQ(MakeInstance(in, Role::kPrefill, {1, 1}, 0).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST(Search, SetupReportsBadOptions) {
  SetupOptions o;
  o.model = "no-such-model";
  EXPECT_EQ(BuildPlannerSetup(o).status().code(), StatusCode::kNotFound);
  o = SetupOptions{};
  o.hardware = "tpu";
  EXPECT_EQ(BuildPlannerSetup(o).status().code(), StatusCode::kNotFound);
  o = SetupOptions{};
  o.profile = "analytical";
  o.lengths = "/nonexistent.csv";
  EXPECT_EQ(BuildPlannerSetup(o).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace pd::planner
