#include "model/tokenizer_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace pd::model::internal {
namespace {

pcre2_code* AsCode(void* code) { return static_cast<pcre2_code*>(code); }

std::string ErrorMessage(int error_code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(error_code, buffer, sizeof(buffer)) < 0) {
    return "PCRE2 error " + std::to_string(error_code);
  }
  return reinterpret_cast<const char*>(buffer);
}

// Frees the match data a Split call uses.
struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

}  // namespace

Result<std::unique_ptr<RegexSplitter>> RegexSplitter::Create(std::string_view pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  // UCP makes \s, \w and \d Unicode-aware as in HF's (Oniguruma) regexes; MATCH_INVALID_UTF lets
  // arbitrary bytes through (invalid sequences simply never match).
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    return InvalidArgument("invalid regex '" + std::string(pattern) + "' at offset " +
                           std::to_string(error_offset) + ": " + ErrorMessage(error_code));
  }
  // JIT is an optimisation: when unavailable the interpreter runs the same pattern.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  std::unique_ptr<RegexSplitter> splitter(new RegexSplitter());
  splitter->pattern_ = std::string(pattern);
  splitter->code_ = code;
  return splitter;
}

RegexSplitter::~RegexSplitter() { pcre2_code_free(AsCode(code_)); }

void RegexSplitter::Split(std::string_view text, std::vector<std::string_view>* pieces) const {
  if (text.empty()) return;
  pcre2_code* code = AsCode(code_);
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(
      pcre2_match_data_create_from_pattern(code, nullptr));
  PD_CHECK(match != nullptr) << "pcre2_match_data_create_from_pattern: out of memory";
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t gap_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    int rc = pcre2_match(code, subject, text.size(), pos, 0, match.get(), nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // A very long run overflowed the JIT stack: the interpreter keeps its frames on the heap.
      rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_JIT, match.get(), nullptr);
    }
    // No further match: the rest is one gap. A match or heap limit hit by a pathological pattern
    // ends splitting the same way, which keeps Encode total and Decode(Encode(s)) == s.
    if (rc < 0) break;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (end == start) {
      // An empty match cuts nothing; step over one character (continuation bytes included).
      pos = start + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (start > gap_start) pieces->push_back(text.substr(gap_start, start - gap_start));
    pieces->push_back(text.substr(start, end - start));
    gap_start = pos = end;
  }
  if (gap_start < text.size()) pieces->push_back(text.substr(gap_start));
}

}  // namespace pd::model::internal
