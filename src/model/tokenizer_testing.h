// Test helpers: a small hand-written byte-level BPE tokenizer.json and a scratch directory.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "model/tokenizer_byte_level.h"

namespace pd::model::testing {

// The hand-written tokenizer the tests work ids out on:
//   ids 0..255: the byte tokens, id = byte value ("Ġ" = 32 is the space byte)
//   256 "he"  257 "ll"  258 "hell"  259 "hello"  260 "Ġw"  261 "or"  262 "Ġwor"  263 "ld"
//   merges in rank order: h e, l l, he ll, hell o, Ġ w, o r, Ġw or, l d
//   264 "<|end|>" (special), 265 "<|user|>" (special), 266 "<|end|>!" (not special),
//   267 "xyz" (vocab only, no merge makes it)
inline nlohmann::json SmallTokenizer(bool merges_as_pairs = false) {
  nlohmann::json vocab = nlohmann::json::object();
  const auto& alphabet = pd::model::internal::ByteToUnicode();
  for (int b = 0; b < 256; ++b) vocab[alphabet[b]] = b;
  const char* merged[] = {"he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "ld"};
  for (int i = 0; i < 8; ++i) vocab[merged[i]] = 256 + i;
  vocab["xyz"] = 267;
  const char* pairs[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"},
                            {"Ġ", "w"}, {"o", "r"}, {"Ġw", "or"}, {"l", "d"}};
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& p : pairs) {
    if (merges_as_pairs) {
      merges.push_back({p[0], p[1]});
    } else {
      merges.push_back(std::string(p[0]) + " " + p[1]);
    }
  }
  auto added = [](int id, const char* content, bool special) {
    return nlohmann::json{{"id", id},          {"content", content}, {"single_word", false},
                          {"lstrip", false},   {"rstrip", false},    {"normalized", false},
                          {"special", special}};
  };
  nlohmann::json root;
  root["version"] = "1.0";
  root["added_tokens"] = {added(264, "<|end|>", true), added(265, "<|user|>", true),
                          added(266, "<|end|>!", false)};
  root["normalizer"] = nullptr;
  root["pre_tokenizer"] = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", true}};
  root["decoder"] = {{"type", "ByteLevel"}};
  root["model"] = {{"type", "BPE"},
                   {"dropout", nullptr},
                   {"unk_token", nullptr},
                   {"vocab", vocab},
                   {"merges", merges}};
  return root;
}

// A fresh directory under the system temp dir, removed when the object goes away.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_((std::filesystem::temp_directory_path() /
               ("pd_tok_" + name + "_" + std::to_string(::getpid())))
                  .string()) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace pd::model::testing
