// DistServe's decoding engine loop (distserve/single_stage_engine.py, DecodingStageLLMEngine
// with the FCFS decoding scheduler), for replaying DistServe's runs. One loop turn:
//   1. Moves to the next of `pp` micro-batches. A sequence belongs to one micro-batch for good:
//      waiting sequences (their KV migrated) join the micro-batch whose turn it is, FCFS, while
//      max_batch_size and the KV blocks allow; when the blocks of every micro-batch and of the
//      waiting sequences exceed the capacity, the turn's newest sequence is swapped out (swapped
//      sequences rejoin first).
//   2. Launches that micro-batch (its stages run as the pipeline frees them), or, when it is
//      empty, sleeps kEmptyTurnSeconds.
//   3. Once `pp` turns are in the pipeline, blocks until the oldest launched micro-batch
//      returns; its tokens are delivered then.
//   4. Accepts handed-over prompts FCFS (while the waiting sequences hold under 5% of the blocks
//      and the prompt's blocks are free) and migrates each one's KV, awaited inside the loop:
//      the migration queues on the workers behind the micro-batch in flight.
// So at light load nearly every request joins the micro-batch whose turn follows the wait, and
// a PP 2 instance decodes one micro-batch with the other empty; the pipeline fills only when
// prompts arrive while both micro-batches hold sequences.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "planner/latency_model.h"

namespace pd::planner {

inline constexpr double kEmptyTurnSeconds = 0.003;  // SLEEP_WHEN_DECODING_NO_REQUEST
inline constexpr double kWaitingBlockShare = 0.05;  // waiting_block_prop_threshold

struct LoopStep {
  StageTimes times;
  // The engine's own time to launch the step (building the batch, the calls to the workers):
  // the loop goes on after it. Part of the first stage's time.
  double launch_s = 0.0;
};

// What the loop needs from the simulator that runs it.
class DecodeLoopHost {
 public:
  virtual ~DecodeLoopHost() = default;
  // Calls Wake(time) on the loop at `time` (not before the events of the current instant).
  virtual void WakeLoopAt(int instance, double time) = 0;
  // Seconds to migrate `req`'s prompt KV to this instance.
  virtual double MigrationSeconds(int instance, int64_t req) = 0;
  virtual void OnMigrated(int instance, double now, int64_t req) = 0;
  // A sampled token of `req`; true when the request is finished.
  virtual bool OnLoopToken(int instance, double now, int64_t req) = 0;
  // A micro-batch of `shape` enters the pipeline at `start`: its times.
  virtual LoopStep OnLaunch(int instance, double start, const StepShape& shape) = 0;
};

struct DecodeLoopOptions {
  int instance = 0;
  int pp = 1;
  int max_batch_size = 1024;
  int64_t kv_capacity_tokens = 1 << 20;
  int page_size = 16;
};

// Thread safety: not thread-safe; the simulator's single thread calls everything.
class DistServeDecodeLoop {
 public:
  DistServeDecodeLoop(const DecodeLoopOptions& options, DecodeLoopHost* host);
  // A prefill instance handed `req` over (its KV still there).
  void HandOver(double now, int64_t req, int prompt_len);
  // A wake-up the loop asked for.
  void Wake(double now);
  int load() const { return num_seqs_; }
  bool idle() const { return phase_ == Phase::kIdle; }

 private:
  enum class Phase { kIdle, kTurn, kCheckFull, kCollect, kAccept, kMigrated };
  struct Seq {
    int64_t id = 0;
    int tokens = 0;  // prompt + tokens generated: the context of its next step
  };
  struct Launched {
    int slot = -1;  // -1: an empty turn
    double done_s = 0.0;
  };
  int BlocksFor(int tokens) const { return (tokens + opt_.page_size - 1) / opt_.page_size; }
  int64_t BlocksHeld() const;  // by the micro-batches and the waiting sequences
  void Turn(double now);
  void Admit(std::vector<Seq>& slot);
  void Collect(double now);
  void Accept(double now);
  void Next(Phase phase, double when);

  DecodeLoopOptions opt_;
  DecodeLoopHost* host_;
  int64_t total_blocks_ = 0;
  Phase phase_ = Phase::kIdle;
  int cur_ = -1;
  double stage_free_s_ = 0.0;
  double last_done_s_ = 0.0;
  int num_seqs_ = 0;                     // everything handed over and not finished
  std::vector<std::vector<Seq>> slots_;  // pp micro-batches
  std::deque<Launched> pipeline_;        // launched turns, oldest first
  std::deque<Seq> waiting_, swapped_;
  std::deque<Seq> unaccepted_;  // KV still on the prefill instance
};

}  // namespace pd::planner
