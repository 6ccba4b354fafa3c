// The expert-parallel MoE MLP of data-parallel ranks (moe_expert_parallel.h).
#include "engine/moe_expert_parallel.h"

#include <algorithm>

#include "common/check.h"
#include "engine/thread_pool.h"

namespace pd::engine {
namespace {

template <typename T>
void Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// Copies rows [begin, end) of (n, hidden) from src rows picked by row_of(r) into dst.
template <typename RowOf>
void CopyRows(const MoeExec& e, int64_t begin, int64_t end, int64_t hidden, RowOf&& row_of,
              float* dst) {
  auto copy = [&](int64_t b, int64_t en) {
    for (int64_t r = begin + b; r < begin + en; ++r) {
      const float* src = row_of(r);
      std::copy(src, src + hidden, dst + r * hidden);
    }
  };
  const int64_t n = end - begin;
  if (e.isa == nullptr || n * hidden < (int64_t{1} << 15)) {
    copy(0, n);
  } else {
    e.pool->ParallelFor(n, copy);
  }
}

// Stage 2 over all ranks' t_all tokens gathered in s->h_all: route, group, and compute the rows
// of the experts this rank holds into s->yg; the shared expert over own rows (h, t) into
// s->shared_y.
void ComputeOwnExperts(const MoeExec& e, const model::MoeConfig& moe, const RunnerMoeWeights& w,
                       int rank, int num_ranks, const float* h, int64_t t, int64_t t_all,
                       int64_t hidden, MoeScratch* s) {
  const int64_t k = moe.num_experts_per_tok, rows = t_all * k;
  const int64_t inter = moe.moe_intermediate_size, ld = 2 * inter;
  MoeRoute(e, moe, w, s->h_all.data(), t_all, hidden, s);
  Grow(s->row_token, rows);
  Grow(s->slot_row, rows);
  MoeGroupByExpert(t_all, k, moe.num_experts, s);
  Grow(s->xg, rows * hidden);
  Grow(s->gu, rows * ld);
  Grow(s->yg, rows * hidden);
  std::vector<MoeExpertJob>& jobs = s->jobs;
  jobs.clear();
  for (int x = rank; x < moe.num_experts; x += num_ranks) {
    PD_CHECK(ExpertOwner(x, num_ranks) == rank);
    const int64_t r0 = s->offset[x], n = s->offset[x + 1] - r0;
    if (n == 0) continue;
    PD_CHECK(w.experts[x].inter() == inter) << "expert " << x << " is not held by rank " << rank;
    CopyRows(
        e, r0, r0 + n, hidden,
        [&](int64_t r) { return s->h_all.data() + s->row_token[r] * hidden; }, s->xg.data());
    jobs.push_back(
        {&w.experts[x], s->xg.data() + r0 * hidden, hidden, n, s->gu.data() + r0 * ld, ld});
  }
  const RunnerExpert* shared = w.shared.empty() || t == 0 ? nullptr : &w.shared[0];
  const int64_t sld = shared != nullptr ? 2 * shared->inter() : 0;
  if (shared != nullptr) {
    Grow(s->shared_gu, t * sld);
    Grow(s->shared_y, t * hidden);
    jobs.push_back({shared, h, hidden, t, s->shared_gu.data(), sld});
  }
  if (jobs.empty()) return;
  MoeRunJobs(e, jobs, /*gate_up=*/true, s);
  for (const MoeExpertJob& j : jobs) MoeSiluRows(e, j.out, j.rows, j.ex->inter(), j.ldo);
  MoeJobsToDown(&jobs, shared, ld, hidden, s);
  MoeRunJobs(e, jobs, /*gate_up=*/false, s);
}

}  // namespace

void MoeForwardExpertParallel(const MoeExec& e, const model::MoeConfig& moe,
                              const RunnerMoeWeights& w, MoeExchange* ex, int rank, const float* h,
                              int64_t t, int64_t hidden, float* out, MoeScratch* s) {
  const int n = ex->num_ranks();
  PD_CHECK(static_cast<int64_t>(w.experts.size()) == moe.num_experts);
  ex->h_[rank] = h;
  ex->tokens_[rank] = t;
  ex->barrier_.ArriveAndWait();  // 1: every rank's h is published
  int64_t t_all = 0, own_begin = 0;
  for (int r = 0; r < n; ++r) {
    if (r == rank) own_begin = t_all;
    t_all += ex->tokens_[r];
  }
  if (t_all > 0) {
    Grow(s->h_all, t_all * hidden);
    for (int r = 0, begin = 0; r < n; begin += static_cast<int>(ex->tokens_[r]), ++r) {
      const float* src = ex->h_[r];
      CopyRows(
          e, begin, begin + ex->tokens_[r], hidden,
          [&](int64_t row) { return src + (row - begin) * hidden; }, s->h_all.data());
    }
    ComputeOwnExperts(e, moe, w, rank, n, h, t, t_all, hidden, s);
  }
  ex->yg_[rank] = s->yg.data();
  ex->barrier_.ArriveAndWait();  // 2: every rank's expert rows are computed
  const int64_t k = moe.num_experts_per_tok;
  const bool shared = !w.shared.empty();
  auto sum = [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) {
      const int64_t g = own_begin + i;  // the token's index among all ranks' tokens
      float* o = out + i * hidden;
      for (int64_t c = 0; c < hidden; ++c) o[c] = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const float wt = s->weights[g * k + j];
        const int owner = ExpertOwner(s->experts[g * k + j], n);
        const float* y = ex->yg_[owner] + static_cast<int64_t>(s->slot_row[g * k + j]) * hidden;
        for (int64_t c = 0; c < hidden; ++c) o[c] += wt * y[c];
      }
      if (shared) {
        const float* sy = s->shared_y.data() + i * hidden;
        for (int64_t c = 0; c < hidden; ++c) o[c] += sy[c];
      }
    }
  };
  if (e.isa == nullptr || t * hidden * k < (int64_t{1} << 15)) {
    sum(0, t);
  } else {
    e.pool->ParallelFor(t, sum);
  }
}

}  // namespace pd::engine
