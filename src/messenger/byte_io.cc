#include "messenger/byte_io.h"

#include <string>

namespace pd::messenger {

Status ByteReader::GetBytes(const char* field, size_t max_bytes, std::string* out) {
  uint32_t len = 0;
  RETURN_IF_ERROR(Get(field, &len));
  if (len > max_bytes) return TooLong(field, len, max_bytes);
  if (remaining() < len) return Truncated(field, len);
  out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
  pos_ += len;
  return OkStatus();
}

Status ByteReader::ExpectEnd(const char* message) const {
  if (remaining() == 0) return OkStatus();
  return InvalidArgument(std::string(message) + ": " + std::to_string(remaining()) +
                         " unexpected trailing bytes");
}

Status ByteReader::Truncated(const char* field, size_t need) const {
  return InvalidArgument(std::string("truncated message: field '") + field + "' needs " +
                         std::to_string(need) + " bytes, " + std::to_string(remaining()) + " left");
}

Status ByteReader::TooLong(const char* field, size_t count, size_t max_count) {
  return InvalidArgument(std::string("field '") + field + "' has " + std::to_string(count) +
                         " elements, more than the limit " + std::to_string(max_count));
}

}  // namespace pd::messenger
