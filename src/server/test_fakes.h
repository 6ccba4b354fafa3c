// Fakes for the server's unit tests: a byte-level tokenizer and an AsyncEngine that "generates"
// a scripted token sequence on its own thread.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <set>
#include <thread>

#include "common/mutex.h"
#include "engine/async_engine.h"
#include "model/tokenizer.h"

namespace pd::server::testing {

// ids 0..255 are bytes; 256 <|endoftext|> (eos), 257 <|im_start|>, 258 <|im_end|>.
class FakeTokenizer final : public model::Tokenizer {
 public:
  static constexpr int32_t kEos = 256;
  std::vector<int32_t> Encode(std::string_view text) const override;
  Result<std::string> Decode(std::span<const int32_t> ids,
                             bool skip_special = false) const override;
  Result<std::string> TokenBytes(int32_t id) const override;
  std::string TokenString(int32_t id) const override;
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  int vocab_size() const override { return 259; }
  bool IsSpecial(int32_t id) const override { return id >= 256; }
  std::optional<int32_t> bos_token_id() const override { return std::nullopt; }
  std::optional<int32_t> eos_token_id() const override { return kEos; }
  bool adds_bos_token() const override { return false; }
  // ChatML, rendered by the template engine as a checkpoint's template is; it also writes the
  // tools, honours enable_thinking = false and raises on a first "developer" message.
  const model::ChatTemplate* chat_template() const override;
  Result<std::string> ApplyChatTemplate(const model::ChatInput& input) const override;
};

struct FakeEngineOptions {
  std::vector<int32_t> script;  // token i of every request is script[i % size]
  int max_pending = 64;
  int max_running = 1000;  // requests stepped at once; the rest wait
  int num_total_pages = 1000;
  int step_interval_us = 200;  // simulated compute per step
  bool start_held = false;     // produce nothing until Release()
};

// Thread safety: every method may be called from any thread.
class FakeAsyncEngine final : public engine::AsyncEngine {
 public:
  explicit FakeAsyncEngine(FakeEngineOptions options);
  ~FakeAsyncEngine() override;

  Result<int64_t> Submit(std::vector<int32_t> prompt_ids, const engine::SamplingParams& sampling,
                         engine::OutputCallback on_output) override EXCLUDES(mu_);
  void Abort(int64_t request_id) override EXCLUDES(mu_);
  engine::EngineStats stats() const override EXCLUDES(mu_);
  const model::ModelConfig& config() const override { return config_; }
  void Shutdown() override EXCLUDES(mu_);

  void Hold() EXCLUDES(mu_);
  void Release() EXCLUDES(mu_);
  std::set<int64_t> aborted() const EXCLUDES(mu_);
  int64_t num_submitted() const EXCLUDES(mu_);
  int num_active() const EXCLUDES(mu_);
  engine::SamplingParams last_sampling() const EXCLUDES(mu_);
  std::vector<int32_t> last_prompt() const EXCLUDES(mu_);

 private:
  struct Req {
    int64_t id;
    std::vector<int32_t> prompt;
    engine::SamplingParams sampling;
    engine::OutputCallback callback;
    int generated = 0;
    bool abort = false;
  };
  void Loop() EXCLUDES(mu_);
  bool HasAbortLocked() const REQUIRES(mu_);
  engine::RequestOutput StepOne(Req& r);

  const FakeEngineOptions options_;
  model::ModelConfig config_;
  mutable Mutex mu_;
  CondVar cv_;
  std::map<int64_t, Req> active_ GUARDED_BY(mu_);
  std::set<int64_t> aborted_ GUARDED_BY(mu_);
  engine::SamplingParams last_sampling_ GUARDED_BY(mu_);
  std::vector<int32_t> last_prompt_ GUARDED_BY(mu_);
  int64_t next_id_ GUARDED_BY(mu_) = 1;
  bool held_ GUARDED_BY(mu_) = false;
  bool shutdown_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pd::server::testing
