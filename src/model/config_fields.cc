#include "model/config_fields.h"

#include <cstdint>

namespace pd::model::internal {

Status FieldReader::Int(const char* key, int* out) const {
  if (!Has(key)) return OkStatus();
  return IntValue(key, root_[key], out);
}

Status FieldReader::Double(const char* key, double* out) const {
  if (!Has(key)) return OkStatus();
  const Json& v = root_[key];
  if (!v.is_number()) return Bad(key, "a number", v);
  *out = v.get<double>();
  return OkStatus();
}

Status FieldReader::Bool(const char* key, bool* out) const {
  if (!Has(key)) return OkStatus();
  const Json& v = root_[key];
  if (!v.is_boolean()) return Bad(key, "true or false", v);
  *out = v.get<bool>();
  return OkStatus();
}

Status FieldReader::String(const char* key, std::string* out) const {
  if (!Has(key)) return OkStatus();
  const Json& v = root_[key];
  if (!v.is_string()) return Bad(key, "a string", v);
  *out = v.get<std::string>();
  return OkStatus();
}

Status FieldReader::IntOrFirstOfList(const char* key, int* out) const {
  if (!Has(key)) return OkStatus();
  const Json& v = root_[key];
  if (v.is_array()) {
    if (v.empty() || !v[0].is_number_integer()) return Bad(key, "an integer or a list of them", v);
    return IntValue(key, v[0], out);
  }
  return Int(key, out);
}

Status FieldReader::IntList(const char* key, std::vector<int>* out) const {
  if (!Has(key)) return OkStatus();
  const Json& v = root_[key];
  if (!v.is_array()) return Bad(key, "a list of integers", v);
  std::vector<int> values;
  for (const Json& item : v) {
    int value = 0;
    RETURN_IF_ERROR(IntValue(key, item, &value));
    values.push_back(value);
  }
  *out = std::move(values);
  return OkStatus();
}

// An unsigned JSON integer above INT64_MAX must not wrap to a negative int64 (-1 would read as
// "absent" for a token id), so the range is checked on the stored kind.
Status FieldReader::IntValue(const char* key, const Json& v, int* out) const {
  if (!v.is_number_integer()) return Bad(key, "an integer", v);
  const bool fits = v.is_number_unsigned()
                        ? v.get<uint64_t>() <= INT32_MAX
                        : v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX;
  if (!fits) return Bad(key, "an integer that fits in 32 bits", v);
  *out = static_cast<int>(v.get<int64_t>());
  return OkStatus();
}

Status FieldReader::Bad(const char* key, const char* expected, const Json& v) const {
  return InvalidArgument(source_ + ": " + Name(key) + " must be " + expected + ", found " +
                         v.dump());
}

const char* RopeScalingKey(const Json& root) {
  if (root.contains("rope_scaling") && !root["rope_scaling"].is_null()) return "rope_scaling";
  if (!root.contains("rope_parameters") || root["rope_parameters"].is_null()) return nullptr;
  const Json& p = root["rope_parameters"];
  if (!p.is_object()) return "rope_parameters";  // refused as malformed by the reader
  const char* type_key = p.contains("rope_type") ? "rope_type" : "type";
  if (!p.contains(type_key) || p[type_key] == "default") return nullptr;
  return "rope_parameters";
}

Status Positive(const std::string& source, const std::string& key, int value) {
  if (value > 0) return OkStatus();
  return InvalidArgument(source + ": " + key + " must be positive, found " + std::to_string(value));
}

Status Positive(const std::string& source, const std::string& key, double value) {
  if (value > 0) return OkStatus();
  return InvalidArgument(source + ": " + key + " must be positive, found " + Json(value).dump());
}

}  // namespace pd::model::internal
