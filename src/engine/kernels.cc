// Kernel dispatch (which ISA table), the scalar fast-kernel table and the parallel drivers.
#include "engine/kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "common/check.h"
#include "engine/cpu_features.h"
#include "engine/kernels_ref.h"
#include "engine/thread_pool.h"
#include "model/dtype.h"

namespace pd::engine::kernels {
namespace {

// Online-softmax attention for one (token, kv_head), the algorithm the SIMD kernels vectorise:
// positions in blocks of kAttnBlock; per query head a running max m, sum l and accumulator acc.
void ScalarAttentionItem(const AttentionArgs& a, int token, int kv_head, float* scratch) {
  const PagedKv& kv = a.kv;
  const AttnSeq& seq = a.seqs[a.token_seq[token]];
  const int pos = seq.start_pos + (token - seq.token_begin);
  const int group = a.num_heads / kv.num_kv_heads;
  const int d = kv.head_dim;
  float* scores = scratch;                   // (group, kAttnBlock)
  float* acc = scores + group * kAttnBlock;  // (group, head_dim)
  float* m = acc + group * d;                // (group)
  float* l = m + group;                      // (group)
  std::fill(acc, acc + group * d, 0.0f);
  std::fill(m, m + group, -INFINITY);
  std::fill(l, l + group, 0.0f);
  const float* q0 =
      a.q + static_cast<int64_t>(token) * a.ldq + static_cast<int64_t>(kv_head) * group * d;
  for (int b0 = 0; b0 <= pos; b0 += kAttnBlock) {
    const int nb = std::min(kAttnBlock, pos + 1 - b0);
    for (int j = 0; j < nb; ++j) {
      const int p = b0 + j;
      const uint8_t* k =
          ref::KvElemPtr(kv, seq.page_table[p / kv.page_size], p % kv.page_size, kv_head, 0);
      for (int h = 0; h < group; ++h) {
        float dot = 0;
        for (int i = 0; i < d; ++i) dot += q0[h * d + i] * ref::LoadKv(kv, k, i, 0);
        scores[h * kAttnBlock + j] = dot * a.scale;
      }
    }
    for (int h = 0; h < group; ++h) {
      float* s = scores + h * kAttnBlock;
      float block_max = m[h];
      for (int j = 0; j < nb; ++j) block_max = std::max(block_max, s[j]);
      const float correction = std::exp(m[h] - block_max);
      m[h] = block_max;
      l[h] *= correction;
      for (int i = 0; i < d; ++i) acc[h * d + i] *= correction;
      for (int j = 0; j < nb; ++j) {
        s[j] = std::exp(s[j] - block_max);
        l[h] += s[j];
      }
    }
    for (int j = 0; j < nb; ++j) {
      const int p = b0 + j;
      const uint8_t* v =
          ref::KvElemPtr(kv, seq.page_table[p / kv.page_size], p % kv.page_size, kv_head, 1);
      for (int i = 0; i < d; ++i) {
        const float vi = ref::LoadKv(kv, v, i, 1);
        for (int h = 0; h < group; ++h) acc[h * d + i] += scores[h * kAttnBlock + j] * vi;
      }
    }
  }
  for (int h = 0; h < group; ++h) {
    float* out = a.out + static_cast<int64_t>(token) * a.ldo +
                 (static_cast<int64_t>(kv_head) * group + h) * d;
    for (int i = 0; i < d; ++i) out[i] = acc[h * d + i] / l[h];
  }
}

// The kPanel32 layout read element by element: W[n, k] of a group's pair-interleaved (bf16) or
// plain (f32) rows; one FMA-free chain over k per output, like the reference.
float PanelElem(const WeightMatrix& w, int64_t n, int64_t k) {
  const int64_t g = n / kPanelRows, r = n % kPanelRows;
  const int64_t base = (g * w.k + k) * kPanelRows;
  if (!w.bf16) return static_cast<const float*>(w.data)[base + r];
  const int64_t pos = r < 16 ? 2 * r : 2 * (r - 16) + 1;
  return model::Bf16ToF32(static_cast<const uint16_t*>(w.data)[base + pos]);
}

void ScalarMatmulPanel(const float* x, int64_t rows, int64_t ldx, const WeightMatrix& w,
                       int64_t n_begin, int64_t n_end, float* out, int64_t ldo) {
  if (w.fp8) return ScalarFp8Matmul(x, rows, ldx, w, n_begin, n_end, out, ldo);
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t n = n_begin; n < n_end; ++n) {
      float acc = 0;
      for (int64_t k = 0; k < w.k; ++k) acc += x[m * ldx + k] * PanelElem(w, n, k);
      out[m * ldo + n] = acc;
    }
}

const IsaKernels kScalar = {"scalar",           &ref::MatmulSlice,
                            &ScalarMatmulPanel, &ScalarAttentionItem,
                            &ScalarSiluMulRow,  &ScalarRmsNormRow};

// fp8 W[n, k]'s code and the scale of its k block b, in either layout (kernels.h).
struct Fp8Elem {
  const WeightMatrix& w;
  int64_t kb = Fp8KBlocks(w.k);
  uint8_t Code(int64_t n, int64_t k) const {
    const uint8_t* q = static_cast<const uint8_t*>(w.data);
    if (w.layout == WeightLayout::kRowMajor) return q[n * w.k + k];
    return q[(n / kPanelRows * w.k + k) * kPanelRows + n % kPanelRows];
  }
  float Scale(int64_t n, int64_t b) const {
    if (w.layout == WeightLayout::kRowMajor) return w.scales[(n / kFp8Block) * kb + b];
    return w.scales[(n / kPanelRows * kb + b) * kPanelRows + n % kPanelRows];
  }
};

void PackFp8Row(const WeightMatrix* src, int64_t row, int64_t g, int64_t r,
                const WeightMatrix& dst) {
  const int64_t k = dst.k, kb = Fp8KBlocks(k);
  uint8_t* d = static_cast<uint8_t*>(const_cast<void*>(dst.data)) + g * k * kPanelRows + r;
  float* ds = const_cast<float*>(dst.scales) + g * kb * kPanelRows + r;
  if (src == nullptr) {
    for (int64_t i = 0; i < k; ++i) d[i * kPanelRows] = 0;
    for (int64_t b = 0; b < kb; ++b) ds[b * kPanelRows] = 0.0f;
    return;
  }
  const Fp8Elem e{*src};
  for (int64_t i = 0; i < k; ++i) d[i * kPanelRows] = e.Code(row, i);
  for (int64_t b = 0; b < kb; ++b) ds[b * kPanelRows] = e.Scale(row, b);
}

}  // namespace

