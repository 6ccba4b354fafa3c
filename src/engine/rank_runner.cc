// One rank's forward pass: the whole model at TP 1, or one rank's shard inside the TP runner.
#include "engine/rank_runner.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>

#include "engine/cpu_features.h"
#include "engine/kernels.h"
#include "engine/kernels_ref.h"
#include "engine/thread_pool.h"

#include "engine/rank_runner_impl.h"

namespace pd::engine {

void RankRunner::Matmul(const float* x, int64_t ldx, const WeightMatrix& w, float* out, int64_t ldo,
                        int64_t rows) {
  if (fast_) {
    kernels::ParallelMatmul(pool_, isa_, x, rows, ldx, w, out, ldo);
  } else if (bf16_dot_) {
    ref::MatmulBf16Dot(x, rows, ldx, w, out, ldo);
  } else {
    ref::Matmul(x, rows, ldx, w, out, ldo);
  }
}

void RankRunner::RmsNorm(const float* x, int64_t rows, int64_t dim, int64_t ldx, const float* w,
                         float* o, int64_t ldo) {
  const float eps = static_cast<float>(c_.rms_norm_eps);
  Rows(rows, [&](int64_t b, int64_t e) {
    NormRows(x + b * ldx, e - b, dim, ldx, w, eps, o + b * ldo, ldo);
  });
}

Status RankRunner::Validate(const ForwardBatch& batch) const {
  const int page_size = region_->spec().page_size;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SeqStep& s = batch.seqs[i];
    const std::string who = "seq " + std::to_string(s.seq_id) + ": ";
    if (s.token_ids.empty()) return InvalidArgument(who + "no tokens to run");
    if (s.compute_logits && (s.num_logits < 1 || size_t(s.num_logits) > s.token_ids.size()))
      return InvalidArgument(who + "num_logits " + std::to_string(s.num_logits) + " outside [1, " +
                             std::to_string(s.token_ids.size()) + "]");
    if (s.start_pos < 0) return InvalidArgument(who + "negative start_pos");
    const int64_t end = static_cast<int64_t>(s.start_pos) + s.token_ids.size();
    if (c_.max_position_embeddings > 0 && end > c_.max_position_embeddings)
      return InvalidArgument(who + "positions up to " + std::to_string(end - 1) +
                             " exceed max_position_embeddings " +
                             std::to_string(c_.max_position_embeddings));
    const int64_t pages_needed = (end + page_size - 1) / page_size;
    if (static_cast<int64_t>(s.page_table.size()) < pages_needed)
      return InvalidArgument(who + "page table has " + std::to_string(s.page_table.size()) +
                             " pages, " + std::to_string(pages_needed) + " needed for " +
                             std::to_string(end) + " tokens");
    for (int64_t p = 0; p < pages_needed; ++p)
      if (s.page_table[p] < 0 || s.page_table[p] >= region_->num_pages())
        return InvalidArgument(who + "page id " + std::to_string(s.page_table[p]) +
                               " outside the region's " + std::to_string(region_->num_pages()) +
                               " pages");
    for (int32_t t : s.token_ids)
      if (t < 0 || t >= c_.vocab_size)
        return InvalidArgument(who + "token id " + std::to_string(t) + " outside vocab of " +
                               std::to_string(c_.vocab_size));
  }
  return w_->mtp_input != nullptr ? ValidateMtpInput(batch) : OkStatus();
}

