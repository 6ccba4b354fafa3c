// Private to src/engine: the kernels of Multi-head Latent Attention (deepseek_v3) in the
// weight-absorbed form, their plain-data arguments and the per-ISA table. Like kernels.h this
// header holds only plain data and declarations, so the ISA file (mla_kernels_avx512.cc) compiles
// nothing of another header with its wider instruction set.
//
// Shapes (per rank): H query heads, R = kv_lora_rank, dr = qk_rope_head_dim, L = R + dr.
//   latent row of a token (the cache):  [ RMSNorm(c) * kv_a_layernorm (R) | rotated k_rope (dr) ]
//   absorbed query of a token and head: [ W_UK[h]^T q_nope[h]         (R) | rotated q_rope (dr) ]
//   score[s] = scale * q_abs[h] . latent[s]       o_lat[h] = sum_s softmax(score)[s] *
//   latent[s][:R]
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/kernels.h"

namespace pd::engine::kernels {

// One layer of an MLA latent region: page p starts at base + p*page_bytes and holds
// (page_size, latent_dim) elements, f32, bf16 or (fp8) e4m3fn codes worth code * scale, token
// after token.
struct PagedLatent {
  uint8_t* base = nullptr;
  int64_t page_bytes = 0;
  int page_size = 0;
  int latent_dim = 0;    // L = kv_lora_rank + qk_rope_head_dim
  int kv_lora_rank = 0;  // R: the part of each row that is also the value
  bool bf16 = false;
  bool fp8 = false;
  float scale = 1.0f;  // fp8: the layer's k_scale
  int64_t elem_bytes() const { return fp8 ? 1 : (bf16 ? 2 : 4); }
};

// Causal absorbed MLA attention of every token over positions 0..its own.
struct MlaAttentionArgs {
  PagedLatent kv;
  int num_heads = 0;
  const float* q = nullptr;  // (num_tokens, num_heads, L) absorbed queries, row stride ldq
  int64_t ldq = 0;
  float* out = nullptr;  // (num_tokens, num_heads, R) o_lat, row stride ldo
  int64_t ldo = 0;
  const AttnSeq* seqs = nullptr;  // (num_seqs)
  int num_seqs = 0;
  const int32_t* token_seq = nullptr;  // (num_tokens): index into seqs of each token
  int num_tokens = 0;
  float scale = 1.0f;  // qk_head_dim^-0.5, times mscale^2 under yarn
};

// The partial result of one token over a range of positions, for all heads: running max m, sum l
// (of exp(score - m)) and unnormalised accumulator acc. Merged over ranges by MlaMergePartials.
struct MlaPartial {
  float* m = nullptr;    // (num_heads)
  float* l = nullptr;    // (num_heads)
  float* acc = nullptr;  // (num_heads, R)
};

// Floats of one MlaPartial.
inline size_t MlaPartialFloats(int num_heads, int kv_lora_rank) {
  return static_cast<size_t>(num_heads) * (kv_lora_rank + 2);
}

// Positions a chunk kernel converts at once (bf16 rows to f32), shared by all heads.
constexpr int kMlaBlock = 32;

// Scratch floats one chunk-kernel call needs: a block of rows as f32 (padded to whole vectors),
// a block of scores per head, the token's queries padded, a correction per head, and (bf16
// latents, read in place) an accumulator per head padded to 32.
inline size_t MlaChunkScratchFloats(int num_heads, int latent_dim) {
  const size_t h = static_cast<size_t>(num_heads), padded = static_cast<size_t>(latent_dim) + 32;
  return kMlaBlock * padded + h * kMlaBlock + 2 * h * padded + h + 64;
}

// The MLA kernels of one instruction set.
struct MlaIsaKernels {
  const char* name;
  // Token `token` over positions [p_begin, p_end) of its sequence (p_end <= its position + 1),
  // every head: writes the partial (m, l, acc) of that range. Each latent row is read (and
  // converted) once for all heads.
  void (*chunk)(const MlaAttentionArgs& args, int token, int p_begin, int p_end,
                const MlaPartial& out, float* scratch);
};

const MlaIsaKernels& MlaScalarKernels();
const MlaIsaKernels& MlaAvx512Kernels();  // only call when the CPU has AVX-512 F/BW/VL/DQ

}  // namespace pd::engine::kernels

namespace pd::engine {
enum class IsaLevel;
}  // namespace pd::engine

namespace pd::engine::kernels {

// The table for a level (which the CPU must support); AVX2 uses the scalar table.
const MlaIsaKernels& MlaKernelsFor(IsaLevel level);

// out (num_heads, R), row stride R = the merge of `num_parts` partials of one token, normalised:
// M = max m_p, l = sum l_p exp(m_p - M), out = sum acc_p exp(m_p - M) / l. out may alias the
// acc of a single part.
void MlaMergePartials(const MlaPartial* parts, int num_parts, int num_heads, int kv_lora_rank,
                      float* out);

}  // namespace pd::engine::kernels