void ScalarFp8Matmul(const float* x, int64_t rows, int64_t ldx, const WeightMatrix& w,
                     int64_t n_begin, int64_t n_end, float* out, int64_t ldo) {
  const Fp8Elem e{w};
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t n = n_begin; n < n_end; ++n) {
      float acc = 0;
      for (int64_t b = 0; b < e.kb; ++b) {
        float partial = 0;
        const int64_t k1 = std::min(w.k, (b + 1) * kFp8Block);
        for (int64_t k = b * kFp8Block; k < k1; ++k)
          partial = std::fma(x[m * ldx + k], model::Fp8E4m3ToF32(e.Code(n, k)), partial);
        acc = std::fma(partial, e.Scale(n, b), acc);
      }
      out[m * ldo + n] = acc;
    }
}

void ScalarSiluMulRow(const float* gate, const float* up, int64_t dim, float* out) {
  ref::SiluMul(gate, dim, up, dim, 1, dim, out, dim);
}

void ScalarRmsNormRow(const float* x, const float* w, int64_t dim, float eps, float* out) {
  ref::RmsNorm(x, 1, dim, dim, w, eps, out, dim);
}

const IsaKernels& ScalarKernels() { return kScalar; }

namespace {
// -1: none forced, else the PanelStream's value.
std::atomic<int> forced_panel_stream{-1};
}  // namespace

const char* PanelStreamName(PanelStream stream) {
  return stream == PanelStream::kMulti ? "multi" : "single";
}

PanelStream ChosenPanelStream() {
  const int forced = forced_panel_stream.load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<PanelStream>(forced);
  // Measured on AMD Zen 4 (single) and Intel Xeon (multi); other CPUs take multi, whose software
  // prefetch does not depend on how far a hardware prefetcher follows one stream.
  return DetectCpuFeatures().vendor == CpuVendor::kAmd ? PanelStream::kSingle : PanelStream::kMulti;
}

void ForcePanelStream(PanelStream stream) {
  forced_panel_stream.store(static_cast<int>(stream), std::memory_order_relaxed);
}

void ClearForcedPanelStream() { forced_panel_stream.store(-1, std::memory_order_relaxed); }

const IsaKernels& KernelsFor(IsaLevel level) {
  PD_CHECK(IsaSupported(level)) << "CPU lacks " << IsaLevelName(level);
  switch (level) {
    case IsaLevel::kAvx512:
      return Avx512Kernels();
    case IsaLevel::kAvx2:
      return Avx2Kernels();
    case IsaLevel::kScalar:
      break;
  }
  return kScalar;
}

