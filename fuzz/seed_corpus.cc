// Writes the generated part of the fuzz seed corpus into CORPUS_DIR (fuzz/corpus):
//   wire/        every message type as a frame from EncodeFrame, in each harness mode
//   safetensors/ small checkpoints from WriteSafetensors (several dtypes, scalar, empty tensor)
//   tokenizer/   the model tests' small hand-written tokenizer.json (merges as strings and as
//                pairs) and a synthetic Qwen2 one (WriteSyntheticTokenizer, ChatML specials)
// File names are fixed, so rerunning it after a format change rewrites the same files (make fuzz
// runs it first). The hand-written seeds beside them (JSON bodies, configs, tokenizers, past
// crashes) are left alone.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "messenger/wire.h"
#include "model/safetensors.h"
#include "model/tokenizer.h"
#include "model/tokenizer_testing.h"

namespace {

namespace fs = std::filesystem;
using namespace pd::messenger;

const char* const kSecret = "fuzz-cluster-secret";  // wire_fuzz.cc's secret

PrefillRequest SampleRequest() {
  PrefillRequest m;
  m.request_id = 42;
  m.transfer_imm = 0xabcd;
  m.num_tokens = 6;
  m.num_pages = 4;
  m.token_ids = {1, 2, 3, 500};
  m.decode_scheme = {2, 8, false};
  m.rank_regions = {"region-rank-0", "region-rank-1"};
  m.dst_pages = {7, 3, 9};
  m.metadata_region = "meta";
  m.metadata_offset = 4096;
  m.metadata_bytes = 256;
  m.deadline_ms = 5000;
  m.metadata_imm = 0xabce;
  m.first_page = 1;
  m.nic_regions = {"nic1-rank-0", "nic1-rank-1"};
  return m;
}

// A request to DP rank 3 of a data-parallel decode instance: one rank's region, scheme TP 1.
PrefillRequest SampleDpRequest() {
  PrefillRequest m = SampleRequest();
  m.decode_scheme = {1, 1, true};
  m.rank_regions = {"region-dp-rank-3"};
  m.nic_regions = {"nic1-dp-rank-3"};
  m.dp_rank = 3;
  return m;
}

// A PrefillRequest of a decode instance with a draft KV region (wire version 9): TP 2, one further
// NIC.
PrefillRequest SampleDraftRequest() {
  PrefillRequest m = SampleRequest();
  m.decode_scheme = {2, 4, false};
  m.rank_regions = {"region-rank-0", "region-rank-1"};
  m.nic_regions = {"nic1-rank-0", "nic1-rank-1"};
  m.draft_rank_regions = {"draft-rank-0", "draft-rank-1"};
  m.draft_nic_regions = {"nic1-draft-rank-0", "nic1-draft-rank-1"};
  return m;
}

std::vector<std::pair<std::string, Message>> SampleMessages() {
  const KvFormat format{0x1234, 2, 64, 16, 1, 0};
  KvFormat speculative = format;  // a Hello of an instance that drafts (wire version 8)
  speculative.speculative = "draft_model k=4 draft=0123456789abcdef";
  KvFormat draft_kv = speculative;  // and keeps the draft's KV region (wire version 9)
  draft_kv.draft_kv = {1, 64, 2, 0, 1, 0, 0};
  return {
      {"hello", Hello{"prefill-0",
                      speculative,
                      {1, 4, false},
                      "fi-addr",
                      "fi-addr-2",
                      65536,
                      {"fi-addr-nic1"}}},
      {"hello_reply",
       HelloReply{true, "", "decode-0", format, {2, 4, true}, "fi-addr-2", 4096, {}}},
      {"hello_refused",
       HelloReply{
           false, "page size differs", "decode-1", format, {1, 1}, "", kDefaultMessageBytes, {}}},
      {"hello_dp", Hello{"decode-dp4", format, {1, 1, true}, "fi-addr", "fi-addr-2", 65536, {}, 4}},
      {"hello_draft_kv", Hello{"decode-draft",
                               draft_kv,
                               {2, 4, false},
                               "fi-addr",
                               "fi-addr-2",
                               65536,
                               {"fi-addr-nic1"}}},
      {"prefill_request_draft_kv", SampleDraftRequest()},
      {"prefill_request", SampleRequest()},
      {"prefill_request_dp", SampleDpRequest()},
      {"prefill_request_empty", PrefillRequest{}},
      {"prefill_done", PrefillDone{42, 14, "peer gone", 17}},
      {"cancel", Cancel{99}},
      {"prompt_chunk", PromptChunk{42, 4, {7, 8}, 3, {11}}},
      {"prompt_chunk_pages_only", PromptChunk{42, 0, {}, 1, {5, 6}}},
      {"reroute", Reroute{42, 1}},
      {"reroute_reply", RerouteReply{42, 0x5a5a}},
  };
}

pd::Status WriteBytes(const fs::path& path, const std::vector<uint8_t>& bytes) {
  return pd::WriteStringToFile(path.string(), std::string(bytes.begin(), bytes.end()));
}

// wire_fuzz.cc input: a mode byte (bit 0: secret, bit 1: sealed), then the frame (sealed: no MAC).
pd::Status WriteWireSeeds(const fs::path& dir) {
  uint64_t seq = 1;
  for (const auto& [name, message] : SampleMessages()) {
    for (uint8_t mode = 0; mode < 4; ++mode) {
      const std::string secret = (mode & 1) ? kSecret : "";
      const uint64_t recipient_session = name == "hello" ? 0 : 0x1122334455667788;
      std::vector<uint8_t> frame =
          EncodeFrame({0x8877665544332211, recipient_session, seq++, message}, secret);
      if (mode & 2) frame.resize(frame.size() - kMacBytes);
      frame.insert(frame.begin(), mode);
      RETURN_IF_ERROR(WriteBytes(dir / (name + "_mode" + std::to_string(mode)), frame));
    }
  }
  return pd::OkStatus();
}

pd::model::NamedTensor Tensor(std::string name, pd::model::DType dtype,
                              std::vector<int64_t> shape) {
  size_t num_bytes = pd::model::DTypeSize(dtype);
  for (int64_t dim : shape) num_bytes *= static_cast<size_t>(dim);
  std::vector<uint8_t> bytes(num_bytes);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 1);
  return {std::move(name), dtype, std::move(shape), std::move(bytes)};
}

