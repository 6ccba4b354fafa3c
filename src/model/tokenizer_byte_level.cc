#include "model/tokenizer_byte_level.h"

namespace pd::model::internal {
namespace {

constexpr uint32_t kNoByte = 0xFFFFFFFF;
constexpr uint32_t kMaxByteChar = 0x100 + 68;  // the highest code point of the alphabet + 1

bool IsPrintableByte(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<std::string, 256> byte_to_unicode;
  std::array<uint32_t, kMaxByteChar> unicode_to_byte;
};

const Tables& GetTables() {
  static const Tables* tables = [] {
    auto* t = new Tables();
    t->unicode_to_byte.fill(kNoByte);
    uint32_t next_extra = 0x100;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = IsPrintableByte(b) ? static_cast<uint32_t>(b) : next_extra++;
      AppendUtf8(cp, &t->byte_to_unicode[b]);
      t->unicode_to_byte[cp] = static_cast<uint32_t>(b);
    }
    return t;
  }();
  return *tables;
}

}  // namespace

const std::array<std::string, 256>& ByteToUnicode() { return GetTables().byte_to_unicode; }

std::string ByteLevelEncode(std::string_view bytes) {
  const auto& table = ByteToUnicode();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += table[c];
  return out;
}

bool ByteLevelDecode(std::string_view text, std::string* out) {
  const auto& table = GetTables().unicode_to_byte;
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t cp = 0;
    if (!NextUtf8(text, &pos, &cp)) return false;
    if (cp >= kMaxByteChar || table[cp] == kNoByte) return false;
    out->push_back(static_cast<char>(table[cp]));
  }
  return true;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool NextUtf8(std::string_view text, size_t* pos, uint32_t* cp) {
  const size_t n = text.size();
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char b0 = byte(*pos);
  int extra = 0;
  uint32_t value = 0;
  uint32_t min_value = 0;
  if (b0 < 0x80) {
    *cp = b0;
    ++*pos;
    return true;
  } else if ((b0 & 0xE0) == 0xC0) {
    extra = 1, value = b0 & 0x1F, min_value = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    extra = 2, value = b0 & 0x0F, min_value = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    extra = 3, value = b0 & 0x07, min_value = 0x10000;
  } else {
    return false;
  }
  if (*pos + static_cast<size_t>(extra) >= n) return false;
  for (int i = 1; i <= extra; ++i) {
    const unsigned char b = byte(*pos + i);
    if ((b & 0xC0) != 0x80) return false;
    value = (value << 6) | (b & 0x3F);
  }
  if (value < min_value || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return false;
  *cp = value;
  *pos += extra + 1;
  return true;
}

bool IsValidUtf8(std::string_view text) {
  size_t pos = 0;
  uint32_t cp = 0;
  while (pos < text.size()) {
    if (!NextUtf8(text, &pos, &cp)) return false;
  }
  return true;
}

}  // namespace pd::model::internal