WeightMatrix PackPanel32(ThreadPool& pool, const WeightMatrix* srcs, int num_srcs, void* dst) {
  WeightMatrix packed;
  packed.data = dst;
  packed.bf16 = srcs[0].bf16;
  packed.fp8 = srcs[0].fp8;
  packed.k = srcs[0].k;
  packed.layout = WeightLayout::kPanel32;
  for (int i = 0; i < num_srcs; ++i) {
    PD_CHECK(srcs[i].k == packed.k && srcs[i].bf16 == packed.bf16 && srcs[i].fp8 == packed.fp8 &&
             srcs[i].layout == WeightLayout::kRowMajor)
        << "PackPanel32: sources must share k, dtype and the row-major layout";
    packed.n += srcs[i].n;
  }
  const int64_t k = packed.k, groups = (packed.n + kPanelRows - 1) / kPanelRows;
  if (packed.fp8)
    packed.scales = reinterpret_cast<const float*>(static_cast<const uint8_t*>(dst) +
                                                   Panel32Fp8CodeBytes(packed.n, k));
  pool.ParallelFor(groups, [&](int64_t g_begin, int64_t g_end) {
    for (int64_t g = g_begin; g < g_end; ++g)
      for (int64_t r = 0; r < kPanelRows; ++r) {
        // Row 32g+r of the stacked matrix: which source, which row of it (or padding).
        int64_t row = g * kPanelRows + r;
        const WeightMatrix* src = nullptr;
        for (int i = 0; i < num_srcs && src == nullptr; ++i) {
          if (row < srcs[i].n)
            src = &srcs[i];
          else
            row -= srcs[i].n;
        }
        if (packed.fp8) {
          PackFp8Row(src, row, g, r, packed);
        } else if (packed.bf16) {
          const int64_t pos = r < 16 ? 2 * r : 2 * (r - 16) + 1;
          uint16_t* d = static_cast<uint16_t*>(dst) + g * k * kPanelRows + pos;  // stride 32
          const uint16_t* s = src ? static_cast<const uint16_t*>(src->data) + row * k : nullptr;
          for (int64_t i = 0; i < k; ++i) d[i * kPanelRows] = s ? s[i] : 0;
        } else {
          float* d = static_cast<float*>(dst) + g * k * kPanelRows + r;
          const float* s = src ? static_cast<const float*>(src->data) + row * k : nullptr;
          for (int64_t i = 0; i < k; ++i) d[i * kPanelRows] = s ? s[i] : 0.0f;
        }
      }
  });
  return packed;
}

// Decode batches (up to kDealRows rows) deal panel groups out to the threads in chunks as they
// ask: the threads do not always get equal shares of the machine (perf showed one waiting ~7% of
// each step on a fixed split, at batch 1 and at batch 32). Each output is still computed whole by
// one thread in one FMA chain: same bits.
constexpr int64_t kDealRows = 64;
// Up to kStreamDealRows rows: chunks of kStreamDealGroups[rows] groups, whole passes of the
// AVX-512 streaming kernel (4, 4, 3, 2 groups per pass for 1..4 rows). More rows: guided chunks,
// each 1/kGuidedShare of the groups still undealt per thread, in whole 8-group runs (the blocked
// kernel packs x once per chunk): large chunks first, small ones last, so the threads finish
// close together (fixed chunks of 1/4 of a thread's share left one waiting up to a chunk;
// measured +1-6% at 32 rows with the longer decode k block).
constexpr int64_t kStreamDealRows = 4;
constexpr int64_t kStreamDealGroups[kStreamDealRows + 1] = {0, 8, 8, 6, 8};
constexpr int64_t kGuidedShare = 2;
constexpr int64_t kMinChunkGroups = 8;

// The size of the chunk dealt when `left` groups are still undealt.
int64_t GuidedChunkGroups(int64_t left, int threads) {
  const int64_t share = left / (kGuidedShare * threads);
  return std::max(kMinChunkGroups, (share + 7) / 8 * 8);
}

// Groups [0, groups) dealt to the pool's threads as they ask; fn(g_begin, g_end) per chunk.
template <typename Fn>
void DealGroups(ThreadPool& pool, int64_t rows, int64_t groups, Fn&& fn) {
  std::atomic<int64_t> next{0};
  const int threads = pool.num_threads();
  if (rows <= kStreamDealRows) {  // fixed chunks: chunk c is [c*size, (c+1)*size)
    const int64_t size = kStreamDealGroups[rows], chunks = (groups + size - 1) / size;
    pool.ParallelFor(threads, [&](int64_t, int64_t) {
      for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
           c = next.fetch_add(1, std::memory_order_relaxed))
        fn(c * size, std::min(groups, (c + 1) * size));
    });
    return;
  }
  pool.ParallelFor(threads, [&](int64_t, int64_t) {  // guided: next is the first undealt group
    int64_t g = next.load(std::memory_order_relaxed);
    while (g < groups) {
      const int64_t end = std::min(groups, g + GuidedChunkGroups(groups - g, threads));
      if (!next.compare_exchange_weak(g, end, std::memory_order_relaxed)) continue;  // g reloaded
      fn(g, end);
      g = next.load(std::memory_order_relaxed);
    }
  });
}