void RankRunner::Prepare(const ForwardBatch& batch) {
  int64_t t = 0;
  max_pos_ = 0;
  s_.seqs.clear();
  for (const SeqStep& s : batch.seqs) t += static_cast<int64_t>(s.token_ids.size());
  num_tokens_ = t;
  const int64_t qkv_ld = c_.q_size() + 2 * c_.kv_size();
  Ensure(s_.x, t * c_.hidden_size);
  Ensure(s_.h, t * c_.hidden_size);
  Ensure(s_.tmp, t * c_.hidden_size);
  Ensure(s_.qkv, t * qkv_ld);
  Ensure(s_.attn, t * c_.q_size());
  Ensure(s_.gate, 2 * t * c_.intermediate_size);  // gate|up side by side when fused
  Ensure(s_.up, t * c_.intermediate_size);
  Ensure(s_.rope_cos, t * c_.head_dim / 2);
  Ensure(s_.rope_sin, t * c_.head_dim / 2);
  Ensure(s_.positions, t);
  Ensure(s_.token_seq, t);
  Ensure(s_.tokens, t);
  int64_t row = 0;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SeqStep& s = batch.seqs[i];
    const int n = static_cast<int>(s.token_ids.size());
    s_.seqs.push_back(AttnSeq{static_cast<int>(row), n, s.start_pos, s.page_table.data()});
    for (int j = 0; j < n; ++j, ++row) {
      s_.positions[row] = s.start_pos + j;
      s_.token_seq[row] = static_cast<int32_t>(i);
      s_.tokens[row] = s.token_ids[j];
    }
    max_pos_ = std::max(max_pos_, s.start_pos + n - 1);
  }
  const int group = c_.num_heads / c_.num_kv_heads;
  const size_t attn_stride =
      fast_ ? kernels::AttentionItemScratchFloats(group, c_.head_dim) : max_pos_ + 1;
  Ensure(s_.attn_scratch, attn_stride * pool_.num_threads());
  if (c_.is_mla()) {  // the rope part only, with yarn
    Ensure(s_.rope_cos, t * c_.mla.qk_rope_head_dim / 2);
    Ensure(s_.rope_sin, t * c_.mla.qk_rope_head_dim / 2);
    MlaRopeTable(mla_rope_, s_.positions.data(), t, s_.rope_cos.data(), s_.rope_sin.data());
  } else {
    ref::RopeTable(s_.positions.data(), t, c_.head_dim, c_.rope_theta, s_.rope_cos.data(),
                   s_.rope_sin.data());
  }
  Rows(t, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      LoadWeightRow(w_->embed.w, s_.tokens[r], s_.x.data() + r * c_.hidden_size);
  });
  if (w_->mtp_input != nullptr) MtpInput(batch);
}

void RankRunner::AppendWarmRanges(std::span<const int32_t> pages, std::vector<MemRange>* out) {
  auto add_matrix = [&](const WeightMatrix& m) {
    if (m.data == nullptr) return;
    const size_t bytes = m.layout == kernels::WeightLayout::kPanel32
                             ? kernels::Panel32BytesLike(m.n, m)
                             : kernels::RowMajorBytes(m);
    out->push_back({static_cast<const uint8_t*>(m.data), bytes});
  };
  if (w_->packed != nullptr) {  // every matrix a decode step multiplies by, in one buffer
    out->push_back({w_->packed->data(), w_->packed->size()});
  } else {
    for (const RunnerLayerWeights& L : w_->layers) {
      for (const LinearWeight* m : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) {
        add_matrix(m->w);
      }
      AppendMoeWarmRanges(L.moe, out);
      if (L.mla != nullptr) {
        const RunnerMlaWeights& M = *L.mla;
        for (const LinearWeight* m : {&M.q, &M.q_a, &M.q_b, &M.kv_a, &M.kv_b, &M.uk_t_all, &M.o})
          add_matrix(m->w);
      }
    }
    add_matrix(w_->lm_head.w);
  }
  const size_t page_bytes = region_->spec().page_bytes();
  for (int l = 0; l < region_->spec().num_layers; ++l) {
    for (int32_t p : pages) {
      if (p >= 0 && p < region_->num_pages()) out->push_back({region_->Block(l, p), page_bytes});
    }
  }
}

