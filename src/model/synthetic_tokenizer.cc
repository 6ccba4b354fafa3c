// WriteSyntheticTokenizer: a working byte-level BPE tokenizer for random-weight test models.
// Ids: the 256 byte tokens (id = byte value), then merges learned on a small embedded corpus,
// then "<|reserved_special_token_N|>" fillers (as Llama-3 does), then the arch's special tokens
// at the very top (a rule the model writer's config.json shares).
#include <algorithm>
#include <filesystem>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "model/bpe.h"
#include "model/synthetic_tokenizer_arch.h"
#include "model/tokenizer.h"
#include "model/tokenizer_byte_level.h"
#include "model/tokenizer_corpus.h"
#include "model/tokenizer_impl.h"
#include "model/tokenizer_regex.h"

namespace pd::model {
namespace {

using internal::ByteToUnicode;

// At most this many merges, so even a 152k-id tokenizer is written and loaded quickly.
constexpr int kMaxLearnedMerges = 4000;

// The chat templates HF checkpoints of the two families ship, as in their tokenizer_config.json.
const char kChatMLJinjaTemplate[] =
    R"({% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})";

const char kLlama3JinjaTemplate[] =
    R"({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %})";

struct ArchTokens {
  std::vector<std::string> specials;  // occupy ids vocab_size - specials.size() .. vocab_size - 1
  std::string bos;
  std::string eos;
  std::string pad;  // empty: the first special token
  std::string tokenizer_class = "PreTrainedTokenizerFast";
  std::string_view split_pattern;
  std::string_view chat_template;
  bool ignore_merges = false;
  bool add_bos = false;  // raw prompts get bos (Llama 3's post-processor adds it)
};

ArchTokens TokensFor(Arch arch) {
  ArchTokens t;
  if (arch == Arch::kLlama) {
    t.specials = {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"};
    t.bos = "<|begin_of_text|>";
    t.eos = "<|eot_id|>";
    t.split_pattern = internal::kLlama3SplitPattern;
    t.chat_template = kLlama3JinjaTemplate;
    t.ignore_merges = true;
    t.add_bos = true;
  } else if (arch == Arch::kDeepseekV3) {
    // DeepSeek-V3's special tokens and chat template; its tokenizer_config.json adds bos to raw
    // prompts, and its template writes bos itself.
    t.specials.assign(internal::kDeepseekV3SpecialTokens,
                      internal::kDeepseekV3SpecialTokens + internal::kNumDeepseekV3SpecialTokens);
    t.bos = t.specials[0];
    t.eos = t.specials[1];
    t.pad = t.eos;
    t.split_pattern = internal::kQwen2SplitPattern;
    t.chat_template = internal::kDeepseekV3ChatTemplate;
    t.add_bos = true;
    t.tokenizer_class = "LlamaTokenizerFast";
  } else {  // qwen2, qwen3, qwen3_moe
    t.specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    t.bos = "<|endoftext|>";
    t.eos = "<|im_end|>";
    t.split_pattern = internal::kQwen2SplitPattern;
    t.chat_template = kChatMLJinjaTemplate;
  }
  return t;
}

std::string Json(std::string_view s) { return nlohmann::json(s).dump(); }

struct Vocab {
  std::vector<std::string> tokens;  // byte-level strings by id (model.vocab)
  std::vector<std::pair<std::string, std::string>> merges;  // byte-level strings
};

Result<Vocab> LearnVocab(const ArchTokens& arch, int max_merges) {
  ASSIGN_OR_RETURN(auto splitter, internal::RegexSplitter::Create(arch.split_pattern));
  std::vector<std::string_view> words;
  splitter->Split(internal::kSyntheticTokenizerCorpus, &words);
  std::unordered_map<std::string, int64_t> counts;
  for (std::string_view w : words) ++counts[std::string(w)];
  const auto learned = internal::TrainBpe(counts, max_merges);

  Vocab vocab;
  std::unordered_map<std::string, int> ids;
  for (int b = 0; b < 256; ++b) {
    vocab.tokens.push_back(ByteToUnicode()[b]);
    ids.emplace(vocab.tokens.back(), b);
  }
  for (const internal::LearnedMerge& m : learned) {
    std::string left = internal::ByteLevelEncode(m.left);
    std::string right = internal::ByteLevelEncode(m.right);
    std::string merged = left + right;
    if (ids.emplace(merged, static_cast<int>(vocab.tokens.size())).second) {
      vocab.tokens.push_back(std::move(merged));
    }
    vocab.merges.emplace_back(std::move(left), std::move(right));
  }
  return vocab;
}

void AppendAddedToken(int id, const std::string& content, bool first, std::string* out) {
  if (!first) *out += ",\n";
  *out += "    {\"id\": " + std::to_string(id) + ", \"content\": " + Json(content) +
          ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
          "\"normalized\": false, \"special\": true}";
}

std::string TokenizerJson(const ArchTokens& arch, const Vocab& vocab, int vocab_size) {
  const int first_special = vocab_size - static_cast<int>(arch.specials.size());
  const int num_model_tokens = static_cast<int>(vocab.tokens.size());
  std::string out = "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n";
  out += "  \"added_tokens\": [\n";
  bool first = true;
  for (int id = num_model_tokens; id < first_special; ++id, first = false) {
    AppendAddedToken(id, "<|reserved_special_token_" + std::to_string(id - num_model_tokens) + "|>",
                     first, &out);
  }
  for (size_t i = 0; i < arch.specials.size(); ++i, first = false) {
    AppendAddedToken(first_special + static_cast<int>(i), arch.specials[i], first, &out);
  }
  out += "\n  ],\n  \"normalizer\": null,\n";
  const std::string byte_level =
      R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false})";
  out +=
      "  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
      "\"pattern\": {\"Regex\": " +
      Json(arch.split_pattern) + "}, \"behavior\": \"Isolated\", \"invert\": false}, " +
      byte_level + "]},\n";
  out += "  \"post_processor\": " + byte_level + ",\n  \"decoder\": " + byte_level + ",\n";
  out +=
      "  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
      "\"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, \"fuse_unk\": false, "
      "\"byte_fallback\": false, \"ignore_merges\": ";
  out += arch.ignore_merges ? "true" : "false";
  out += ",\n    \"vocab\": {";
  for (int id = 0; id < num_model_tokens; ++id) {
    out +=
        (id == 0 ? "\n      " : ",\n      ") + Json(vocab.tokens[id]) + ": " + std::to_string(id);
  }
  out += "\n    },\n    \"merges\": [";
  // "left right" strings, which every tokenizers version reads (byte-level tokens never hold a
  // space: the space byte is "Ġ").
  for (size_t i = 0; i < vocab.merges.size(); ++i) {
    out += (i == 0 ? "\n      " : ",\n      ") +
           Json(vocab.merges[i].first + " " + vocab.merges[i].second);
  }
  out += "\n    ]\n  }\n}\n";
  return out;
}

std::string TokenizerConfigJson(const ArchTokens& arch) {
  nlohmann::ordered_json config;
  config["add_bos_token"] = arch.add_bos;
  config["add_eos_token"] = false;
  config["bos_token"] = arch.bos;
  config["eos_token"] = arch.eos;
  config["pad_token"] = arch.pad.empty() ? arch.specials.front() : arch.pad;
  config["chat_template"] = std::string(arch.chat_template);
  config["clean_up_tokenization_spaces"] = false;
  config["model_max_length"] = 131072;
  config["tokenizer_class"] = arch.tokenizer_class;
  return config.dump(2) + "\n";
}

int IdOf(const ArchTokens& t, const std::string& token, int vocab_size) {
  const auto it = std::find(t.specials.begin(), t.specials.end(), token);
  return vocab_size - static_cast<int>(t.specials.size()) +
         static_cast<int>(it - t.specials.begin());
}

}  // namespace

