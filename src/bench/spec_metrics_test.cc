#include "bench/spec_metrics.h"

#include <gtest/gtest.h>

namespace pd::bench {
namespace {

TEST(SpecMetricsTest, ParsesTheCountersSummedOverLabels) {
  const char* text =
      "# HELP pdserve:spec_decode_num_drafts_total Number of spec decoding drafts.\n"
      "# TYPE pdserve:spec_decode_num_drafts_total counter\n"
      "pdserve:spec_decode_num_drafts_total{model_name=\"a\"} 10\n"
      "pdserve:spec_decode_num_drafts_total{model_name=\"b\"} 5\n"
      "pdserve:spec_decode_num_draft_tokens_total{model_name=\"a\"} 45\n"
      "pdserve:spec_decode_num_accepted_tokens_total{model_name=\"a\"} 30\n"
      "pdserve:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 12\n"
      "pdserve:spec_decode_num_drafts_totalx 99\n";
  auto t = ParseSpecDecodeTotals(text);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->num_drafts, 15);
  EXPECT_EQ(t->num_draft_tokens, 45);
  EXPECT_EQ(t->num_accepted_tokens, 30);  // the per-position counter is another metric
  EXPECT_FALSE(ParseSpecDecodeTotals("pdserve:num_requests_running 1\n").has_value());
}

TEST(SpecMetricsTest, SummaryReportsTheRunsAcceptanceBeforeTheClosingLine) {
  BenchmarkSummary s;
  s.text = "---TPOT---\nMean TPOT (ms): 1\n" + std::string(50, '=') + "\n";
  AddSpecDecodeSummary({10, 30, 12}, {30, 90, 52}, &s);  // 20 drafts, 60 tokens, 40 accepted
  EXPECT_DOUBLE_EQ(s.json["spec_decode_mean_acceptance_length"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(s.json["spec_decode_acceptance_rate"].get<double>(), 40.0 / 60.0);
  EXPECT_NE(s.text.find("Mean acceptance length:                  3.00"), std::string::npos)
      << s.text;
  EXPECT_LT(s.text.find("Speculative Decoding"), s.text.rfind(std::string(50, '=')));
  BenchmarkSummary none;
  AddSpecDecodeSummary({10, 30, 12}, {10, 30, 12}, &none);  // nothing drafted in the run
  EXPECT_TRUE(none.text.empty());
  EXPECT_FALSE(none.json.contains("spec_decode_mean_acceptance_length"));
}

}  // namespace
}  // namespace pd::bench
