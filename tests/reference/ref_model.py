#!/usr/bin/python3
"""Independent float64 NumPy reference for Hugging Face causal LMs: Llama, Qwen2, Qwen3, Qwen3-MoE
(Qwen3MoeForCausalLM) and DeepSeek-V3 (DeepseekV3ForCausalLM).

It shares no code with pdserve: it parses config.json and the safetensors files itself and follows
the forward pass of transformers' modeling_{llama,qwen2,qwen3,qwen3_moe,deepseek_v3}.py:

  x = embed_tokens[ids]
  per layer:
    h = RMSNorm(x) * input_layernorm                  RMSNorm(x) = x / sqrt(mean(x^2) + eps)
    x = x + attention(h)
    h2 = RMSNorm(x) * post_attention_layernorm
    x = x + (moe(h2) if the layer is sparse else down(silu(gate(h2)) * up(h2)))
  logits = RMSNorm(x) * norm @ (lm_head or embed_tokens when tie_word_embeddings)^T

attention, llama/qwen2/qwen3/qwen3_moe (GQA):
    q, k, v = h @ Wq^T (+bq), h @ Wk^T (+bk), h @ Wv^T (+bv)     (T, heads|kv_heads, head_dim)
    qwen3, qwen3_moe: q = RMSNorm_head(q) * q_norm, k = RMSNorm_head(k) * k_norm  (before RoPE)
    RoPE: x*cos + rotate_half(x)*sin, rotate_half pairs dims i and i+d/2,
          inv_freq = 1 / theta^(arange(0, d, 2) / d), angle = pos * inv_freq (yarn: see below)
    q head h reads kv head h // (heads / kv_heads); causal softmax(q k^T / sqrt(d)) v; o_proj
attention, deepseek_v3 (MLA, expanded per head as HF computes it):
    q = q_proj(h), or q_b_proj(RMSNorm(q_a_proj(h)) * q_a_layernorm) when q_lora_rank is set;
        per head q = [q_nope (qk_nope_head_dim), q_rope (qk_rope_head_dim)]
    [c (kv_lora_rank), k_rope (qk_rope_head_dim, shared by all heads)] = kv_a_proj_with_mqa(h)
    c = RMSNorm(c) * kv_a_layernorm; per head [k_nope, v (v_head_dim)] = kv_b_proj(c)
    RoPE on q_rope and k_rope only (rope_interleave: pairs (2i, 2i+1); else (i, i+d/2))
    scores = (q_nope.k_nope + q_rope.k_rope) * qk_head_dim^-0.5 (* mscale^2 with yarn's
    mscale_all_dim); causal softmax; v; o_proj
moe, qwen3_moe (layer i unless i in mlp_only_layers, when (i+1) % decoder_sparse_step == 0):
    softmax(h @ gate^T) -> top num_experts_per_tok (renormalised when norm_topk_prob)
    -> sum of weight * expert_e(h), experts SwiGLU of moe_intermediate_size
moe, deepseek_v3 (layers >= first_k_dense_replace): sigmoid scores, noaux_tc group-limited top-k
    on scores + e_score_correction_bias, weights from the unbiased scores (route_noaux_tc), plus
    shared_experts(h) of width n_shared_experts * moe_intermediate_size
yarn (rope_scaling type "yarn"): rope_parameters(); cos/sin are multiplied by attention_factor.

Every bias tensor present in the checkpoint is applied (qwen2's q/k/v biases; llama's and qwen3's
attention_bias, which also puts a bias on o_proj). Everything is computed in float64. The
multi-token-prediction layer of deepseek_v3 (model.layers.{num_hidden_layers}.*) runs only for a
request with "mtp" (mtp_forward).

CLI:
  ref_model.py --model DIR --requests REQ.json --out OUT.bin

REQ.json:  {"requests": [{"tokens": [int, ...], "positions": [int, ...], "greedy": N}, ...]}
  Each request is one sequence starting at position 0; `positions` lists the positions whose
  next-token logits to output (0 <= p < len(tokens)). Attention is causal, so the logits at
  position p depend only on tokens[0..p]: one request covers a prompt and its decode steps.
  "greedy" (optional, default 0): first extend tokens N times by the argmax of the last
  position's logits (lowest id on a tie); positions then index the extended sequence, so
  positions len(tokens)-1 .. len(tokens)+N-2 give the rows the greedy tokens were taken from.
  "mtp" (optional, default false): the rows are deepseek_v3's first MTP layer's logits instead
  (mtp_forward): position p (< len(tokens)-1) reads the target's hidden state at p and
  tokens[p+1], and predicts the token after tokens[p+1].

OUT.bin (little-endian):
  bytes 0..7    magic b"PDREFLG1"
  bytes 8..15   uint64 vocab_size
  bytes 16..23  uint64 num_rows  (sum of len(positions) over requests)
  then num_rows x vocab_size float64: the rows in request order, then position order.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

MAGIC = b"PDREFLG1"


class RefError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# safetensors

def _decode(raw, dtype, shape):
    """raw: uint8 bytes of one tensor -> float64 array of `shape`."""
    if dtype == "F64":
        arr = raw.view("<f8")
    elif dtype == "F32":
        arr = raw.view("<f4")
    elif dtype == "F16":
        arr = raw.view("<f2")
    elif dtype == "BF16":
        # bf16 is the top half of an IEEE float32.
        arr = (raw.view("<u2").astype(np.uint32) << 16).view("<f4")
    elif dtype == "F8_E4M3":
        arr = _E4M3[raw]
    else:
        raise RefError("unsupported safetensors dtype %s" % dtype)
    return arr.astype(np.float64).reshape(shape)


def _e4m3_table():
    """float8_e4m3fn code -> value: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits, no
    infinities, S.1111.111 NaN."""
    table = np.zeros(256, dtype=np.float64)
    for code in range(256):
        exp, mant = (code >> 3) & 0xF, code & 0x7
        if exp == 0xF and mant == 0x7:
            mag = np.nan
        elif exp == 0:
            mag = mant / 8.0 * 2.0 ** -6
        else:
            mag = (1.0 + mant / 8.0) * 2.0 ** (exp - 7)
        table[code] = -mag if code & 0x80 else mag
    return table


_E4M3 = _e4m3_table()
_DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1}
BLOCK = 128  # weight_block_size of FP8 checkpoints (quantization_config)


def dequantise_fp8(tensors):
    """FP8 checkpoints (DeepSeek-V3, Qwen3-FP8): each W (n, k) with `W_scale_inv` (f32,
    (ceil(n/128), ceil(k/128))) becomes W * scale_inv of its 128x128 block, exactly in float64;
    the scales are dropped."""
    out = {}
    for name, arr in tensors.items():
        if name.endswith("_scale_inv"):
            if name[:-len("_scale_inv")] not in tensors:
                raise RefError("%s: no tensor %s to scale" % (name, name[:-len("_scale_inv")]))
            continue
        scale = tensors.get(name + "_scale_inv")
        if scale is not None:
            n, k = arr.shape
            if scale.shape != ((n + BLOCK - 1) // BLOCK, (k + BLOCK - 1) // BLOCK):
                raise RefError("%s_scale_inv: shape %s does not fit %s" % (name, scale.shape,
                                                                          arr.shape))
            full = np.repeat(np.repeat(scale, BLOCK, axis=0), BLOCK, axis=1)[:n, :k]
            arr = arr * full
        out[name] = arr
    return out


def read_safetensors(path):
    """Returns {name: float64 ndarray} for every tensor of one .safetensors file."""
    data = np.fromfile(path, dtype=np.uint8)
    if data.size < 8:
        raise RefError("%s: file shorter than the 8-byte header length" % path)
    (header_len,) = struct.unpack("<Q", data[:8].tobytes())
    if 8 + header_len > data.size:
        raise RefError("%s: header length %d exceeds file size" % (path, header_len))
    header = json.loads(data[8:8 + header_len].tobytes().decode("utf-8"))
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape = info["dtype"], [int(s) for s in info["shape"]]
        begin, end = (int(o) for o in info["data_offsets"])
        count = int(np.prod(shape)) if shape else 1
        if dtype not in _DTYPE_SIZE:
            raise RefError("%s: %s: unsupported dtype %s" % (path, name, dtype))
        if end - begin != count * _DTYPE_SIZE[dtype] or base + end > data.size:
            raise RefError("%s: %s: bad data_offsets" % (path, name))
        out[name] = _decode(data[base + begin:base + end], dtype, shape)
    return out


def read_checkpoint(model_dir):
    """All tensors of a model dir: model.safetensors, or the shards an index names."""
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            for name, arr in read_safetensors(os.path.join(model_dir, shard)).items():
                if weight_map.get(name) == shard:
                    tensors[name] = arr
        missing = [n for n in weight_map if n not in tensors]
        if missing:
            raise RefError("index names tensors missing from their shard: %s" % missing[:3])
        return tensors
    return read_safetensors(os.path.join(model_dir, "model.safetensors"))


# ---------------------------------------------------------------------------------------------
# config

_ARCHS = ("llama", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3")


class Config:
    """The fields of config.json the forward pass reads, with transformers' defaults."""

    def __init__(self, cfg):
        self.model_type = cfg["model_type"]
        if self.model_type not in _ARCHS:
            raise RefError("unsupported model_type %s" % self.model_type)
        self.is_mla = self.model_type == "deepseek_v3"
        self.qk_norm = self.model_type in ("qwen3", "qwen3_moe")
        self.hidden = int(cfg["hidden_size"])
        self.num_layers = int(cfg["num_hidden_layers"])
        self.num_heads = int(cfg["num_attention_heads"])
        self.num_kv_heads = int(cfg.get("num_key_value_heads") or self.num_heads)
        self.head_dim = int(cfg.get("head_dim") or self.hidden // self.num_heads)
        self.vocab = int(cfg["vocab_size"])
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.max_pos = int(cfg.get("max_position_embeddings", 4096 if self.is_mla else 32768))
        self.tie = bool(cfg.get("tie_word_embeddings", False))
        if self.num_heads % self.num_kv_heads and not self.is_mla:  # MLA does not read it
            raise RefError("num_attention_heads not a multiple of num_key_value_heads")
        if self.is_mla:
            self._parse_mla(cfg)
        self._parse_moe(cfg)
        self._parse_rope(cfg)

    def _parse_mla(self, cfg):
        # configuration_deepseek_v3.py: q_lora_rank defaults to 1536 when the key is absent;
        # null selects the plain q_proj.
        q_lora = cfg.get("q_lora_rank", 1536)
        self.q_lora_rank = int(q_lora) if q_lora else 0
        self.kv_lora_rank = int(cfg.get("kv_lora_rank", 512))
        self.qk_nope = int(cfg.get("qk_nope_head_dim", 128))
        self.qk_rope = int(cfg.get("qk_rope_head_dim", 64))
        self.v_head_dim = int(cfg.get("v_head_dim", 128))
        self.rope_interleave = bool(cfg.get("rope_interleave", True))
        self.qk_head_dim = self.qk_nope + self.qk_rope
        # HF sets head_dim = qk_rope_head_dim: the rotary dim yarn's correction range uses.
        self.head_dim = self.qk_rope

    def _parse_moe(self, cfg):
        self.num_experts = 0
        if self.model_type == "qwen3_moe":
            self.num_experts = int(cfg.get("num_experts", 128))
            self.top_k = int(cfg.get("num_experts_per_tok", 8))
            self.moe_inter = int(cfg.get("moe_intermediate_size", 768))
            self.norm_topk = bool(cfg.get("norm_topk_prob", False))
            self.sparse_step = int(cfg.get("decoder_sparse_step", 1))
            self.mlp_only = [int(i) for i in (cfg.get("mlp_only_layers") or [])]
        elif self.model_type == "deepseek_v3":
            for key, want in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):
                if cfg.get(key, want) != want:
                    raise RefError("%s %r is not supported (only %r)" % (key, cfg[key], want))
            self.num_experts = int(cfg.get("n_routed_experts", 256))
            self.top_k = int(cfg.get("num_experts_per_tok", 8))
            self.moe_inter = int(cfg.get("moe_intermediate_size", 2048))
            self.norm_topk = bool(cfg.get("norm_topk_prob", True))
            self.n_group = int(cfg.get("n_group", 8))
            self.topk_group = int(cfg.get("topk_group", 4))
            self.routed_scale = float(cfg.get("routed_scaling_factor", 2.5))
            self.n_shared = int(cfg.get("n_shared_experts") or 0)
            self.first_dense = int(cfg.get("first_k_dense_replace", 3))
            if self.num_experts % self.n_group or self.num_experts // self.n_group < 2:
                raise RefError("n_routed_experts must be n_group groups of at least 2 experts")

    def _parse_rope(self, cfg):
        # Older config.json files say rope_scaling (with "type" or "rope_type"); transformers 5
        # writes rope_parameters, which may also hold rope_theta.
        scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
        self.theta = float(scaling.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        self.rope_type = scaling.get("rope_type", scaling.get("type")) or "default"
        self.yarn = None
        if self.rope_type == "yarn":
            self.yarn = scaling
        elif self.rope_type != "default":
            raise RefError("rope_scaling type %r is not supported" % self.rope_type)

    def is_moe_layer(self, i):
        if self.num_experts == 0:
            return False
        if self.model_type == "qwen3_moe":  # Qwen3MoeDecoderLayer
            return i not in self.mlp_only and (i + 1) % self.sparse_step == 0
        return i >= self.first_dense  # DeepseekV3DecoderLayer


def load_model(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = Config(json.load(f))
    return cfg, dequantise_fp8(read_checkpoint(model_dir))


# ---------------------------------------------------------------------------------------------
# rotary embedding

def yarn_get_mscale(scale, mscale=1.0):
    """modeling_deepseek_v3.yarn_get_mscale (and get_mscale in _compute_yarn_parameters)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_parameters(cfg):
    """-> (inv_freq (d/2,), attention_factor) for rotary dim d = cfg.head_dim (qk_rope_head_dim
    for MLA), as ROPE_INIT_FUNCTIONS["default"] / ["yarn"] compute them.

    yarn follows transformers' _compute_yarn_parameters on main (the rope_parameters form):
    `factor` is the config value (replaced by max_position_embeddings /
    original_max_position_embeddings only when factor is absent), and the correction range uses
    rope_scaling's original_max_position_embeddings, else max_position_embeddings. transformers
    4.4x-4.5x instead overrode factor with that ratio whenever original_max_position_embeddings was
    given (their inv_freq and attention_factor then differ from main's, while the attention's
    mscale kept the config factor); DeepSeek-V3's own config has max_position_embeddings == factor
    * original_max_position_embeddings, where both readings agree.
    """
    d = cfg.head_dim
    exponents = np.arange(0, d, 2, dtype=np.float64) / d
    if cfg.yarn is None:
        return 1.0 / cfg.theta ** exponents, 1.0
    y = cfg.yarn
    orig = int(y.get("original_max_position_embeddings") or cfg.max_pos)
    factor = y.get("factor")
    factor = float(factor) if factor is not None else cfg.max_pos / orig
    attention_factor = y.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = y.get("mscale"), y.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = yarn_get_mscale(factor, mscale) / yarn_get_mscale(
                factor, mscale_all_dim)
        else:
            attention_factor = yarn_get_mscale(factor)
    beta_fast = float(y.get("beta_fast") or 32)
    beta_slow = float(y.get("beta_slow") or 1)

    def correction_dim(rotations):  # the dim whose wavelength makes `rotations` turns in orig
        return d * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(cfg.theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if y.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolation = 1.0 / cfg.theta ** exponents
    interpolation = extrapolation / factor
    # extrapolation weight 1 - ramp: high-frequency dims keep theta's frequencies
    return interpolation * ramp + extrapolation * (1.0 - ramp), float(attention_factor)


def rope(x, positions, inv_freq, attention_factor=1.0, interleave=False):
    """x (T, heads, d), positions (T,) -> rotated x.

    interleave false: rotate_half pairs dims i and i + d/2 (apply_rotary_pos_emb).
    interleave true: apply_rotary_pos_emb_interleave first de-interleaves x to
    [x0, x2, x4, ..., x1, x3, ...] and then applies rotate_half, i.e. it rotates the pairs
    (2i, 2i+1); the result stays in the de-interleaved order (q and k alike, so q.k is unchanged).
    cos and sin are multiplied by attention_factor (yarn's), as DeepseekV3RotaryEmbedding does.
    """
    d = x.shape[-1]
    if interleave:
        x = np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]  # (T, d/2)
    emb = np.concatenate([angles, angles], axis=-1)                      # (T, d)
    cos = (np.cos(emb) * attention_factor)[:, None, :]                   # (T, 1, d)
    sin = (np.sin(emb) * attention_factor)[:, None, :]
    half = d // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


# ---------------------------------------------------------------------------------------------
# layers

def rms_norm(x, w, eps):
    """x (..., n), w (n,) -> x / sqrt(mean(x^2) + eps) * w."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _linear(t, x, name):
    """x (T, in) @ W(out, in)^T (+ bias if the checkpoint has one) -> (T, out)."""
    y = x @ t[name + ".weight"].T
    bias = t.get(name + ".bias")
    return y if bias is None else y + bias


def _softmax_causal(scores):
    """scores (H, T, S=T) -> causal softmax over S (s > t masked)."""
    T = scores.shape[-1]
    causal = np.triu(np.ones((T, T), dtype=bool), k=1)
    scores = np.where(causal[None], -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    return probs / probs.sum(axis=-1, keepdims=True)


def attention(cfg, t, p, h, positions):
    """h (T, hidden) normed input of layer prefix p -> (T, hidden) attention output (GQA)."""
    T, H, KV, D = h.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q = _linear(t, h, p + "self_attn.q_proj").reshape(T, H, D)
    k = _linear(t, h, p + "self_attn.k_proj").reshape(T, KV, D)
    v = _linear(t, h, p + "self_attn.v_proj").reshape(T, KV, D)
    if cfg.qk_norm:
        q = rms_norm(q, t[p + "self_attn.q_norm.weight"], cfg.eps)
        k = rms_norm(k, t[p + "self_attn.k_norm.weight"], cfg.eps)
    inv_freq, factor = rope_parameters(cfg)
    q, k = rope(q, positions, inv_freq, factor), rope(k, positions, inv_freq, factor)
    group = H // KV
    k = np.repeat(k, group, axis=1)  # (T, H, D): q head h reads kv head h // group
    v = np.repeat(v, group, axis=1)
    probs = _softmax_causal(np.einsum("thd,shd->hts", q, k) / np.sqrt(D))  # (H, T, S)
    out = np.einsum("hts,shd->thd", probs, v).reshape(T, H * D)
    return _linear(t, out, p + "self_attn.o_proj")


def mla_softmax_scale(cfg):
    """DeepseekV3Attention.scaling: qk_head_dim^-0.5, times mscale^2 when rope scaling is on and
    mscale_all_dim is set (mscale = yarn_get_mscale(rope_scaling factor, mscale_all_dim))."""
    scale = cfg.qk_head_dim ** -0.5
    if cfg.yarn is not None and cfg.yarn.get("mscale_all_dim"):
        m = yarn_get_mscale(float(cfg.yarn["factor"]), float(cfg.yarn["mscale_all_dim"]))
        scale *= m * m
    return scale


def mla_attention(cfg, t, p, h, positions):
    """Multi-head latent attention (DeepseekV3Attention), in the expanded form HF computes:
    h (T, hidden) -> (T, hidden)."""
    T, H = h.shape[0], cfg.num_heads
    a = p + "self_attn."
    if cfg.q_lora_rank:
        # q_a_layernorm and kv_a_layernorm are DeepseekV3RMSNorm(n) with its default eps 1e-6,
        # not rms_norm_eps.
        q = _linear(t, rms_norm(_linear(t, h, a + "q_a_proj"), t[a + "q_a_layernorm.weight"],
                                1e-6), a + "q_b_proj")
    else:
        q = _linear(t, h, a + "q_proj")
    q = q.reshape(T, H, cfg.qk_head_dim)
    q_nope, q_rope = q[..., :cfg.qk_nope], q[..., cfg.qk_nope:]
    ckv = _linear(t, h, a + "kv_a_proj_with_mqa")  # (T, kv_lora_rank + qk_rope)
    latent = rms_norm(ckv[:, :cfg.kv_lora_rank], t[a + "kv_a_layernorm.weight"], 1e-6)
    k_rope = ckv[:, None, cfg.kv_lora_rank:]       # (T, 1, qk_rope): one key for every head
    kv = _linear(t, latent, a + "kv_b_proj").reshape(T, H, cfg.qk_nope + cfg.v_head_dim)
    k_nope, v = kv[..., :cfg.qk_nope], kv[..., cfg.qk_nope:]
    inv_freq, factor = rope_parameters(cfg)
    q_rope = rope(q_rope, positions, inv_freq, factor, cfg.rope_interleave)
    k_rope = rope(k_rope, positions, inv_freq, factor, cfg.rope_interleave)
    scores = (np.einsum("thd,shd->hts", q_nope, k_nope) +
              np.einsum("thd,sd->hts", q_rope, k_rope[:, 0])) * mla_softmax_scale(cfg)
    out = np.einsum("hts,shd->thd", _softmax_causal(scores), v).reshape(T, H * cfg.v_head_dim)
    return _linear(t, out, a + "o_proj")


def mlp(t, prefix, h):
    """SwiGLU: down(silu(gate(h)) * up(h)); h (T, hidden) -> (T, hidden)."""
    gate = _linear(t, h, prefix + "gate_proj")
    up = _linear(t, h, prefix + "up_proj")
    return _linear(t, gate / (1.0 + np.exp(-gate)) * up, prefix + "down_proj")


def _top_k(scores, k):
    """scores (T, n) -> indices (T, k) of the k largest per row (ties: lower index first)."""
    return np.argsort(-scores, axis=-1, kind="stable")[:, :k]


def route_softmax(cfg, logits):
    """Qwen3MoeSparseMoeBlock: softmax over experts, top-k, renormalised when norm_topk_prob.
    logits (T, E) -> (indices (T, k), weights (T, k))."""
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    idx = _top_k(probs, cfg.top_k)
    w = np.take_along_axis(probs, idx, axis=-1)
    if cfg.norm_topk:
        w = w / w.sum(axis=-1, keepdims=True)
    return idx, w


def route_noaux_tc(cfg, logits, bias):
    """DeepseekV3TopkRouter: sigmoid scores; choice = scores + e_score_correction_bias; a group's
    score is the sum of its two best choices; the topk_group best groups stay eligible and every
    other expert's choice is masked to 0.0 (not -inf, exactly as HF's masked_fill); top-k on the
    masked choices; weights are the unbiased scores of those experts, divided by (sum + 1e-20)
    when norm_topk_prob, times routed_scaling_factor. logits (T, E), bias (E,) -> (idx, w)."""
    T, E = logits.shape
    scores = 1.0 / (1.0 + np.exp(-logits))
    choice = scores + bias[None, :]
    grouped = choice.reshape(T, cfg.n_group, E // cfg.n_group)
    group_scores = np.sort(grouped, axis=-1)[..., -2:].sum(axis=-1)  # (T, n_group)
    keep = np.zeros((T, cfg.n_group), dtype=bool)
    np.put_along_axis(keep, _top_k(group_scores, cfg.topk_group), True, axis=-1)
    masked = np.where(np.repeat(keep, E // cfg.n_group, axis=-1), choice, 0.0)
    idx = _top_k(masked, cfg.top_k)
    w = np.take_along_axis(scores, idx, axis=-1)
    if cfg.norm_topk:
        w = w / (w.sum(axis=-1, keepdims=True) + 1e-20)
    return idx, w * cfg.routed_scale


def moe(cfg, t, p, h):
    """Sparse MoE block of layer prefix p: h (T, hidden) -> (T, hidden)."""
    m = p + "mlp."
    logits = h @ t[m + "gate.weight"].T  # (T, E), the router in float
    if cfg.model_type == "qwen3_moe":
        idx, w = route_softmax(cfg, logits)
    else:
        idx, w = route_noaux_tc(cfg, logits, t[m + "gate.e_score_correction_bias"])
    out = np.zeros_like(h)
    for e in np.unique(idx):  # each selected expert on the tokens that chose it
        rows, slots = np.nonzero(idx == e)
        out[rows] += mlp(t, m + "experts.%d." % e, h[rows]) * w[rows, slots][:, None]
    if cfg.model_type == "deepseek_v3" and cfg.n_shared:
        out += mlp(t, m + "shared_experts.", h)
    return out


def decoder_layer(cfg, t, i, x, positions):
    """Decoder layer i (an MTP layer's: i = num_hidden_layers + k) on the residual stream x."""
    p = "model.layers.%d." % i
    attend = mla_attention if cfg.is_mla else attention
    h = rms_norm(x, t[p + "input_layernorm.weight"], cfg.eps)
    x = x + attend(cfg, t, p, h, positions)
    h = rms_norm(x, t[p + "post_attention_layernorm.weight"], cfg.eps)
    return x + (moe(cfg, t, p, h) if cfg.is_moe_layer(i) else mlp(t, p + "mlp.", h))


def check_tokens(cfg, tokens):
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.size == 0 or tokens.min() < 0 or tokens.max() >= cfg.vocab:
        raise RefError("token ids must be non-empty and within the vocab")
    return tokens


def final_hidden(cfg, t, tokens):
    """tokens (T,) of one sequence from position 0 -> (T, hidden) after the final norm."""
    x = t["model.embed_tokens.weight"][tokens]  # (T, hidden)
    positions = np.arange(tokens.size)
    for i in range(cfg.num_layers):
        x = decoder_layer(cfg, t, i, x, positions)
    return rms_norm(x, t["model.norm.weight"], cfg.eps)


def select(positions_out, n):
    sel = np.asarray(positions_out, dtype=np.int64)
    if sel.size and (sel.min() < 0 or sel.max() >= n):
        raise RefError("requested position outside the sequence")
    return sel


def forward(cfg, t, tokens, positions_out):
    """tokens (T,) ids of one sequence from position 0 -> (len(positions_out), vocab) logits.
    Layers num_hidden_layers.. (deepseek_v3's multi-token-prediction layers) are not run, as in
    HF's forward (mtp_forward runs them)."""
    tokens = check_tokens(cfg, tokens)
    h = final_hidden(cfg, t, tokens)[select(positions_out, tokens.size)]
    head = t["model.embed_tokens.weight"] if cfg.tie else t.get("lm_head.weight")
    if head is None:
        raise RefError("lm_head.weight missing and tie_word_embeddings is false")
    return h @ head.T


def mtp_forward(cfg, t, tokens, positions_out, k=0):
    """deepseek_v3's MTP layer k over one sequence (T tokens) -> (len(positions_out), vocab).
    Position p (0 <= p < T-1) reads h_p, the target's hidden state after its final norm, and
    token_{p+1}; the row is the MTP layer's logits of token_{p+2}:
        x_p = eh_proj([enorm(embed(token_{p+1})); hnorm(h_p)])   (the MTP layer's embed_tokens)
        x = decoder layer num_hidden_layers + k on x (its own attention over positions 0..p)
        logits = shared_head.norm(x) @ shared_head.head^T"""
    tokens = check_tokens(cfg, tokens)
    if tokens.size < 2:
        raise RefError("the MTP layer needs at least two tokens")
    i = cfg.num_layers + k
    p = "model.layers.%d." % i
    if p + "eh_proj.weight" not in t:
        raise RefError("the checkpoint has no MTP layer %d" % k)
    h = final_hidden(cfg, t, tokens)[:-1]
    e = t[p + "embed_tokens.weight"][tokens[1:]]
    cat = np.concatenate([rms_norm(e, t[p + "enorm.weight"], cfg.eps),
                          rms_norm(h, t[p + "hnorm.weight"], cfg.eps)], axis=1)
    x = decoder_layer(cfg, t, i, cat @ t[p + "eh_proj.weight"].T, np.arange(tokens.size - 1))
    x = rms_norm(x[select(positions_out, tokens.size - 1)], t[p + "shared_head.norm.weight"],
                 cfg.eps)
    return x @ t[p + "shared_head.head.weight"].T


# ---------------------------------------------------------------------------------------------
# I/O

def write_logits(path, rows, vocab):
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<QQ", vocab, len(rows)))
        for r in rows:
            f.write(np.ascontiguousarray(r, dtype="<f8").tobytes())


def read_logits(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != MAGIC:
        raise RefError("%s: bad magic" % path)
    vocab, n = struct.unpack("<QQ", data[8:24])
    return np.frombuffer(data[24:], dtype="<f8").reshape(n, vocab)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        cfg, tensors = load_model(args.model)
        with open(args.requests) as f:
            requests = json.load(f)["requests"]
        rows = []
        for req in requests:
            tokens = list(req["tokens"])
            for _ in range(int(req.get("greedy", 0))):
                last = forward(cfg, tensors, tokens, [len(tokens) - 1])[0]
                tokens.append(int(np.argmax(last)))
            run = mtp_forward if req.get("mtp", False) else forward
            rows.extend(run(cfg, tensors, tokens, req["positions"]))
        write_logits(args.out, rows, cfg.vocab)
    except (RefError, OSError, KeyError, ValueError) as e:
        print("ref_model.py: error: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
