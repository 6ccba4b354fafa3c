#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "constrain/constrain_test_util.h"
#include "constrain/nfa.h"
#include "constrain/regex_parser.h"

namespace pd::constrain {
namespace {

using ::testing::HasSubstr;
using testing::Re;

std::string Utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

TEST(RegexTest, ClassesAndEscapes) {
  Re hex("[0-9a-fA-F]+");
  EXPECT_TRUE(hex.Matches("09afAF"));
  EXPECT_FALSE(hex.Matches("0g"));
  EXPECT_FALSE(hex.Matches(""));
  Re neg("[^abc]");
  EXPECT_TRUE(neg.Matches("d"));
  EXPECT_FALSE(neg.Matches("b"));
  EXPECT_TRUE(neg.Matches("\n"));  // a negated class holds newlines (unlike '.')
  Re dot(".");
  EXPECT_FALSE(dot.Matches("\n"));
  EXPECT_TRUE(dot.Matches("x"));
  Re esc(R"(\d\w\s\.\*\[\x41\u00e9\n)");
  EXPECT_TRUE(esc.Matches("7_ .*[A\xC3\xA9\n"));
  EXPECT_FALSE(esc.Matches("7_ x*[A\xC3\xA9\n"));
  Re negd(R"(\D\W\S)");
  EXPECT_TRUE(negd.Matches("a-x"));
  EXPECT_FALSE(negd.Matches("1-x"));
  EXPECT_FALSE(negd.Matches("aax"));
  EXPECT_FALSE(negd.Matches("a- "));
  Re dash("[a-]+");  // a trailing '-' is itself
  EXPECT_TRUE(dash.Matches("a-a"));
  Re in_class(R"([\d.]+)");
  EXPECT_TRUE(in_class.Matches("1.5"));
  EXPECT_FALSE(in_class.Matches("1,5"));
}

TEST(RegexTest, AlternationGroupsAndRepetitionBounds) {
  Re alt("cat|dog|(?:bird|fish)s?");
  for (const char* yes : {"cat", "dog", "bird", "fishs"}) EXPECT_TRUE(alt.Matches(yes)) << yes;
  for (const char* no : {"ca", "catdog", "birds s", ""}) EXPECT_FALSE(alt.Matches(no)) << no;
  Re bounded("a{2,4}");
  EXPECT_FALSE(bounded.Matches("a"));
  EXPECT_TRUE(bounded.Matches("aa"));
  EXPECT_TRUE(bounded.Matches("aaaa"));
  EXPECT_FALSE(bounded.Matches("aaaaa"));
  Re exact("(ab){3}");
  EXPECT_TRUE(exact.Matches("ababab"));
  EXPECT_FALSE(exact.Matches("abab"));
  Re open("x{2,}y");
  EXPECT_FALSE(open.Matches("xy"));
  EXPECT_TRUE(open.Matches("xxxxxxy"));
  Re star("(a|b)*c+d?");
  EXPECT_TRUE(star.Matches("c"));
  EXPECT_TRUE(star.Matches("abbaccd"));
  EXPECT_FALSE(star.Matches("abd"));
  Re lazy("a+?b??");  // lazy quantifiers: the same language
  EXPECT_TRUE(lazy.Matches("aab"));
  Re named("(?P<y>[0-9]{4})-(?<m>[0-9]{2})");
  EXPECT_TRUE(named.Matches("2024-05"));
  Re empty_alt("a(|b)c");
  EXPECT_TRUE(empty_alt.Matches("ac"));
  EXPECT_TRUE(empty_alt.Matches("abc"));
}

TEST(RegexTest, AnchorsAtTheEndsAreImplicit) {
  Re anchored("^ab$");
  EXPECT_TRUE(anchored.Matches("ab"));
  EXPECT_FALSE(anchored.Matches("abab"));
  Re dollar(R"(a\$)");
  EXPECT_TRUE(dollar.Matches("a$"));
}

TEST(RegexTest, Utf8ClassesReadWholeCharacters) {
  Re greek("[α-ω]+");
  EXPECT_TRUE(greek.Matches("αβγ"));
  EXPECT_FALSE(greek.Matches("abc"));
  EXPECT_FALSE(greek.Matches("\xCE"));  // half a character
  Re any(".{3}");
  EXPECT_TRUE(any.Matches("a\xC3\xA9\xF0\x9F\x98\x80"));  // 1-, 2- and 4-byte characters
  EXPECT_FALSE(any.Matches("ab"));
  Re not_a("[^a]");
  EXPECT_TRUE(not_a.Matches("€"));
  EXPECT_FALSE(not_a.Matches("\xC0\x80"));          // overlong
  EXPECT_FALSE(not_a.Matches("\xED\xA0\x80"));      // a surrogate
  EXPECT_FALSE(not_a.Matches("\xF4\x90\x80\x80"));  // above U+10FFFF
  Re literal("é+");
  EXPECT_TRUE(literal.Matches("éé"));
  // The automaton walks a character's bytes one by one: a prefix of one is still alive.
  const TokenAutomaton& a = greek.automaton();
  EXPECT_NE(a.Walk(a.start_state(), "\xCE"), TokenAutomaton::kDead);
  EXPECT_EQ(a.Walk(a.start_state(), "\xCE\x41"), TokenAutomaton::kDead);
}

// Each code point's encoding matches exactly one of the sequences of a range holding it, and none
// of a range without it.
TEST(RegexTest, Utf8SequencesCoverExactlyTheRange) {
  std::mt19937 rng(3);
  auto random_cp = [&] {
    uint32_t cp = 0;
    do {
      const int len = std::uniform_int_distribution<int>(1, 4)(rng);
      const uint32_t top = len == 1 ? 0x7F : len == 2 ? 0x7FF : len == 3 ? 0xFFFF : 0x10FFFF;
      cp = std::uniform_int_distribution<uint32_t>(0, top)(rng);
    } while (cp >= 0xD800 && cp <= 0xDFFF);
    return cp;
  };
  for (int trial = 0; trial < 300; ++trial) {
    uint32_t lo = random_cp(), hi = random_cp();
    if (lo > hi) std::swap(lo, hi);
    if (lo < 0xD800 && hi > 0xDFFF) hi = 0xD7FF;
    if (lo >= 0xD800 && lo <= 0xDFFF) continue;
    const auto seqs = Utf8Sequences(lo, hi);
    for (int probe = 0; probe < 20; ++probe) {
      const uint32_t cp = probe < 2 ? (probe == 0 ? lo : hi) : random_cp();
      const std::string bytes = Utf8(cp);
      int matches = 0;
      for (const auto& seq : seqs) {
        bool m = seq.size() == bytes.size();
        for (size_t i = 0; m && i < seq.size(); ++i) {
          const auto b = static_cast<uint8_t>(bytes[i]);
          m = seq[i].first <= b && b <= seq[i].second;
        }
        matches += m;
      }
      EXPECT_EQ(matches, cp >= lo && cp <= hi ? 1 : 0) << std::hex << lo << ".." << hi << " " << cp;
    }
  }
}

TEST(RegexTest, CompletionDistanceAndCompleteness) {
  Re r("a{3}b|xy");
  const TokenAutomaton& a = r.automaton();
  EXPECT_EQ(a.Info(a.start_state()).distance, 2u);  // "xy"
  EXPECT_EQ(a.Info(a.Walk(a.start_state(), "a")).distance, 3u);
  const auto done = a.Info(a.Walk(a.start_state(), "aaab"));
  EXPECT_TRUE(done.accepting);
  EXPECT_FALSE(done.has_exit);
  Re digits("[0-9]+");
  const auto some =
      digits.automaton().Info(digits.automaton().Walk(digits.automaton().start_state(), "12"));
  EXPECT_TRUE(some.accepting);
  EXPECT_TRUE(some.has_exit);  // a whole sentence that may still go on
}

TEST(RegexTest, UnsupportedOrInvalidPatternsNameTheProblem) {
  struct Case {
    const char* pattern;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {R"((a)\1)", "back-reference '\\1'"},
           {"a(?=b)", "look-arounds"},
           {"(?i)a", "inline flags"},
           {R"(\bword)", "word boundary"},
           {"a^b", "anchor '^'"},
           {"a$b", "anchor '$'"},
           {"(ab", "unterminated group"},
           {"ab)", "unmatched ')'"},
           {"[ab", "unterminated character class"},
           {"*a", "nothing to repeat"},
           {"a{3,2}", "m < n"},
           {"a{99999}", "repetition bound"},
           {"[z-a]", "out of order"},
           {R"(\p{L})", "unsupported escape '\\p'"},
       }) {
    auto r = ParseRegex(c.pattern);
    ASSERT_FALSE(r.ok()) << c.pattern;
    EXPECT_THAT(r.status().message(), HasSubstr(c.message)) << c.pattern;
    EXPECT_THAT(r.status().message(), HasSubstr("regex:")) << c.pattern;
  }
  auto big = ParseRegex("(a{1000}){3000}");
  ASSERT_TRUE(big.ok());
  auto nfa = CompileNfa(*big);
  ASSERT_FALSE(nfa.ok());
  EXPECT_THAT(nfa.status().message(), HasSubstr("states"));
}

TEST(RegexTest, JsonStringCharsLeaveOutQuotesBackslashesAndControls) {
  RegexOptions o;
  o.json_string_chars = true;
  auto node = ParseRegex(".*", o);
  ASSERT_TRUE(node.ok());
  auto a = testing::AutomatonOf(*node);
  EXPECT_TRUE(testing::FullMatch(*a, "plain text é"));
  EXPECT_FALSE(testing::FullMatch(*a, "a\"b"));
  EXPECT_FALSE(testing::FullMatch(*a, "a\\b"));
  EXPECT_FALSE(testing::FullMatch(*a, "a\tb"));
}

TEST(RegexTest, EscapeRegexMatchesTheTextItself) {
  const std::string text = "a.b*c(d)[e]{f}|g^h$i\\j+k?l-m/n";
  Re r(EscapeRegex(text));
  EXPECT_TRUE(r.Matches(text));
  EXPECT_FALSE(r.Matches("a.b*c(d)[e]{f}|g^h$i\\j+k?l-m/"));
}

}  // namespace
}  // namespace pd::constrain
