// Private to src/engine: the sparse MoE MLP of one layer over a step's tokens, with per-expert
// token grouping.
//
// For T tokens h (T, hidden): router logits (T, num_experts) in f32, RouteTokens (moe_routing.h),
// then each selected expert's tokens gathered into consecutive rows (expert by expert, tokens in
// step order), that expert's gate|up matmul, SiLU(gate) * up, its down matmul, and per token the
// weighted sum of its experts' outputs in its selection order, plus the shared expert's output
// (deepseek_v3) computed on every token. Experts no token chose are neither computed nor read.
//
// Fast kernels: all experts' gate|up work is one ThreadPool::ParallelFor over (expert, run of
// panel groups) items dealt to the threads as they ask, and so is all down work; a decode step
// wakes the pool three times per MoE layer (router, gate|up, down) whatever top_k is. Every
// output row is computed whole by one kernel call per item whose panel kernel is independent of
// the rows computed with it (kernels.h), and a token's sum runs in a fixed order, so a token's
// output does not depend on which other tokens share the step.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/cache_warm.h"
#include "engine/kernels.h"
#include "engine/model_runner_weights.h"
#include "model/config.h"

namespace pd::engine {

class ThreadPool;

// How MoeForward multiplies. isa == nullptr: the reference kernels (ref::Matmul, or
// ref::MatmulBf16Dot with bf16_dot) on the row-major weights, single-threaded.
struct MoeExec {
  ThreadPool* pool = nullptr;
  const kernels::IsaKernels* isa = nullptr;         // the experts' kernels (bf16-dot or not)
  const kernels::IsaKernels* router_isa = nullptr;  // f32 kernels for the router logits
  bool bf16_dot = false;
};

// One matmul slice: out (rows, [n_begin, n_end)) = x (rows, k) @ w^T over those columns.
struct MoeMatmulItem {
  const kernels::WeightMatrix* w;
  const float* x;
  int64_t ldx, rows;
  float* out;
  int64_t ldo, n_begin, n_end;
};

// One expert's matmul of a step: x (rows, k) row stride ldx -> out, row stride ldo.
struct MoeExpertJob {
  const RunnerExpert* ex;
  const float* x;
  int64_t ldx, rows;
  float* out;
  int64_t ldo;
};

// Buffers of MoeForward, grown on demand and reused.
struct MoeScratch {
  std::vector<float> logits;          // (T, num_experts)
  std::vector<int32_t> experts;       // (T, top_k) chosen experts
  std::vector<float> weights;         // (T, top_k) their weights
  std::vector<float> route;           // 2 * num_experts: RouteTokens' scratch
  std::vector<int32_t> offset, fill;  // (num_experts + 1) first grouped row of each expert
  std::vector<int32_t> row_token;     // (T * top_k) token of each grouped row
  std::vector<int32_t> slot_row;      // (T * top_k) grouped row of each (token, slot)
  std::vector<float> xg;              // (T * top_k, hidden) gathered inputs
  std::vector<float> gu;              // (T * top_k, 2 * inter) gate|up, then SiLU(gate) * up
  std::vector<float> yg;              // (T * top_k, hidden) expert outputs
  std::vector<float> h_all;           // (T over all ranks, hidden): expert-parallel only
  std::vector<float> shared_gu;       // (T, 2 * shared inter)
  std::vector<float> shared_y;        // (T, hidden)
  std::vector<MoeExpertJob> jobs;     // the chosen experts, then the shared one
  std::vector<MoeMatmulItem> items;
};

// out (T, hidden) = the MoE MLP of h (T, hidden) (row strides hidden).
void MoeForward(const MoeExec& exec, const model::MoeConfig& moe, const RunnerMoeWeights& w,
                const float* h, int64_t num_tokens, int64_t hidden, float* out, MoeScratch* s);

// MoeForward's stages, which the expert-parallel form (moe_expert_parallel.h) shares:
// router logits and RouteTokens of h (t, hidden) into s->experts / s->weights (t, top_k);
void MoeRoute(const MoeExec& e, const model::MoeConfig& moe, const RunnerMoeWeights& w,
              const float* h, int64_t t, int64_t hidden, MoeScratch* s);
// the (token, slot) pairs grouped by expert: s->offset, s->row_token, s->slot_row;
void MoeGroupByExpert(int64_t num_tokens, int64_t k, int num_experts, MoeScratch* s);
// the gate|up (gate_up) or down matmuls of jobs, in one dispatch;
void MoeRunJobs(const MoeExec& e, const std::vector<MoeExpertJob>& jobs, bool gate_up,
                MoeScratch* s);
// jobs, after their gate|up and SiLU, become their down matmuls: x the SiLU output, out the rows
// of s->yg (a routed expert's, found from its offset in s->gu of row stride ld) or s->shared_y
// (`shared`, the shared expert's).
void MoeJobsToDown(std::vector<MoeExpertJob>* jobs, const RunnerExpert* shared, int64_t ld,
                   int64_t hidden, MoeScratch* s);
// x (rows, ld) gate|up in place -> SiLU(gate) * up in the gate columns.
void MoeSiluRows(const MoeExec& e, float* x, int64_t rows, int64_t inter, int64_t ld);

// The row-major matrices of a MoE layer (router, experts), for AppendWarmRanges before packing.
void AppendMoeWarmRanges(const RunnerMoeWeights& moe, std::vector<MemRange>* out);

// Runs items: with isa, dealt across the pool's threads (kPanel32 weights through
// isa.matmul_panel, row-major through isa.matmul); the caller's order has no effect on results.
void RunMatmulItems(ThreadPool& pool, const kernels::IsaKernels& isa,
                    const std::vector<MoeMatmulItem>& items);

}  // namespace pd::engine
