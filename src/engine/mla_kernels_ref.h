// Reference kernels of Multi-head Latent Attention (mla_kernels.h has the shapes): plain loops,
// single-threaded. The fast MLA kernels are tested against these.
#pragma once

#include <cstdint>

#include "engine/mla_kernels.h"

namespace pd::engine::ref {

// The latent row of (page, slot): (latent_dim) elements.
const uint8_t* LatentRowPtr(const kernels::PagedLatent& kv, int32_t page, int slot);
// Element i of a latent row as float.
float LoadLatent(const kernels::PagedLatent& kv, const uint8_t* row, int i);

// Writes rows (seq.num_tokens, latent_dim), row stride ld, of the seq's tokens into their page
// slots: position p goes to page page_table[p / page_size], slot p % page_size (bf16: rounded to
// nearest even; fp8: ref::QuantizeKvFp8 with the latent scale).
void AppendLatent(const kernels::PagedLatent& kv, const kernels::AttnSeq& seq, const float* rows,
                  int64_t ld);

// Causal absorbed MLA attention of every token and head, softmax in f32 with max subtraction:
//   score[s] = scale * q[t, h, :] . latent[s, :]   (L)
//   out[t, h, :] = sum_s softmax(score)[s] * latent[s, :R]
// scratch: at least (max position in the batch + 1) floats.
void MlaAttention(const kernels::MlaAttentionArgs& args, float* scratch);

// In place on the rope part of each head: x + r*ldx + h*head_stride holds `dim` values, rotated
// by the angles of row r (cos/sin (rows, dim/2)).
//   interleave: pairs (2i, 2i+1) with frequency i (DeepSeek's rope_interleave checkpoints; the
//               values stay in the checkpoint's order: transformers'
//               apply_rotary_pos_emb_interleave gives the same numbers in the order 0, 2, 4, ...,
//               1, 3, 5, ..., for q and k alike, so every dot product is the same);
//   else:       pairs (i, i + dim/2) (rotate_half, as ref::ApplyRope).
void ApplyRopeStrided(float* x, int64_t rows, int64_t ldx, int num_heads, int64_t head_stride,
                      int dim, const float* cos_table, const float* sin_table, bool interleave);

}  // namespace pd::engine::ref