Status RankRunner::Forward(const ForwardBatch& batch, ForwardOutput* out) {
  const Status valid = Validate(batch);
  if (rank_.experts != nullptr && (!valid.ok() || batch.seqs.empty())) {
    ServeExpertsOnly();  // the other data-parallel ranks' tokens still need this rank's experts
    out->logits.clear();
    out->last_hidden.clear();
    out->hidden.clear();
    return valid;
  }
  RETURN_IF_ERROR(valid);
  if (rank_.reduce == nullptr) {  // with TP the caller sizes out: the ranks write parts of it
    out->logits.resize(batch.seqs.size());
    out->last_hidden.resize(batch.seqs.size());
    out->hidden.resize(batch.all_hidden ? batch.seqs.size() : 0);
  }
  if (batch.seqs.empty()) return OkStatus();
  Prepare(batch);
  for (int l = 0; l < c_.num_layers; ++l) {
    const int64_t begin_ns = tracer_ != nullptr ? Tracer::NowNs() : 0;
    Layer(l);
    if (tracer_ != nullptr) {
      tracer_->Complete("layer", "compute", begin_ns, Tracer::NowNs(),
                        {{"layer", int64_t{l}},
                         {"step", static_cast<int64_t>(steps_done_)},
                         {"tokens", num_tokens_}});
    }
  }
  Finish(batch, out);
  if (batch.all_hidden) AllHidden(batch, out);
  ++steps_done_;
  return OkStatus();
}

void RankRunner::Layer(int l) {
  AttentionBlock(l);
  MlpBlock(l);
}

void RankRunner::AttentionBlock(int l) {
  if (c_.is_mla()) {
    MlaAttentionBlock(l);  // rank_runner_mla.cc
    return;
  }
  const RunnerLayerWeights& L = w_->layers[l];
  const int64_t t = num_tokens_, hd = c_.hidden_size, q = c_.q_size(), kv = c_.kv_size();
  const int64_t ld = q + 2 * kv, half = c_.head_dim / 2;
  const float eps = static_cast<float>(c_.rms_norm_eps);
  float* x = s_.x.data();
  float* h = s_.h.data();
  float* qkv = s_.qkv.data();  // (T, q | k | v)
  RmsNorm(x, t, hd, hd, L.input_norm.data(), h, hd);
  if (L.qkv.data != nullptr) {  // fused and packed at load
    Matmul(h, hd, L.qkv, qkv, ld, t);
  } else {
    Matmul(h, hd, L.q.w, qkv, ld, t);
    Matmul(h, hd, L.k.w, qkv + q, ld, t);
    Matmul(h, hd, L.v.w, qkv + q + kv, ld, t);
  }
  Rows(t, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* row = qkv + r * ld;
      if (c_.attention_bias) {
        for (int64_t i = 0; i < q; ++i) row[i] += L.q_bias[i];
        for (int64_t i = 0; i < kv; ++i) row[q + i] += L.k_bias[i];
        for (int64_t i = 0; i < kv; ++i) row[q + kv + i] += L.v_bias[i];
      }
      if (c_.qk_norm) {  // per-head RMSNorm before RoPE (qwen3)
        NormRows(row, c_.num_heads, c_.head_dim, c_.head_dim, L.q_norm.data(), eps, row,
                 c_.head_dim);
        NormRows(row + q, c_.num_kv_heads, c_.head_dim, c_.head_dim, L.k_norm.data(), eps, row + q,
                 c_.head_dim);
      }
    }
    const float* cs = s_.rope_cos.data() + b * half;
    const float* sn = s_.rope_sin.data() + b * half;
    ref::ApplyRope(qkv + b * ld, e - b, c_.num_heads, c_.head_dim, ld, cs, sn);
    ref::ApplyRope(qkv + b * ld + q, e - b, c_.num_kv_heads, c_.head_dim, ld, cs, sn);
  });
  Attention(l);
  Matmul(s_.attn.data(), q, L.o.w, s_.tmp.data(), hd, t);
  AddResidual(x, s_.tmp.data(), t * hd, /*attention=*/true);
  if (!L.o_bias.empty()) {  // (hidden) added to every token's attention output
    Rows(t, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r)
        for (int64_t i = 0; i < hd; ++i) x[r * hd + i] += L.o_bias[i];
    });
  }
}

