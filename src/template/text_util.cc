#include "template/text_util.h"

namespace pd::template_engine {

bool DecodeUtf8(std::string_view s, size_t* pos, uint32_t* cp) {
  const size_t i = *pos;
  if (i >= s.size()) return false;
  const unsigned char c = static_cast<unsigned char>(s[i]);
  int len = 0;
  uint32_t v = 0;
  if (c < 0x80) {
    len = 1;
    v = c;
  } else if ((c & 0xE0) == 0xC0) {
    len = 2;
    v = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3;
    v = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4;
    v = c & 0x07;
  } else {
    return false;
  }
  if (i + len > s.size()) return false;
  for (int k = 1; k < len; ++k) {
    const unsigned char cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return false;
    v = (v << 6) | (cc & 0x3F);
  }
  *pos = i + len;
  *cp = v;
  return true;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool IsPythonSpace(uint32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20)) return true;
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::vector<size_t> CodePointOffsets(std::string_view s) {
  std::vector<size_t> offsets;
  size_t pos = 0;
  while (pos < s.size()) {
    offsets.push_back(pos);
    uint32_t cp = 0;
    if (!DecodeUtf8(s, &pos, &cp)) ++pos;
  }
  offsets.push_back(s.size());
  return offsets;
}

size_t CodePointCount(std::string_view s) { return CodePointOffsets(s).size() - 1; }

namespace {

std::vector<uint32_t> CodePoints(std::string_view s) {
  std::vector<uint32_t> cps;
  size_t pos = 0;
  while (pos < s.size()) {
    uint32_t cp = 0;
    if (!DecodeUtf8(s, &pos, &cp)) cp = static_cast<unsigned char>(s[pos++]);
    cps.push_back(cp);
  }
  return cps;
}

uint32_t LowerCp(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7) || (c >= 0x391 && c <= 0x3A9 && c != 0x3A2)) {
    return c + 32;
  }
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  return c;
}

uint32_t UpperCp(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7) || (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2)) {
    return c - 32;
  }
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  return c;
}

bool IsCased(uint32_t c) { return LowerCp(c) != c || UpperCp(c) != c; }

std::string Join(const std::vector<uint32_t>& cps) {
  std::string out;
  for (uint32_t c : cps) AppendUtf8(c, &out);
  return out;
}

}  // namespace

std::string PyStrip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::vector<uint32_t> set;
  if (chars != nullptr) set = CodePoints(*chars);
  auto strip = [&](uint32_t cp) {
    if (chars == nullptr) return IsPythonSpace(cp);
    for (uint32_t c : set) {
      if (c == cp) return true;
    }
    return false;
  };
  const std::vector<uint32_t> cps = CodePoints(s);
  size_t begin = 0;
  size_t end = cps.size();
  if (left) {
    while (begin < end && strip(cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip(cps[end - 1])) --end;
  }
  return Join(std::vector<uint32_t>(cps.begin() + begin, cps.begin() + end));
}

std::string PyLower(std::string_view s) {
  std::vector<uint32_t> cps = CodePoints(s);
  for (uint32_t& c : cps) c = LowerCp(c);
  return Join(cps);
}

std::string PyUpper(std::string_view s) {
  std::vector<uint32_t> cps = CodePoints(s);
  for (uint32_t& c : cps) c = UpperCp(c);
  return Join(cps);
}

std::string PyTitle(std::string_view s) {
  std::vector<uint32_t> cps = CodePoints(s);
  bool prev_cased = false;
  for (uint32_t& c : cps) {
    const bool cased = IsCased(c);
    c = prev_cased ? LowerCp(c) : UpperCp(c);
    prev_cased = cased;
  }
  return Join(cps);
}

std::string PyCapitalize(std::string_view s) {
  std::vector<uint32_t> cps = CodePoints(s);
  for (size_t i = 0; i < cps.size(); ++i) cps[i] = i == 0 ? UpperCp(cps[i]) : LowerCp(cps[i]);
  return Join(cps);
}

std::vector<std::string> PySplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep != nullptr) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      const size_t at = s.find(*sep, start);
      if (at == std::string_view::npos) break;
      parts.emplace_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    parts.emplace_back(s.substr(start));
    return parts;
  }
  const std::vector<uint32_t> cps = CodePoints(s);
  size_t i = 0;
  while (i < cps.size()) {
    while (i < cps.size() && IsPythonSpace(cps[i])) ++i;
    if (i == cps.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      size_t end = cps.size();
      while (end > i && IsPythonSpace(cps[end - 1])) --end;
      parts.push_back(Join(std::vector<uint32_t>(cps.begin() + i, cps.begin() + end)));
      break;
    }
    size_t j = i;
    while (j < cps.size() && !IsPythonSpace(cps[j])) ++j;
    parts.push_back(Join(std::vector<uint32_t>(cps.begin() + i, cps.begin() + j)));
    i = j;
  }
  return parts;
}

std::string PyReplace(std::string_view s, std::string_view from, std::string_view to,
                      int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` around every character
    const std::vector<size_t> offsets = CodePointOffsets(s);
    int64_t done = 0;
    for (size_t i = 0; i + 1 < offsets.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      out.append(s.substr(offsets[i], offsets[i + 1] - offsets[i]));
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(from, start);
    if (at == std::string_view::npos) break;
    out.append(s.substr(start, at - start));
    out += to;
    start = at + from.size();
    ++done;
  }
  out.append(s.substr(start));
  return out;
}

}  // namespace pd::template_engine
