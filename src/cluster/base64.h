// Standard base64 (RFC 4648, with padding), as etcd's HTTP/JSON gateway writes keys and values.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace pd::cluster {

std::string Base64Encode(std::string_view bytes);
// InvalidArgument naming the offending character or length.
Result<std::string> Base64Decode(std::string_view text);

}  // namespace pd::cluster