void RankRunner::MlpBlock(int l) {
  if (c_.IsMoeLayer(l)) return MoeMlpBlock(l);
  const RunnerLayerWeights& L = w_->layers[l];
  const int64_t t = num_tokens_, hd = c_.hidden_size, inter = c_.intermediate_size;
  float* x = s_.x.data();
  float* h = s_.h.data();
  RmsNorm(x, t, hd, hd, L.post_norm.data(), h, hd);
  // gate and up side by side in one (T, 2*inter) buffer when fused, in two otherwise.
  float* gate = s_.gate.data();
  float* up = s_.up.data();
  int64_t ldg = inter;
  if (L.gate_up.data != nullptr) {
    ldg = 2 * inter;
    up = gate + inter;
    Matmul(h, hd, L.gate_up, gate, ldg, t);
  } else {
    Matmul(h, hd, L.gate.w, gate, inter, t);
    Matmul(h, hd, L.up.w, up, inter, t);
  }
  Rows(t, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      if (fast_) {
        isa_.silu_mul_row(gate + r * ldg, up + r * ldg, inter, gate + r * ldg);
      } else {
        ref::SiluMul(gate + r * ldg, ldg, up + r * ldg, ldg, 1, inter, gate + r * ldg, ldg);
      }
    }
  });
  Matmul(gate, ldg, L.down.w, s_.tmp.data(), hd, t);
  AddResidual(x, s_.tmp.data(), t * hd, /*attention=*/false);
}

void RankRunner::AddResidual(float* x, const float* tmp, int64_t n, bool attention) {
  if (rank_.reduce == nullptr) {
    if (attention) progress_.Bump();  // this layer's KV is final: the messenger may stream it now
    Elements(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) x[i] += tmp[i];
    });
    return;
  }
  rank_.reduce->Arrive(rank_.rank, tmp);  // every rank's sub-layer (and KV append) is done
  if (attention) progress_.Bump();
  const std::vector<const float*>& parts = rank_.reduce->Parts();
  const size_t num_parts = parts.size();
  Elements(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float sum = parts[0][i];
      for (size_t r = 1; r < num_parts; ++r) sum += parts[r][i];
      x[i] += sum;
    }
  });
  rank_.reduce->Depart();
}

void RankRunner::Attention(int l) {
  const KvCacheSpec& spec = region_->spec();
  const int64_t q = c_.q_size(), kv = c_.kv_size(), ld = q + 2 * kv;
  kernels::PagedKv pkv;
  pkv.base = region_->Block(l, 0);
  pkv.page_bytes = static_cast<int64_t>(spec.page_bytes());
  pkv.page_size = spec.page_size;
  pkv.num_kv_heads = spec.num_kv_heads;
  pkv.head_dim = spec.head_dim;
  pkv.hnd = spec.layout == KvLayout::kHND;
  pkv.bf16 = spec.dtype == KvDType::kBF16;
  pkv.fp8 = spec.dtype == KvDType::kFP8E4M3;
  pkv.k_scale = spec.LayerScales(l).k_scale;
  pkv.v_scale = spec.LayerScales(l).v_scale;
  const float* qkv = s_.qkv.data();
  Rows(static_cast<int64_t>(s_.seqs.size()), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const AttnSeq& seq = s_.seqs[i];
      const float* row = qkv + static_cast<int64_t>(seq.token_begin) * ld;
      ref::AppendKv(pkv, seq, row + q, ld, row + q + kv, ld);
    }
  });
  kernels::AttentionArgs a;
  a.kv = pkv;
  a.num_heads = c_.num_heads;
  a.q = qkv;
  a.ldq = ld;
  a.out = s_.attn.data();
  a.ldo = q;
  a.seqs = s_.seqs.data();
  a.num_seqs = static_cast<int>(s_.seqs.size());
  a.token_seq = s_.token_seq.data();
  a.num_tokens = static_cast<int>(num_tokens_);
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c_.head_dim)));
  if (fast_) {
    kernels::ParallelAttention(pool_, isa_, a, s_.attn_scratch.data(),
                               s_.attn_scratch.size() / pool_.num_threads());
  } else {
    ref::PagedAttention(a, s_.attn_scratch.data());
  }
}

