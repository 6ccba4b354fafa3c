// Private to src/engine: an Engine whose Step can be run in its three phases (schedule, forward,
// sample and update), so that the data-parallel engine (dp_engine.h) schedules each rank's
// sub-engine, runs all their forward passes at once, then samples each.
#pragma once

#include <memory>
#include <vector>

#include "common/status.h"
#include "engine/engine.h"
#include "engine/model_runner.h"

namespace pd::engine {

// Thread safety: as Engine; one thread calls every method (Step = BeginStep, runner().Forward
// over step_batch() into step_output(), EndStep).
class SteppedEngine : public Engine {
 public:
  // Schedules the next step; the requests aborted since the last step go to outputs. False when
  // nothing runs (the step is then over and EndStep must not be called).
  virtual bool BeginStep(std::vector<RequestOutput>* outputs) = 0;
  // The batch BeginStep scheduled, and where its forward pass writes.
  virtual const ForwardBatch& step_batch() const = 0;
  virtual ForwardOutput* step_output() = 0;
  // Samples from step_output() and updates the scheduler, after the step's forward pass returned
  // `forward` (an error fails every request of the batch).
  virtual void EndStep(const Status& forward, std::vector<RequestOutput>* outputs) = 0;
};

class Drafter;  // spec_drafter.h

// Engine::CreateWithRunner, as a SteppedEngine.
Result<std::unique_ptr<SteppedEngine>> CreateSteppedEngine(std::unique_ptr<ModelRunner> runner,
                                                           const EngineOptions& options);
// The same with the drafter of method "draft_model" (a DraftModel) or "mtp" (an MtpDrafter):
// required then, null otherwise.
Result<std::unique_ptr<SteppedEngine>> CreateSteppedEngine(std::unique_ptr<ModelRunner> runner,
                                                           const EngineOptions& options,
                                                           std::unique_ptr<Drafter> draft);

}  // namespace pd::engine