SpecialTokenIds SyntheticSpecialTokenIds(Arch arch, int vocab_size) {
  const ArchTokens t = TokensFor(arch);
  return {IdOf(t, t.bos, vocab_size), IdOf(t, t.eos, vocab_size)};
}

Status WriteSyntheticTokenizer(const std::string& model_dir, Arch arch, int vocab_size) {
  const ArchTokens tokens = TokensFor(arch);
  const int min_vocab = 256 + static_cast<int>(tokens.specials.size()) + 1;
  if (vocab_size < min_vocab) {
    return InvalidArgument("WriteSyntheticTokenizer: vocab_size " + std::to_string(vocab_size) +
                           " is too small for " + std::string(ArchName(arch)) + ": need at least " +
                           std::to_string(min_vocab) + " (256 bytes + " +
                           std::to_string(tokens.specials.size()) + " special tokens + 1 merge)");
  }
  const int budget = vocab_size - 256 - static_cast<int>(tokens.specials.size());
  ASSIGN_OR_RETURN(Vocab vocab, LearnVocab(tokens, std::min(budget, kMaxLearnedMerges)));
  std::error_code ec;
  std::filesystem::create_directories(model_dir, ec);
  if (ec) return IoError(model_dir + ": cannot create directory: " + ec.message());
  RETURN_IF_ERROR(
      WriteStringToFile(model_dir + "/tokenizer.json", TokenizerJson(tokens, vocab, vocab_size)));
  return WriteStringToFile(model_dir + "/tokenizer_config.json", TokenizerConfigJson(tokens));
}

}  // namespace pd::model
