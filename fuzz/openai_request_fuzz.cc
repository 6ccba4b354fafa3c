// Fuzzes the OpenAI request parser (server/openai_protocol.h): every input is parsed as a
// completion and as a chat completion body (and as /tokenize and /detokenize bodies, which share
// its field readers). Accepted generate requests go through FinalizeGenerateRequest; every refusal
// must carry a message and render as an OpenAI error body (ErrorBody never throws, whatever bytes
// the message quotes from the request).
#include <cstdint>
#include <string_view>
#include <vector>

#include "common/check.h"
#include "server/openai_protocol.h"

namespace {

using pd::Status;
using pd::server::ApiKind;

pd::server::ProtocolLimits Limits() {
  pd::server::ProtocolLimits limits;
  limits.served_model_name = "demo-llama";
  limits.max_model_len = 2048;
  limits.vocab_size = 4096;
  return limits;
}

void CheckRefusal(const Status& status) {
  PD_CHECK(!status.ok());
  PD_CHECK(!status.message().empty()) << "a refused request's error names no problem";
  const int http_status = pd::server::HttpStatusFor(status);
  PD_CHECK(http_status >= 400 && http_status < 600) << http_status;
  PD_CHECK(!pd::server::ErrorBody(http_status, status.message()).empty());
}

void ParseGenerate(ApiKind kind, std::string_view body, const pd::server::ProtocolLimits& limits) {
  auto request = pd::server::ParseGenerateRequest(kind, body, limits);
  if (!request.ok()) return CheckRefusal(request.status());
  // Tokenisation is not fuzzed here: the ids sent, or a fixed short prompt for text and chat.
  std::vector<int32_t> ids = request->prompt_ids;
  if (ids.empty()) ids = {1, 2, 3};
  Status status = pd::server::FinalizeGenerateRequest(ids, limits, &*request);
  if (!status.ok()) return CheckRefusal(status);
  PD_CHECK(request->sampling.max_tokens >= 1) << request->sampling.max_tokens;
  PD_CHECK(int64_t(ids.size()) + request->sampling.max_tokens <= limits.max_model_len);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const pd::server::ProtocolLimits limits = Limits();
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  ParseGenerate(ApiKind::kCompletion, body, limits);
  ParseGenerate(ApiKind::kChat, body, limits);
  auto tokenize = pd::server::ParseTokenizeRequest(body, limits);
  if (!tokenize.ok()) CheckRefusal(tokenize.status());
  auto detokenize = pd::server::ParseDetokenizeRequest(body, limits);
  if (!detokenize.ok()) {
    CheckRefusal(detokenize.status());
  } else {
    for (int32_t id : *detokenize) PD_CHECK(id >= 0 && id < limits.vocab_size) << id;
  }
  return 0;
}
