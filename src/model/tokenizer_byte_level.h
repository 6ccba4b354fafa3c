// GPT-2's byte-level alphabet: every byte maps to one printable Unicode character, so any byte
// string becomes a string of "byte characters" and back. Also small UTF-8 helpers.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace pd::model::internal {

// UTF-8 encoding of the character that stands for byte b (GPT-2's bytes_to_unicode):
// '!'..'~', '¡'..'¬', '®'..'ÿ' map to themselves, the other 68 bytes to U+0100.. in byte order.
const std::array<std::string, 256>& ByteToUnicode();

// Bytes -> byte-level string ("Hello world" -> "HelloĠworld").
std::string ByteLevelEncode(std::string_view bytes);

// Byte-level string -> bytes. Returns false (and leaves *out partly written) when `text` holds a
// character outside the 256-character alphabet or is not valid UTF-8.
bool ByteLevelDecode(std::string_view text, std::string* out);

// Appends the UTF-8 encoding of code point cp (cp < 0x110000).
void AppendUtf8(uint32_t cp, std::string* out);

// Decodes one UTF-8 character at text[*pos], advancing *pos. Returns false on invalid UTF-8
// (overlong forms, surrogates and code points above U+10FFFF included).
bool NextUtf8(std::string_view text, size_t* pos, uint32_t* cp);

bool IsValidUtf8(std::string_view text);

}  // namespace pd::model::internal
