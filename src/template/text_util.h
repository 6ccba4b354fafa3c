// UTF-8 and Python string helpers the template engine shares: Python's str methods work on code
// points and its whitespace is Unicode's.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pd::template_engine {

// Decodes one UTF-8 character at *pos, advancing it; false (pos unchanged) on a malformed one.
bool DecodeUtf8(std::string_view s, size_t* pos, uint32_t* cp);
void AppendUtf8(uint32_t cp, std::string* out);
// Python's str.isspace() for one code point.
bool IsPythonSpace(uint32_t cp);
// Byte offsets of each code point's start, plus s.size() at the end (malformed bytes count one
// each).
std::vector<size_t> CodePointOffsets(std::string_view s);
size_t CodePointCount(std::string_view s);

// Python's str.strip/lstrip/rstrip: with chars == nullptr, Unicode whitespace; else any of the
// code points in *chars.
std::string PyStrip(std::string_view s, const std::string* chars, bool left, bool right);
std::string PyLower(std::string_view s);
std::string PyUpper(std::string_view s);
// Jinja's title filter / str.title(): first letter of each word upper, the rest lower.
std::string PyTitle(std::string_view s);
// str.capitalize(): first character upper, the rest lower.
std::string PyCapitalize(std::string_view s);
// str.split(sep) (sep non-empty) and str.split() (sep == nullptr: runs of whitespace),
// with maxsplit < 0 for no limit.
std::vector<std::string> PySplit(std::string_view s, const std::string* sep, int64_t maxsplit);
// str.replace(old, new, count) with count < 0 for all.
std::string PyReplace(std::string_view s, std::string_view from, std::string_view to,
                      int64_t count);

}  // namespace pd::template_engine
