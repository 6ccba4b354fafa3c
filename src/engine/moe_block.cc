#include "engine/moe_block.h"

#include <algorithm>
#include <atomic>

#include "common/check.h"
#include "engine/kernels_ref.h"
#include "engine/moe_routing.h"
#include "engine/thread_pool.h"

namespace pd::engine {
namespace {

using kernels::WeightMatrix;

// Element-wise work under this many floats runs on the calling thread (as the runner's Elements):
// a decode step's few rows cost less than waking the pool.
constexpr int64_t kInlineElements = int64_t{1} << 15;

// Panel groups per work item: at most 8 (whole passes of the AVX-512 streaming kernel at 1, 2
// and 4 rows, one x-packing per chunk in the blocked kernel), fewer when the step has few groups
// in all, so that every thread still gets about two items to deal.
int64_t ItemGroups(int64_t total_groups, int threads) {
  return std::clamp<int64_t>(total_groups / (2 * static_cast<int64_t>(threads)), 1, 8);
}

template <typename Fn>
void ForRows(const MoeExec& e, int64_t rows, int64_t row_elems, Fn&& fn) {
  if (e.isa == nullptr || rows * row_elems < kInlineElements) {
    fn(int64_t{0}, rows);
  } else {
    e.pool->ParallelFor(rows, fn);
  }
}

// Items computing out (rows, cols [col, col + w.n)) = x @ w^T in runs of `groups` panel groups.
void AddItems(const WeightMatrix& w, const float* x, int64_t ldx, int64_t rows, float* out,
              int64_t ldo, int64_t groups, std::vector<MoeMatmulItem>* items) {
  const int64_t step = groups * kernels::kPanelRows;
  for (int64_t n = 0; n < w.n; n += step)
    items->push_back({&w, x, ldx, rows, out, ldo, n, std::min(w.n, n + step)});
}

// The matrices x @ [gate|up]^T of expert ex writes into gu (ld 2*inter): one fused packed one,
// or gate and up apart (before packing).
int AppendGateUp(const RunnerExpert& ex, const WeightMatrix** mats, int64_t* cols) {
  if (ex.gate_up.data != nullptr) {
    mats[0] = &ex.gate_up;
    cols[0] = 0;
    return 1;
  }
  mats[0] = &ex.gate.w;
  cols[0] = 0;
  mats[1] = &ex.up.w;
  cols[1] = ex.inter();
  return 2;
}

int64_t Groups(int64_t n) { return (n + kernels::kPanelRows - 1) / kernels::kPanelRows; }

void RefMatmul(const MoeExec& e, const float* x, int64_t rows, int64_t ldx, const WeightMatrix& w,
               float* out, int64_t ldo) {
  if (e.bf16_dot) {
    ref::MatmulBf16Dot(x, rows, ldx, w, out, ldo);
  } else {
    ref::Matmul(x, rows, ldx, w, out, ldo);
  }
}

}  // namespace

// One step of matmuls, each (expert, x rows, out): items dealt over the pool, or the reference.
void MoeRunJobs(const MoeExec& e, const std::vector<MoeExpertJob>& jobs, bool gate_up,
                MoeScratch* s) {
  if (e.isa == nullptr) {
    for (const MoeExpertJob& j : jobs) {
      if (gate_up) {
        RefMatmul(e, j.x, j.rows, j.ldx, j.ex->gate.w, j.out, j.ldo);
        RefMatmul(e, j.x, j.rows, j.ldx, j.ex->up.w, j.out + j.ex->inter(), j.ldo);
      } else {
        RefMatmul(e, j.x, j.rows, j.ldx, j.ex->down.w, j.out, j.ldo);
      }
    }
    return;
  }
  int64_t total = 0;
  for (const MoeExpertJob& j : jobs)
    total += gate_up ? Groups(2 * j.ex->inter()) : Groups(j.ex->down.w.n);
  const int64_t groups = ItemGroups(total, e.pool->num_threads());
  s->items.clear();
  for (const MoeExpertJob& j : jobs) {
    if (!gate_up) {
      AddItems(j.ex->down.w, j.x, j.ldx, j.rows, j.out, j.ldo, groups, &s->items);
      continue;
    }
    const WeightMatrix* mats[2];
    int64_t cols[2];
    const int n = AppendGateUp(*j.ex, mats, cols);
    for (int i = 0; i < n; ++i)
      AddItems(*mats[i], j.x, j.ldx, j.rows, j.out + cols[i], j.ldo, groups, &s->items);
  }
  RunMatmulItems(*e.pool, *e.isa, s->items);
}

// x (rows, ld) gate|up in place -> SiLU(gate) * up in the gate columns.
void MoeJobsToDown(std::vector<MoeExpertJob>* jobs, const RunnerExpert* shared, int64_t ld,
                   int64_t hidden, MoeScratch* s) {
  for (MoeExpertJob& j : *jobs) {
    const bool is_shared = j.ex == shared;
    const int64_t r0 = is_shared ? 0 : (j.out - s->gu.data()) / ld;
    j.x = j.out;
    j.ldx = j.ldo;
    j.out = (is_shared ? s->shared_y.data() : s->yg.data()) + r0 * hidden;
    j.ldo = hidden;
  }
}

void MoeSiluRows(const MoeExec& e, float* x, int64_t rows, int64_t inter, int64_t ld) {
  ForRows(e, rows, inter, [&](int64_t b, int64_t end) {
    for (int64_t r = b; r < end; ++r) {
      float* g = x + r * ld;
      if (e.isa != nullptr) {
        e.isa->silu_mul_row(g, g + inter, inter, g);
      } else {
        ref::SiluMul(g, ld, g + inter, ld, 1, inter, g, ld);
      }
    }
  });
}

// Groups the (token, slot) pairs by expert: offset, row_token, slot_row (see MoeScratch).
void MoeGroupByExpert(int64_t num_tokens, int64_t k, int num_experts, MoeScratch* s) {
  s->offset.assign(num_experts + 1, 0);
  s->fill.assign(num_experts, 0);
  const int64_t n = num_tokens * k;
  for (int64_t i = 0; i < n; ++i) ++s->offset[s->experts[i] + 1];
  for (int x = 0; x < num_experts; ++x) s->offset[x + 1] += s->offset[x];
  for (int64_t i = 0; i < n; ++i) {  // tokens in step order inside each expert's rows
    const int32_t x = s->experts[i];
    const int32_t row = s->offset[x] + s->fill[x]++;
    s->row_token[row] = static_cast<int32_t>(i / k);
    s->slot_row[i] = row;
  }
}

void MoeRoute(const MoeExec& e, const model::MoeConfig& moe, const RunnerMoeWeights& w,
              const float* h, int64_t t, int64_t hidden, MoeScratch* s) {
  const int64_t ne = moe.num_experts, k = moe.num_experts_per_tok;
  s->logits.resize(std::max<size_t>(s->logits.size(), t * ne));
  if (e.isa != nullptr) {
    kernels::ParallelMatmul(*e.pool, *e.router_isa, h, t, hidden, w.router.w, s->logits.data(), ne);
  } else {
    ref::Matmul(h, t, hidden, w.router.w, s->logits.data(), ne);
  }
  s->experts.resize(std::max<size_t>(s->experts.size(), t * k));
  s->weights.resize(std::max<size_t>(s->weights.size(), t * k));
  s->route.resize(2 * ne);
  RouteTokens(moe, s->logits.data(), t, ne, w.router_bias.empty() ? nullptr : w.router_bias.data(),
              s->experts.data(), s->weights.data(), s->route.data());
}

namespace {

template <typename T>
void Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

void RunMatmulItems(ThreadPool& pool, const kernels::IsaKernels& isa,
                    const std::vector<MoeMatmulItem>& items) {
  auto run = [&](const MoeMatmulItem& it) {
    const bool panel = it.w->layout == kernels::WeightLayout::kPanel32;
    PD_CHECK(!panel || isa.matmul_panel != nullptr) << isa.name << " has no kPanel32 matmul";
    (panel ? isa.matmul_panel : isa.matmul)(it.x, it.rows, it.ldx, *it.w, it.n_begin, it.n_end,
                                            it.out, it.ldo);
  };
  const int64_t n = static_cast<int64_t>(items.size());
  if (pool.num_threads() == 1 || n == 1) {
    for (const MoeMatmulItem& it : items) run(it);
    return;
  }
  std::atomic<int64_t> next{0};  // items dealt as threads ask: shares of the machine vary
  pool.ParallelFor(std::min<int64_t>(n, pool.num_threads()), [&](int64_t, int64_t) {
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next.fetch_add(1, std::memory_order_relaxed))
      run(items[i]);
  });
}

void MoeForward(const MoeExec& e, const model::MoeConfig& moe, const RunnerMoeWeights& w,
                const float* h, int64_t t, int64_t hidden, float* out, MoeScratch* s) {
  const int64_t k = moe.num_experts_per_tok, rows = t * k;
  PD_CHECK(static_cast<int64_t>(w.experts.size()) == moe.num_experts);
  const int64_t inter = w.experts[0].inter(), ld = 2 * inter;
  MoeRoute(e, moe, w, h, t, hidden, s);
  Grow(s->row_token, rows);
  Grow(s->slot_row, rows);
  MoeGroupByExpert(t, k, moe.num_experts, s);
  Grow(s->xg, rows * hidden);
  Grow(s->gu, rows * ld);
  Grow(s->yg, rows * hidden);
  ForRows(e, rows, hidden, [&](int64_t b, int64_t end) {
    for (int64_t r = b; r < end; ++r)
      std::copy(h + s->row_token[r] * hidden, h + (s->row_token[r] + 1) * hidden,
                s->xg.data() + r * hidden);
  });
  const RunnerExpert* shared = w.shared.empty() ? nullptr : &w.shared[0];
  const int64_t sld = shared != nullptr ? 2 * shared->inter() : 0;
  if (shared != nullptr) {
    Grow(s->shared_gu, t * sld);
    Grow(s->shared_y, t * hidden);
  }
  // gate|up of every chosen expert (and the shared one) in one dispatch; then down likewise.
  std::vector<MoeExpertJob>& jobs = s->jobs;
  jobs.clear();
  for (int x = 0; x < moe.num_experts; ++x) {
    const int64_t r0 = s->offset[x], n = s->offset[x + 1] - r0;
    if (n > 0)
      jobs.push_back(
          {&w.experts[x], s->xg.data() + r0 * hidden, hidden, n, s->gu.data() + r0 * ld, ld});
  }
  if (shared != nullptr) jobs.push_back({shared, h, hidden, t, s->shared_gu.data(), sld});
  MoeRunJobs(e, jobs, /*gate_up=*/true, s);
  MoeSiluRows(e, s->gu.data(), rows, inter, ld);
  if (shared != nullptr) MoeSiluRows(e, s->shared_gu.data(), t, shared->inter(), sld);
  MoeJobsToDown(&jobs, shared, ld, hidden, s);
  MoeRunJobs(e, jobs, /*gate_up=*/false, s);
  ForRows(e, t, hidden * k, [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) {
      float* o = out + i * hidden;
      const float* sy = shared != nullptr ? s->shared_y.data() + i * hidden : nullptr;
      for (int64_t c = 0; c < hidden; ++c) o[c] = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const float wt = s->weights[i * k + j];
        const float* y = s->yg.data() + static_cast<int64_t>(s->slot_row[i * k + j]) * hidden;
        for (int64_t c = 0; c < hidden; ++c) o[c] += wt * y[c];
      }
      if (sy != nullptr)
        for (int64_t c = 0; c < hidden; ++c) o[c] += sy[c];
    }
  });
}

}  // namespace pd::engine
