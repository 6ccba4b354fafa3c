#include "bench/spec_metrics.h"

#include <httplib.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace pd::bench {
namespace {

// The value of a sample line "NAME{labels} VALUE" or "NAME VALUE" of `name`; nullopt otherwise.
std::optional<double> SampleValue(std::string_view line, std::string_view name) {
  if (line.substr(0, name.size()) != name || line.size() == name.size()) return std::nullopt;
  const char next = line[name.size()];
  if (next != '{' && next != ' ') return std::nullopt;
  const size_t space = line.rfind(' ');
  if (space == std::string_view::npos || space < name.size()) return std::nullopt;
  const std::string value(line.substr(space + 1));
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (end == value.c_str()) return std::nullopt;
  return v;
}

std::string FormatLine(const char* label, double value, int precision) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%-40s %-10.*f\n", label, precision, value);
  return buf;
}

}  // namespace

std::optional<SpecDecodeTotals> ParseSpecDecodeTotals(std::string_view text) {
  SpecDecodeTotals t;
  bool found = false;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    const std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    if (line.empty() || line[0] == '#') continue;
    const std::pair<const char*, double*> counters[] = {
        {"pdserve:spec_decode_num_drafts_total", &t.num_drafts},
        {"pdserve:spec_decode_num_draft_tokens_total", &t.num_draft_tokens},
        {"pdserve:spec_decode_num_accepted_tokens_total", &t.num_accepted_tokens}};
    for (const auto& [name, total] : counters) {
      if (auto v = SampleValue(line, name)) {
        *total += *v;
        found = true;
      }
    }
  }
  if (!found) return std::nullopt;
  return t;
}

std::optional<SpecDecodeTotals> FetchSpecDecodeTotals(const Endpoint& endpoint) {
  httplib::Client cli(endpoint.host, endpoint.port);
  cli.set_connection_timeout(10, 0);
  httplib::Headers headers;
  if (!endpoint.api_key.empty()) headers.emplace("Authorization", "Bearer " + endpoint.api_key);
  auto res = cli.Get("/metrics", headers);
  if (!res || res->status != 200) return std::nullopt;
  return ParseSpecDecodeTotals(res->body);
}

void AddSpecDecodeSummary(const SpecDecodeTotals& before, const SpecDecodeTotals& after,
                          BenchmarkSummary* summary) {
  const double drafts = after.num_drafts - before.num_drafts;
  const double draft_tokens = after.num_draft_tokens - before.num_draft_tokens;
  const double accepted = after.num_accepted_tokens - before.num_accepted_tokens;
  if (drafts <= 0 || draft_tokens <= 0) return;
  const double rate = accepted / draft_tokens;
  const double mean_length = 1.0 + accepted / drafts;
  summary->json["spec_decode_num_drafts"] = drafts;
  summary->json["spec_decode_num_draft_tokens"] = draft_tokens;
  summary->json["spec_decode_num_accepted_tokens"] = accepted;
  summary->json["spec_decode_acceptance_rate"] = rate;
  summary->json["spec_decode_mean_acceptance_length"] = mean_length;
  std::string section = "--------------Speculative Decoding----------------\n";
  section += FormatLine("Acceptance rate (%):", 100.0 * rate, 2);
  section += FormatLine("Mean acceptance length:", mean_length, 2);
  section += FormatLine("Drafts:", drafts, 0);
  // Before the closing line of '=' when there is one.
  std::string& text = summary->text;
  const size_t last = text.rfind(std::string(50, '='));
  text.insert(last == std::string::npos ? text.size() : last, section);
}

}  // namespace pd::bench
