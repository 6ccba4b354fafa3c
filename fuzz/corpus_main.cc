// Replays a fuzz target's corpus without libFuzzer: feeds every file named on the command line,
// or found (recursively) in a directory named there, to LLVMFuzzerTestOneInput once. A crash, a
// sanitizer report or an abort in the harness fails the run; so does finding no input at all (a
// missing corpus must not pass as a clean run).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

bool ReadFile(const fs::path& path, std::vector<uint8_t>* bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  bytes->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

// The files an argument names: itself, or the regular files under it in name order.
bool CollectInputs(const std::string& arg, std::vector<fs::path>* inputs) {
  std::error_code error;
  if (fs::is_regular_file(arg, error)) {
    inputs->push_back(arg);
    return true;
  }
  if (!fs::is_directory(arg, error)) {
    std::fprintf(stderr, "%s: no such file or directory\n", arg.c_str());
    return false;
  }
  std::vector<fs::path> found;
  for (const auto& entry : fs::recursive_directory_iterator(arg, error)) {
    if (entry.is_regular_file()) found.push_back(entry.path());
  }
  if (error) {
    std::fprintf(stderr, "%s: cannot list: %s\n", arg.c_str(), error.message().c_str());
    return false;
  }
  std::sort(found.begin(), found.end());
  inputs->insert(inputs->end(), found.begin(), found.end());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    if (!CollectInputs(argv[i], &inputs)) return 1;
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "no corpus files found\n");
    return 1;
  }
  std::vector<uint8_t> bytes;
  for (const fs::path& path : inputs) {
    if (!ReadFile(path, &bytes)) {
      std::fprintf(stderr, "%s: cannot read\n", path.c_str());
      return 1;
    }
    // Print the name first so a crash is attributed to its input.
    std::fprintf(stderr, "running %s (%zu bytes)\n", path.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  }
  std::printf("%zu inputs ran without a crash\n", inputs.size());
  return 0;
}
