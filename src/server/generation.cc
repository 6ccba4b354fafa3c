#include "server/generation.h"

#include <algorithm>

#include "common/clock.h"

namespace pd::server {

void OutputChannel::Push(const engine::RequestOutput& output, double time) {
  {
    MutexLock lock(&mu_);
    items_.push_back({output, time});
    if (notify_) notify_();
  }
  cv_.Signal();
}

void OutputChannel::SetNotify(std::function<void()> notify) {
  MutexLock lock(&mu_);
  notify_ = std::move(notify);
}

bool OutputChannel::pending() {
  MutexLock lock(&mu_);
  return !items_.empty();
}

void OutputChannel::Wait(std::vector<Item>* items, std::chrono::milliseconds timeout) {
  MutexLock lock(&mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (items_.empty()) {
    if (!cv_.WaitUntil(&mu_, deadline)) break;
  }
  while (!items_.empty()) {
    items->push_back(std::move(items_.front()));
    items_.pop_front();
  }
}

Generation::Generation(engine::AsyncEngine& engine, const model::Tokenizer& tokenizer,
                       ServingMetrics& metrics, const GenerateRequest& request,
                       int num_prompt_tokens)
    : engine_(engine),
      metrics_(metrics),
      channel_(std::make_shared<OutputChannel>()),
      generator_(tokenizer, TextGenerator::Options{request.stop, request.skip_special_tokens}),
      num_prompt_tokens_(num_prompt_tokens) {}

Result<std::unique_ptr<Generation>> Generation::Start(engine::AsyncEngine& engine,
                                                      const model::Tokenizer& tokenizer,
                                                      ServingMetrics& metrics,
                                                      std::vector<int32_t> prompt_ids,
                                                      const GenerateRequest& request) {
  const int num_prompt = static_cast<int>(prompt_ids.size());
  std::unique_ptr<Generation> gen(new Generation(engine, tokenizer, metrics, request, num_prompt));
  gen->submit_time_ = SystemClock::Get().NowSeconds();
  std::shared_ptr<OutputChannel> channel = gen->channel_;
  ASSIGN_OR_RETURN(gen->request_id_, engine.Submit(std::move(prompt_ids), request.sampling,
                                                   [channel](const engine::RequestOutput& out) {
                                                     channel->Push(out,
                                                                   SystemClock::Get().NowSeconds());
                                                   }));
  return gen;
}

void Generation::SetOnNews(std::function<void()> on_news) {
  channel_->SetNotify(on_news);
  if (on_news && channel_->pending()) on_news();
}

Generation::~Generation() {
  channel_->SetNotify(nullptr);
  if (!engine_done_ && request_id_ >= 0) engine_.Abort(request_id_);
  if (!generator_.finished()) RecordFinished("abort");
}

void Generation::RecordTokens(const OutputChannel::Item& item, int num_new_tokens) {
  const Labels labels = metrics_.model_labels();
  if (!queue_time_recorded_ && item.output.first_scheduled_time > 0.0) {
    queue_time_recorded_ = true;
    metrics_.queue_time->Observe(labels,
                                 std::max(0.0, item.output.first_scheduled_time - submit_time_));
  }
  if (num_new_tokens <= 0) return;
  if (!first_token_seen_) {
    first_token_seen_ = true;
    metrics_.ttft->Observe(labels, std::max(0.0, item.time - submit_time_));
  } else {
    metrics_.inter_token_latency->Observe(labels, std::max(0.0, item.time - last_token_time_));
  }
  last_token_time_ = item.time;
}

void Generation::RecordFinished(const std::string& reason) {
  const Labels labels = metrics_.model_labels();
  metrics_.e2e_latency->Observe(labels,
                                std::max(0.0, SystemClock::Get().NowSeconds() - submit_time_));
  metrics_.prompt_tokens->Increment(labels, num_prompt_tokens_);
  metrics_.generation_tokens->Increment(labels, generator_.num_generated_tokens());
  metrics_.RecordFinished(reason == "error" ? "abort" : reason);
}

std::vector<TextDelta> Generation::Next(std::chrono::milliseconds timeout) {
  std::vector<TextDelta> deltas;
  if (generator_.finished()) return deltas;
  std::vector<OutputChannel::Item> items;
  channel_->Wait(&items, timeout);
  for (const auto& item : items) {
    if (item.output.finished()) engine_done_ = true;
    num_cached_tokens_ = std::max(num_cached_tokens_, item.output.num_cached_tokens);
    const int before = generator_.num_generated_tokens();
    TextDelta delta = generator_.Consume(item.output);
    RecordTokens(item, generator_.num_generated_tokens() - before);
    if (delta.abort_engine && !engine_done_) {
      engine_.Abort(request_id_);
      engine_done_ = true;
    }
    if (delta.finished) RecordFinished(delta.finish_reason);
    if (!delta.empty()) deltas.push_back(std::move(delta));
    if (generator_.finished()) break;
  }
  return deltas;
}

TextDelta Generation::Abort() {
  if (!engine_done_ && request_id_ >= 0) {
    engine_.Abort(request_id_);
    engine_done_ = true;
  }
  if (generator_.finished()) return TextDelta();
  TextDelta delta = generator_.Abort();
  RecordFinished("abort");
  return delta;
}

}  // namespace pd::server