void ParallelMatmul(ThreadPool& pool, const IsaKernels& isa, const float* x, int64_t num_rows,
                    int64_t ldx, const WeightMatrix& w, float* out, int64_t ldo) {
  if (w.layout == WeightLayout::kPanel32) {
    PD_CHECK(isa.matmul_panel != nullptr) << isa.name << " has no kPanel32 matmul";
    const int64_t groups = (w.n + kPanelRows - 1) / kPanelRows;
    if (num_rows <= kDealRows && pool.num_threads() > 1) {
      DealGroups(pool, num_rows, groups, [&](int64_t g_begin, int64_t g_end) {
        isa.matmul_panel(x, num_rows, ldx, w, g_begin * kPanelRows,
                         std::min(w.n, g_end * kPanelRows), out, ldo);
      });
      return;
    }
    pool.ParallelFor(groups, [&](int64_t begin, int64_t end) {
      isa.matmul_panel(x, num_rows, ldx, w, begin * kPanelRows, std::min(w.n, end * kPanelRows),
                       out, ldo);
    });
    return;
  }
  constexpr int64_t kRowsPerBlock = 16;  // chunks of W rows stay aligned for the micro-kernels
  const int64_t blocks = (w.n + kRowsPerBlock - 1) / kRowsPerBlock;
  pool.ParallelFor(blocks, [&](int64_t begin, int64_t end) {
    isa.matmul(x, num_rows, ldx, w, begin * kRowsPerBlock, std::min(w.n, end * kRowsPerBlock), out,
               ldo);
  });
}

namespace {

// ParallelAttention over windows of kAttnRows tokens (dealt from both ends, as tokens are there):
// each window's run of tokens of one sequence is one attention_rows call, a lone token one
// attention_item call.
void ParallelAttentionRows(ThreadPool& pool, const IsaKernels& isa, const AttentionArgs& args,
                           float* scratch, size_t scratch_stride) {
  const int heads = args.kv.num_kv_heads;
  const int tokens = args.num_tokens;
  const int64_t windows = (tokens + kAttnRows - 1) / kAttnRows;
  pool.ParallelFor(windows * heads, [&](int64_t begin, int64_t end, int thread) {
    float* s = scratch + scratch_stride * thread;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t slot = i / heads;
      const int64_t window = slot % 2 == 0 ? slot / 2 : windows - 1 - slot / 2;
      const int kv_head = static_cast<int>(i % heads);
      const int w_end = static_cast<int>(std::min<int64_t>(tokens, (window + 1) * kAttnRows));
      for (int t = static_cast<int>(window * kAttnRows); t < w_end;) {
        const AttnSeq& seq = args.seqs[args.token_seq[t]];
        const int run_end = std::min(w_end, seq.token_begin + seq.num_tokens);
        if (run_end - t == 1) {
          isa.attention_item(args, t, kv_head, s);
        } else {
          isa.attention_rows(args, t, run_end - t, kv_head, s);
        }
        t = run_end;
      }
    }
  });
}

}  // namespace

void ParallelAttention(ThreadPool& pool, const IsaKernels& isa, const AttentionArgs& args,
                       float* scratch, size_t scratch_stride) {
  const int heads = args.kv.num_kv_heads;
  const int tokens = args.num_tokens;
  if (isa.attention_rows != nullptr && tokens > args.num_seqs) {  // some sequence has 2+ tokens
    ParallelAttentionRows(pool, isa, args, scratch, scratch_stride);
    return;
  }
  // A prefill chunk's later tokens attend over more positions: items are dealt out from both ends
  // (token 0, T-1, 1, T-2, ...) so that every thread's contiguous range costs about the same.
  pool.ParallelFor(
      static_cast<int64_t>(tokens) * heads, [&](int64_t begin, int64_t end, int thread) {
        float* s = scratch + scratch_stride * thread;
        for (int64_t i = begin; i < end; ++i) {
          const int64_t slot = i / heads;
          const int token = static_cast<int>(slot % 2 == 0 ? slot / 2 : tokens - 1 - slot / 2);
          isa.attention_item(args, token, static_cast<int>(i % heads), s);
        }
      });
}

}  // namespace pd::engine::kernels