void RankRunner::Finish(const ForwardBatch& batch, ForwardOutput* out) {
  const int64_t hd = c_.hidden_size, vocab = w_->lm_head.w.n;  // with TP: this rank's rows
  const int64_t full_vocab = c_.vocab_size;
  const int64_t num_seqs = static_cast<int64_t>(batch.seqs.size());
  const float eps = static_cast<float>(c_.rms_norm_eps);
  // Final norm of the rows that leave the model into final_h (R, hidden): the last num_logits
  // rows of each seq wanting logits first, so lm_head reads its weights once for all of them,
  // then the last row of each other seq (its hidden state only). final_slot[i] is seq i's first
  // row; its last token's row is final_slot[i] + rows(i) - 1.
  auto rows_of = [&](int64_t i) -> int64_t {
    return batch.seqs[i].compute_logits ? batch.seqs[i].num_logits : 1;
  };
  Ensure(s_.final_slot, num_seqs);
  int64_t num_logits = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    if (!batch.seqs[i].compute_logits) continue;
    s_.final_slot[i] = static_cast<int32_t>(num_logits);
    num_logits += rows_of(i);
  }
  int64_t num_rows = num_logits;
  for (int64_t i = 0; i < num_seqs; ++i)
    if (!batch.seqs[i].compute_logits) s_.final_slot[i] = static_cast<int32_t>(num_rows++);
  Ensure(s_.final_h, num_rows * hd);
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t n = rows_of(i);
    const int64_t row = s_.seqs[i].token_begin + s_.seqs[i].num_tokens - n;
    ref::RmsNorm(s_.x.data() + row * hd, n, hd, hd, w_->final_norm.data(), eps,
                 s_.final_h.data() + s_.final_slot[i] * hd, hd);
  }
  Ensure(s_.logits, num_logits * vocab);
  if (num_logits > 0)
    Matmul(s_.final_h.data(), hd, w_->lm_head.w, s_.logits.data(), vocab, num_logits);
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t slot = s_.final_slot[i], n = rows_of(i);
    const float* hrow = s_.final_h.data() + (slot + n - 1) * hd;
    const float* lrows = s_.logits.data() + slot * vocab;
    if (rank_.reduce != nullptr) {  // out is sized by the caller: write this rank's part
      if (rank_.rank == 0) std::copy(hrow, hrow + hd, out->last_hidden[i].begin());
      if (!batch.seqs[i].compute_logits) continue;
      for (int64_t r = 0; r < n; ++r) {
        std::copy(lrows + r * vocab, lrows + (r + 1) * vocab,
                  out->logits[i].begin() + r * full_vocab + rank_.vocab_begin);
      }
      continue;
    }
    out->last_hidden[i].assign(hrow, hrow + hd);
    if (batch.seqs[i].compute_logits) {
      out->logits[i].assign(lrows, lrows + n * vocab);
    } else {
      out->logits[i].clear();
    }
  }
}

void RankRunner::AllHidden(const ForwardBatch& batch, ForwardOutput* out) {
  if (rank_.reduce != nullptr && rank_.rank != 0) return;  // replicated: rank 0 writes
  const int64_t hd = c_.hidden_size;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const AttnSeq& seq = s_.seqs[i];
    const float* x = s_.x.data() + static_cast<int64_t>(seq.token_begin) * hd;
    std::vector<float>& dst = out->hidden[i];
    dst.resize(static_cast<size_t>(seq.num_tokens) * hd);
    if (w_->mtp_input != nullptr) {  // before shared_head.norm: the next draft step's input
      std::copy(x, x + dst.size(), dst.begin());
    } else {
      RmsNorm(x, seq.num_tokens, hd, hd, w_->final_norm.data(), dst.data(), hd);
    }
  }
}

