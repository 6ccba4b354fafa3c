#include "server/test_fakes.h"

#include <chrono>

namespace pd::server::testing {

namespace {
const char* kSpecials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
}

std::vector<int32_t> FakeTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < text.size();) {
    bool special = false;
    for (int s = 0; s < 3; ++s) {
      std::string_view sp = kSpecials[s];
      if (text.substr(i, sp.size()) == sp) {
        ids.push_back(256 + s);
        i += sp.size();
        special = true;
        break;
      }
    }
    if (!special) ids.push_back(static_cast<unsigned char>(text[i++]));
  }
  return ids;
}

Result<std::string> FakeTokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (skip_special && IsSpecial(id)) continue;
    ASSIGN_OR_RETURN(std::string piece, TokenBytes(id));
    out += piece;
  }
  return out;
}

Result<std::string> FakeTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    return InvalidArgument("token id " + std::to_string(id) + " outside vocabulary");
  if (id >= 256) return std::string(kSpecials[id - 256]);
  return std::string(1, static_cast<char>(id));
}

std::string FakeTokenizer::TokenString(int32_t id) const {
  auto b = TokenBytes(id);
  return b.ok() ? *b : "";
}

std::optional<int32_t> FakeTokenizer::TokenToId(std::string_view token) const {
  auto ids = Encode(token);
  if (ids.size() == 1) return ids[0];
  return std::nullopt;
}

const model::ChatTemplate* FakeTokenizer::chat_template() const {
  static const model::ChatTemplate* const kChatML =
      model::ChatTemplate::Create(
          "{% if messages[0].role == 'developer' %}{{ raise_exception('no developer role') }}"
          "{% endif %}{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}"
          "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}"
          "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}",
          {}, "FakeTokenizer")
          .value()
          .release();
  return kChatML;
}

Result<std::string> FakeTokenizer::ApplyChatTemplate(const model::ChatInput& input) const {
  return chat_template()->Render(input);
}

FakeAsyncEngine::FakeAsyncEngine(FakeEngineOptions options) : options_(std::move(options)) {
  config_.vocab_size = 259;
  config_.eos_token_id = FakeTokenizer::kEos;
  held_ = options_.start_held;
  thread_ = std::thread([this] { Loop(); });
}

FakeAsyncEngine::~FakeAsyncEngine() { Shutdown(); }

void FakeAsyncEngine::Shutdown() {
  {
    MutexLock lock(&mu_);
    if (shutdown_) return;
    shutdown_ = true;
  }
  cv_.SignalAll();
  thread_.join();
  std::map<int64_t, Req> left;
  {
    MutexLock lock(&mu_);
    left.swap(active_);
  }
  for (auto& [id, r] : left) {
    engine::RequestOutput out;
    out.request_id = id;
    out.finish_reason = engine::FinishReason::kAbort;
    r.callback(out);
  }
}

Result<int64_t> FakeAsyncEngine::Submit(std::vector<int32_t> prompt_ids,
                                        const engine::SamplingParams& sampling,
                                        engine::OutputCallback on_output) {
  MutexLock lock(&mu_);
  if (shutdown_) return Unavailable("engine is shut down");
  if (static_cast<int>(active_.size()) >= options_.max_pending)
    return ResourceExhausted(std::to_string(options_.max_pending) + " requests pending");
  if (prompt_ids.empty()) return InvalidArgument("empty prompt");
  int64_t id = next_id_++;
  last_sampling_ = sampling;
  last_prompt_ = prompt_ids;
  active_.emplace(id, Req{id, std::move(prompt_ids), sampling, std::move(on_output)});
  cv_.SignalAll();
  return id;
}

void FakeAsyncEngine::Abort(int64_t request_id) {
  MutexLock lock(&mu_);
  aborted_.insert(request_id);
  auto it = active_.find(request_id);
  if (it != active_.end()) it->second.abort = true;
  cv_.SignalAll();
}

engine::EngineStats FakeAsyncEngine::stats() const {
  MutexLock lock(&mu_);
  engine::EngineStats s;
  s.num_running = std::min<int>(static_cast<int>(active_.size()), options_.max_running);
  s.num_waiting = static_cast<int>(active_.size()) - s.num_running;
  s.num_total_pages = options_.num_total_pages;
  s.num_free_pages = options_.num_total_pages - s.num_running;
  return s;
}

void FakeAsyncEngine::Hold() {
  MutexLock lock(&mu_);
  held_ = true;
}

void FakeAsyncEngine::Release() {
  {
    MutexLock lock(&mu_);
    held_ = false;
  }
  cv_.SignalAll();
}

std::set<int64_t> FakeAsyncEngine::aborted() const {
  MutexLock lock(&mu_);
  return aborted_;
}
int64_t FakeAsyncEngine::num_submitted() const {
  MutexLock lock(&mu_);
  return next_id_ - 1;
}
int FakeAsyncEngine::num_active() const {
  MutexLock lock(&mu_);
  return static_cast<int>(active_.size());
}
engine::SamplingParams FakeAsyncEngine::last_sampling() const {
  MutexLock lock(&mu_);
  return last_sampling_;
}
std::vector<int32_t> FakeAsyncEngine::last_prompt() const {
  MutexLock lock(&mu_);
  return last_prompt_;
}

engine::RequestOutput FakeAsyncEngine::StepOne(Req& r) {
  engine::RequestOutput out;
  out.request_id = r.id;
  out.num_prompt_tokens = static_cast<int>(r.prompt.size());
  out.first_scheduled_time = 1e-9;
  if (r.abort) {
    out.finish_reason = engine::FinishReason::kAbort;
    out.num_generated_tokens = r.generated;
    return out;
  }
  const int32_t token = options_.script[r.generated % options_.script.size()];
  ++r.generated;
  out.new_token_ids = {token};
  out.num_generated_tokens = r.generated;
  if (r.sampling.logprobs >= 0) {
    engine::TokenLogprob lp{token, -0.25f, {}};
    for (int k = 0; k < r.sampling.logprobs; ++k)
      lp.top.emplace_back((token + k) % 256, -0.25f - 0.5f * k);
    out.logprobs.push_back(lp);
  }
  if (token == FakeTokenizer::kEos && !r.sampling.ignore_eos) {
    out.finish_reason = engine::FinishReason::kStop;
    out.stop_token_id = token;
  } else if (r.generated >= r.sampling.max_tokens) {
    out.finish_reason = engine::FinishReason::kLength;
  }
  return out;
}

bool FakeAsyncEngine::HasAbortLocked() const {
  for (const auto& [id, r] : active_)
    if (r.abort) return true;
  return false;
}

void FakeAsyncEngine::Loop() {
  MutexLock lock(&mu_);
  for (;;) {
    while (!shutdown_ && (active_.empty() || (held_ && !HasAbortLocked()))) cv_.Wait(&mu_);
    if (shutdown_) return;
    std::vector<std::pair<engine::OutputCallback, engine::RequestOutput>> outs;
    int n = 0;
    for (auto it = active_.begin(); it != active_.end() && n < options_.max_running; ++n) {
      if (held_ && !it->second.abort) {
        ++it;
        continue;
      }
      engine::RequestOutput out = StepOne(it->second);
      outs.emplace_back(it->second.callback, out);
      it = out.finished() ? active_.erase(it) : std::next(it);
    }
    lock.Unlock();
    for (auto& [cb, out] : outs) cb(out);  // like the real engine: callbacks on the engine thread
    std::this_thread::sleep_for(std::chrono::microseconds(options_.step_interval_us));
    lock.Lock();
  }
}

}  // namespace pd::server::testing
