// API key checks that take the same time whatever the key and however much of it a guess gets
// right, so that timing a server's refusals tells a client nothing about the key.
#pragma once

#include <string_view>

namespace pd::server {

// Whether `provided` equals `expected`. Its running time depends only on provided.size(): every
// byte of `provided` is compared (against `expected` cyclically), a length mismatch counts as a
// difference without an early return, and nothing branches on the bytes.
bool ConstantTimeEquals(std::string_view provided, std::string_view expected);

// Whether an Authorization header value is "Bearer <api_key>" (constant time as above).
bool BearerMatches(std::string_view authorization, std::string_view api_key);

}  // namespace pd::server
