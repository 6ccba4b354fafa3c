#include "transfer/fault_injection.h"

#include <charconv>

namespace pd::transfer {
namespace {

constexpr std::pair<FaultKind, std::string_view> kKindNames[] = {
    {FaultKind::kDrop, "drop"},       {FaultKind::kDuplicate, "dup"},
    {FaultKind::kCorrupt, "corrupt"}, {FaultKind::kDelay, "delay"},
    {FaultKind::kReorder, "reorder"}, {FaultKind::kFail, "fail"},
};

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  while (true) {
    const size_t at = s.find(sep);
    parts.push_back(s.substr(0, at));
    if (at == std::string_view::npos) return parts;
    s.remove_prefix(at + 1);
  }
}

template <typename T>
bool ParseNumber(std::string_view s, T* out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

Result<FaultRule> ParseOne(std::string_view spec) {
  const auto parts = Split(spec, ':');
  if (parts.size() < 3 || parts.size() > 4) {
    return InvalidArgument("fault rule '" + std::string(spec) +
                           "': expected SITE:KIND:NTH[:DELAY_MS]");
  }
  FaultRule rule;
  if (parts[0] == "write") {
    rule.site = FaultSite::kWrite;
  } else if (parts[0] == "imm") {
    rule.site = FaultSite::kImmediate;
  } else {
    return InvalidArgument("fault rule '" + std::string(spec) + "': site '" +
                           std::string(parts[0]) + "' is not write or imm");
  }
  bool known = false;
  for (const auto& [kind, name] : kKindNames) {
    if (parts[1] == name) {
      rule.kind = kind;
      known = true;
    }
  }
  if (!known) {
    return InvalidArgument("fault rule '" + std::string(spec) + "': kind '" +
                           std::string(parts[1]) +
                           "' is not drop, dup, corrupt, delay, reorder or fail");
  }
  if (rule.kind == FaultKind::kFail && rule.site != FaultSite::kWrite) {
    return InvalidArgument("fault rule '" + std::string(spec) + "': fail applies to writes only");
  }
  if (!ParseNumber(parts[2], &rule.nth) || rule.nth == 0) {
    return InvalidArgument("fault rule '" + std::string(spec) + "': NTH '" + std::string(parts[2]) +
                           "' is not a positive integer");
  }
  if (parts.size() == 4 && !ParseNumber(parts[3], &rule.delay_ms)) {
    return InvalidArgument("fault rule '" + std::string(spec) + "': DELAY_MS '" +
                           std::string(parts[3]) + "' is not a non-negative integer");
  }
  return rule;
}

}  // namespace

std::string_view FaultSiteName(FaultSite site) {
  return site == FaultSite::kWrite ? "write" : "imm";
}

std::string_view FaultKindName(FaultKind kind) {
  for (const auto& [k, name] : kKindNames) {
    if (k == kind) return name;
  }
  return "?";
}

std::string FaultRuleToString(const FaultRule& rule) {
  std::string s = std::string(FaultSiteName(rule.site)) + ":" +
                  std::string(FaultKindName(rule.kind)) + ":" + std::to_string(rule.nth);
  if (rule.kind == FaultKind::kDelay || rule.kind == FaultKind::kReorder) {
    s += ":" + std::to_string(rule.delay_ms);
  }
  if (rule.count != 1) s += " x" + std::to_string(rule.count);
  if (rule.imm) s += " imm " + std::to_string(*rule.imm);
  return s;
}

Result<std::vector<FaultRule>> ParseFaultRules(std::string_view spec) {
  std::vector<FaultRule> rules;
  if (spec.empty()) return rules;
  for (std::string_view part : Split(spec, ',')) {
    ASSIGN_OR_RETURN(FaultRule rule, ParseOne(part));
    rules.push_back(rule);
  }
  return rules;
}

void FaultInjector::Arm(const FaultRule& rule) {
  MutexLock lock(&mu_);
  rules_.push_back({rule, 0});
}

void FaultInjector::Disarm() {
  MutexLock lock(&mu_);
  rules_.clear();
}

uint64_t FaultInjector::num_applied() const {
  MutexLock lock(&mu_);
  return applied_;
}

std::optional<FaultRule> FaultInjector::Decide(FaultSite site, std::optional<uint32_t> imm) {
  MutexLock lock(&mu_);
  std::optional<FaultRule> chosen;
  for (Armed& a : rules_) {
    if (a.rule.site != site || (a.rule.imm && a.rule.imm != imm)) continue;
    const uint64_t n = ++a.seen;
    if (!chosen && n >= a.rule.nth && n - a.rule.nth < a.rule.count) chosen = a.rule;
  }
  if (chosen) ++applied_;
  return chosen;
}

}  // namespace pd::transfer
