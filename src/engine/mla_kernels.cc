// MLA kernel dispatch, the scalar chunk kernel, the merge and the parallel drivers.
#include <algorithm>
#include <cmath>

#include "common/check.h"
#include "engine/cpu_features.h"
#include "engine/mla_kernels.h"
#include "engine/mla_kernels_ref.h"
#include "engine/mla_parallel.h"
#include "engine/thread_pool.h"

namespace pd::engine::kernels {
namespace {

// The online-softmax algorithm the SIMD kernel vectorises: positions in blocks of kMlaBlock, each
// block's rows converted to f32 once, then every head's scores, running max/sum and accumulator.
void ScalarChunk(const MlaAttentionArgs& a, int token, int p_begin, int p_end,
                 const MlaPartial& out, float* scratch) {
  const PagedLatent& kv = a.kv;
  const int L = kv.latent_dim, R = kv.kv_lora_rank, H = a.num_heads;
  const AttnSeq& seq = a.seqs[a.token_seq[token]];
  float* rows = scratch;                        // (kMlaBlock, L)
  float* scores = rows + kMlaBlock * (L + 16);  // (H, kMlaBlock)
  std::fill(out.m, out.m + H, -INFINITY);
  std::fill(out.l, out.l + H, 0.0f);
  std::fill(out.acc, out.acc + static_cast<int64_t>(H) * R, 0.0f);
  const float* q = a.q + static_cast<int64_t>(token) * a.ldq;  // (H, L)
  for (int b0 = p_begin; b0 < p_end; b0 += kMlaBlock) {
    const int nb = std::min(kMlaBlock, p_end - b0);
    for (int j = 0; j < nb; ++j) {
      const int p = b0 + j;
      const uint8_t* row =
          ref::LatentRowPtr(kv, seq.page_table[p / kv.page_size], p % kv.page_size);
      for (int i = 0; i < L; ++i) rows[j * L + i] = ref::LoadLatent(kv, row, i);
    }
    for (int h = 0; h < H; ++h) {
      float* s = scores + h * kMlaBlock;
      const float* qh = q + static_cast<int64_t>(h) * L;
      float block_max = out.m[h];
      for (int j = 0; j < nb; ++j) {
        float dot = 0;
        for (int i = 0; i < L; ++i) dot += qh[i] * rows[j * L + i];
        s[j] = dot * a.scale;
        block_max = std::max(block_max, s[j]);
      }
      const float correction = std::exp(out.m[h] - block_max);
      out.m[h] = block_max;
      out.l[h] *= correction;
      float* acc = out.acc + static_cast<int64_t>(h) * R;
      for (int i = 0; i < R; ++i) acc[i] *= correction;
      for (int j = 0; j < nb; ++j) {
        s[j] = std::exp(s[j] - block_max);
        out.l[h] += s[j];
      }
      for (int j = 0; j < nb; ++j)
        for (int i = 0; i < R; ++i) acc[i] += s[j] * rows[j * L + i];
    }
  }
}

const MlaIsaKernels kMlaScalar = {"scalar", &ScalarChunk};

}  // namespace

const MlaIsaKernels& MlaScalarKernels() { return kMlaScalar; }

const MlaIsaKernels& MlaKernelsFor(IsaLevel level) {
  PD_CHECK(IsaSupported(level)) << "CPU lacks " << IsaLevelName(level);
  if (level == IsaLevel::kAvx512) return MlaAvx512Kernels();
  return kMlaScalar;
}

void MlaMergePartials(const MlaPartial* parts, int num_parts, int num_heads, int R, float* out) {
  for (int h = 0; h < num_heads; ++h) {
    float m = -INFINITY;
    for (int p = 0; p < num_parts; ++p) m = std::max(m, parts[p].m[h]);
    float l = 0;
    for (int p = 0; p < num_parts; ++p) l += parts[p].l[h] * std::exp(parts[p].m[h] - m);
    float* o = out + static_cast<int64_t>(h) * R;
    const float inv = 1.0f / l;
    if (num_parts == 1) {  // out may alias the part's acc
      const float* acc = parts[0].acc + static_cast<int64_t>(h) * R;
      for (int i = 0; i < R; ++i) o[i] = acc[i] * inv;
      continue;
    }
    // o = sum_p acc_p * exp(m_p - M) in part order, one exp per part and head.
    for (int p = 0; p < num_parts; ++p) {
      const float w = std::exp(parts[p].m[h] - m);
      const float* acc = parts[p].acc + static_cast<int64_t>(h) * R;
      if (p == 0) {
        for (int i = 0; i < R; ++i) o[i] = acc[i] * w;
      } else {
        for (int i = 0; i < R; ++i) o[i] += acc[i] * w;
      }
    }
    for (int i = 0; i < R; ++i) o[i] *= inv;
  }
}

namespace {

constexpr int kMaxParts = 64;  // chunks of one token at most

// Work items of args: one per token of a multi-token run; a lone token's positions in up to
// `target` chunks of whole blocks. Returns the number of items whose acc lives in ws->acc.
int PlanMlaItems(const MlaAttentionArgs& a, int threads, MlaWorkspace* ws) {
  int lone = 0;
  for (int s = 0; s < a.num_seqs; ++s) lone += a.seqs[s].num_tokens == 1;
  const int target = lone == 0 ? 1 : std::clamp((4 * threads + lone - 1) / lone, 1, kMaxParts);
  ws->items.clear();
  ws->token_parts.assign(a.num_tokens + 1, 0);
  int split_parts = 0;
  for (int t = 0; t < a.num_tokens; ++t) {
    ws->token_parts[t] = static_cast<int>(ws->items.size());
    const AttnSeq& seq = a.seqs[a.token_seq[t]];
    const int len = seq.start_pos + (t - seq.token_begin) + 1;
    const int blocks = (len + kMlaBlock - 1) / kMlaBlock;
    const int n = seq.num_tokens == 1 ? std::min(target, blocks) : 1;
    for (int c = 0; c < n; ++c) {
      const int b = c * blocks / n, e = (c + 1) * blocks / n;
      ws->items.push_back(
          {t, b * kMlaBlock, std::min(len, e * kMlaBlock), n > 1 ? split_parts : -1});
      if (n > 1) ++split_parts;
    }
  }
  ws->token_parts[a.num_tokens] = static_cast<int>(ws->items.size());
  return split_parts;
}

}  // namespace

void ParallelMlaAttention(ThreadPool& pool, const MlaIsaKernels& isa, const MlaAttentionArgs& a,
                          MlaWorkspace* ws) {
  const int H = a.num_heads, R = a.kv.kv_lora_rank, threads = pool.num_threads();
  const int split_parts = PlanMlaItems(a, threads, ws);
  const int64_t num_items = static_cast<int64_t>(ws->items.size());
  const size_t stride = MlaChunkScratchFloats(H, a.kv.latent_dim);
  if (ws->scratch.size() < stride * threads) ws->scratch.resize(stride * threads);
  if (ws->ml.size() < static_cast<size_t>(num_items) * 2 * H) ws->ml.resize(num_items * 2 * H);
  const size_t acc_floats = static_cast<size_t>(split_parts) * H * R;
  if (ws->acc.size() < acc_floats) ws->acc.resize(acc_floats);
  auto part_of = [&](int64_t i) {
    const MlaWorkspace::Item& it = ws->items[i];
    MlaPartial p;
    p.m = ws->ml.data() + i * 2 * H;
    p.l = p.m + H;
    p.acc = it.part >= 0 ? ws->acc.data() + static_cast<int64_t>(it.part) * H * R
                         : a.out + static_cast<int64_t>(it.token) * a.ldo;
    return p;
  };
  // Items dealt from both ends (a prefill chunk's later tokens cover more positions).
  pool.ParallelFor(num_items, [&](int64_t begin, int64_t end, int thread) {
    float* s = ws->scratch.data() + stride * thread;
    for (int64_t k = begin; k < end; ++k) {
      const int64_t i = k % 2 == 0 ? k / 2 : num_items - 1 - k / 2;
      const MlaWorkspace::Item& it = ws->items[i];
      const MlaPartial p = part_of(i);
      isa.chunk(a, it.token, it.p_begin, it.p_end, p, s);
      if (it.part < 0) MlaMergePartials(&p, 1, H, R, p.acc);
    }
  });
  if (split_parts == 0) return;
  pool.ParallelFor(a.num_tokens, [&](int64_t begin, int64_t end) {
    MlaPartial parts[kMaxParts];
    for (int64_t t = begin; t < end; ++t) {
      const int first = ws->token_parts[t], n = ws->token_parts[t + 1] - first;
      if (ws->items[first].part < 0) continue;  // done in place
      for (int c = 0; c < n; ++c) parts[c] = part_of(first + c);
      MlaMergePartials(parts, n, H, R, a.out + t * a.ldo);
    }
  });
}

void ParallelHeadMatmul(ThreadPool& pool, const IsaKernels& isa, const HeadMatmulArgs& a) {
  if (a.num_heads == 0 || a.rows == 0) return;
  const WeightMatrix& w0 = a.w[0];
  const bool panel = w0.layout == WeightLayout::kPanel32;
  const int64_t block = panel ? kPanelRows : 16;
  const int64_t blocks = (w0.n + block - 1) / block;
  auto fn = panel ? isa.matmul_panel : isa.matmul;
  PD_CHECK(fn != nullptr) << isa.name << " has no kernel for this weight layout";
  pool.ParallelFor(a.num_heads * blocks, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end;) {
      const int64_t h = i / blocks, b = i % blocks;
      const int64_t b_end = std::min(blocks, b + (end - i));  // this head's run in the chunk
      fn(a.x + h * a.x_head_stride, a.rows, a.ldx, a.w[h], b * block, std::min(w0.n, b_end * block),
         a.out + h * a.out_head_stride, a.ldo);
      i += b_end - b;
    }
  });
}

}  // namespace pd::engine::kernels