pd::Status WriteSafetensorsSeeds(const fs::path& dir) {
  using pd::model::DType;
  RETURN_IF_ERROR(
      pd::model::WriteSafetensors((dir / "one_f32").string(), {Tensor("w", DType::kF32, {2, 3})}));
  RETURN_IF_ERROR(pd::model::WriteSafetensors(
      (dir / "mixed").string(),
      {Tensor("model.embed_tokens.weight", DType::kBF16, {4, 2}),
       Tensor("model.norm.weight", DType::kF16, {2}), Tensor("scalar", DType::kF32, {}),
       Tensor("empty", DType::kF32, {0, 5})}));
  return pd::model::WriteSafetensors((dir / "no_tensors").string(), {});
}

pd::Status WriteTokenizerSeeds(const fs::path& dir) {
  using pd::model::testing::SmallTokenizer;
  RETURN_IF_ERROR(
      pd::WriteStringToFile((dir / "small_string_merges.json").string(), SmallTokenizer().dump(1)));
  RETURN_IF_ERROR(pd::WriteStringToFile((dir / "small_pair_merges.json").string(),
                                        SmallTokenizer(/*merges_as_pairs=*/true).dump()));
  const pd::model::testing::ScratchDir scratch("fuzz_seed_corpus");
  RETURN_IF_ERROR(pd::model::WriteSyntheticTokenizer(scratch.path(), pd::model::Arch::kQwen2, 300));
  ASSIGN_OR_RETURN(std::string text, pd::ReadFileToString(scratch.path() + "/tokenizer.json"));
  return pd::WriteStringToFile((dir / "synthetic_qwen2.json").string(), text);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  for (const char* sub : {"wire", "safetensors", "tokenizer"}) {
    std::error_code error;
    fs::create_directories(root / sub, error);
    if (error) {
      std::fprintf(stderr, "%s: %s\n", (root / sub).c_str(), error.message().c_str());
      return 1;
    }
  }
  pd::Status status = WriteWireSeeds(root / "wire");
  if (status.ok()) status = WriteSafetensorsSeeds(root / "safetensors");
  if (status.ok()) status = WriteTokenizerSeeds(root / "tokenizer");
  if (!status.ok()) {
    std::fprintf(stderr, "fuzz_seed_corpus: %s\n", status.ToString().c_str());
    return 1;
  }
  std::printf("seeds written under %s\n", root.c_str());
  return 0;
}
