// Helpers shared by src/model tests: a scratch directory and raw safetensors files.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace pd::model::testing {

// A fresh directory under /tmp, removed with everything in it when the object dies.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "pd_model_test_XXXXXX").string();
    char* p = ::mkdtemp(tmpl.data());
    path_ = p != nullptr ? p : "";
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Writes a safetensors file from a raw header text (not validated, not padded) and data bytes.
inline void WriteRawSafetensors(const std::string& path, const std::string& header,
                                const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header << data;
}

}  // namespace pd::model::testing