KvCacheSpec RankKvSpec(KvCacheSpec spec, const model::ModelConfig& c, int num_kv_heads) {
  if (c.is_mla()) {  // one latent row per token: `layout` does not apply
    spec.latent_dim = c.mla.latent_dim();
    spec.num_kv_heads = 1;
    spec.head_dim = spec.latent_dim;
    return spec;
  }
  spec.latent_dim = 0;
  spec.num_kv_heads = num_kv_heads;
  spec.head_dim = c.head_dim;
  return spec;
}

Result<int64_t> RunnerNumPages(const ModelRunnerOptions& options, size_t page_bytes_all_ranks,
                               int num_layers) {
  if (options.kv.page_size <= 0)
    return InvalidArgument("page_size must be positive, got " +
                           std::to_string(options.kv.page_size));
  if (options.num_pages < 0 || options.num_threads < 0)
    return InvalidArgument("num_pages and num_threads must not be negative");
  if (options.num_pages > 0) return options.num_pages;
  const size_t bytes = page_bytes_all_ranks * num_layers;
  const int64_t num_pages = static_cast<int64_t>(options.kv_cache_bytes / bytes);
  if (num_pages < 1)
    return InvalidArgument("kv_cache_bytes " + std::to_string(options.kv_cache_bytes) +
                           " holds no page: one page over all layers takes " +
                           std::to_string(bytes) + " bytes");
  return std::min<int64_t>(num_pages, 1 << 30);
}

Result<std::unique_ptr<ModelRunner>> CreateRankRunner(std::unique_ptr<RunnerWeights> rw,
                                                      const ModelRunnerOptions& options,
                                                      int64_t num_pages, const RankContext& ctx) {
  const model::ModelConfig& c = rw->config;
  KvCacheSpec spec = RankKvSpec(options.kv, c, c.num_kv_heads);
  spec.num_layers = c.num_layers;
  spec.scales.clear();
  if (spec.dtype == KvDType::kFP8E4M3) spec.scales = rw->kv_scales;  // empty: 1.0
  ASSIGN_OR_RETURN(std::unique_ptr<KvRegion> region,
                   KvRegion::Create(spec, static_cast<int>(num_pages)));
  int threads = options.num_threads;
  if (threads == 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, cores / std::max(1, options.tensor_parallel_size));
  }
  if (options.kernels == KernelKind::kReference) threads = 1;
  if (options.kernels == KernelKind::kFast &&
      kernels::KernelsFor(BestIsaLevel()).matmul_panel != nullptr) {
    ThreadPool pack_pool(threads);
    RETURN_IF_ERROR(PackRunnerWeights(pack_pool, rw.get()));
  }
  auto runner = std::make_unique<RankRunner>(std::move(rw), std::move(region), threads,
                                             options.kernels, options.matmul, ctx);
  if (ctx.rank == 0) runner->set_tracer(options.tracer);  // the leader's layers stand for all
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

Result<std::unique_ptr<ModelRunner>> CreateSingleRankRunner(const model::ModelWeights& weights,
                                                            const ModelRunnerOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<RunnerWeights> rw, PrepareRunnerWeights(weights));
  const KvCacheSpec spec = RankKvSpec(options.kv, rw->config, rw->config.num_kv_heads);
  ASSIGN_OR_RETURN(int64_t num_pages,
                   RunnerNumPages(options, spec.page_bytes(), rw->config.num_layers));
  return CreateRankRunner(std::move(rw), options, num_pages, RankContext{});
}

}  // namespace pd::engine
