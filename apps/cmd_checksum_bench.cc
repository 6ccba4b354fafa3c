// pdserve checksum-bench: what --kv-checksum costs per layer. CRC32C throughput (the SSE4.2
// `crc32` path Crc32c picks on this CPU, and the table fallback) over buffers of one layer's KV,
// each size best of --repeats, with the time one layer's check takes on each side.
//
//   pdserve checksum-bench [--bytes N...] [--repeats R] [--json]
//
// Default sizes: one layer's KV (K and V) of models/demo-llama (2 KV heads x 32 dims, f32: 512
// bytes a token) at 512 and 4096 tokens (256 KiB, 2 MiB); an 8-KV-head x 128-dim bf16 model (4 KiB
// a token) has 2 MiB at 512 tokens and 16 MiB at 4096.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "apps/command.h"
#include "common/crc32c.h"

namespace pd::apps {
namespace {

struct ChecksumBenchOptions {
  std::vector<uint64_t> bytes = {256 << 10, 2 << 20, 16 << 20};
  int repeats = 5;
  bool json = false;
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The best GB/s of `repeats` passes of `crc` over `buf`, each at least ~20 ms.
double BestGbps(uint32_t (*crc)(const void*, size_t, uint32_t), const std::vector<uint8_t>& buf,
                int repeats, uint32_t* sink) {
  const int passes =
      std::max<int>(1, static_cast<int>((64 << 20) / std::max<size_t>(1, buf.size())));
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const double t0 = Now();
    for (int p = 0; p < passes; ++p) *sink ^= crc(buf.data(), buf.size(), *sink);
    const double s = Now() - t0;
    best = std::max(best, static_cast<double>(buf.size()) * passes / s / 1e9);
  }
  return best;
}

int RunChecksumBench(const ChecksumBenchOptions& o) {
  std::mt19937 rng(1);
  uint32_t sink = 0;
  nlohmann::json rows = nlohmann::json::array();
  if (!o.json) {
    std::printf("CRC32C on this CPU: %s\n", Crc32cImplementation());
    std::printf("%12s %12s %14s %12s %14s\n", "layer bytes", "sse4.2 GB/s", "sse4.2 us/layer",
                "table GB/s", "table us/layer");
  }
  std::vector<uint64_t> sizes = o.bytes;
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  for (uint64_t bytes : sizes) {
    std::vector<uint8_t> buf(bytes);
    for (auto& b : buf) b = static_cast<uint8_t>(rng());
    const double hw =
        Crc32cHardwareAvailable() ? BestGbps(&Crc32cSse42, buf, o.repeats, &sink) : 0.0;
    const double table = BestGbps(&Crc32cTable, buf, o.repeats, &sink);
    const double hw_us = hw > 0 ? bytes / hw / 1e3 : 0.0;
    const double table_us = bytes / table / 1e3;
    rows.push_back({{"layer_bytes", bytes},
                    {"sse42_gbps", hw},
                    {"sse42_us_per_layer", hw_us},
                    {"table_gbps", table},
                    {"table_us_per_layer", table_us}});
    if (!o.json) {
      std::printf("%12llu %12.2f %14.1f %12.2f %14.1f\n", static_cast<unsigned long long>(bytes),
                  hw, hw_us, table, table_us);
    }
  }
  if (o.json) {
    std::printf(
        "%s\n",
        nlohmann::json{{"implementation", Crc32cImplementation()}, {"rows", rows}}.dump(2).c_str());
  }
  return sink == 0x5eed ? 2 : 0;  // keeps the CRCs from being optimised away
}

CommandRunner SetUpCommand(CLI::App* app) {
  auto o = std::make_shared<ChecksumBenchOptions>();
  app->add_option("--bytes", o->bytes, "buffer sizes (one layer's KV)")->capture_default_str();
  app->add_option("--repeats", o->repeats, "measurements per size (best kept)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_flag("--json", o->json, "print the rows as JSON");
  return [o] { return RunChecksumBench(*o); };
}

// The name has a dash, so register directly rather than through PD_REGISTER_COMMAND.
const bool kRegistered = RegisterCommand(
    {"checksum-bench", "CRC32C throughput per KV layer (what --kv-checksum costs)", SetUpCommand});

}  // namespace

}  // namespace pd::apps
