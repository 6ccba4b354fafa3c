#!/usr/bin/python3
"""Self-test of ref_model.py's qwen3_moe and deepseek_v3 paths, by means of its own.

Random weights are written with ref_model_selftest's safetensors writer and checked against a
second, deliberately naive formulation: token-by-token decode where MLA uses the weight-absorbed
form over an explicit latent cache (q_nope through W_UK, scores over the cached normalised latent
and rope key, output through W_UV) while ref_model.py expands per-head K and V as HF does; MoE as
a loop over every expert with an explicit 0/1 mask; routing by brute-force enumeration of expert
and group subsets; RoPE rotating explicit pairs per dimension; yarn's inv_freq transcribed per
dimension from its formulas. Plus properties: the dense/sparse layer pattern, causality, MTP
tensors ignored, a BF16 checkpoint with an F32 router bias, and refusals.

Run: /usr/bin/python3 tests/reference/ref_model_moe_selftest.py
"""

import itertools
import math
import os
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ref_model  # noqa: E402
from ref_model_selftest import encode, rel_err, write_model  # noqa: E402

# ---------------------------------------------------------------------------------------------
# configs and weights

YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32,
        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8}


def make_qwen3_moe_config(norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=None):
    return {"model_type": "qwen3_moe", "hidden_size": 16, "intermediate_size": 24,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "vocab_size": 37, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "tie_word_embeddings": False, "num_experts": 6, "num_experts_per_tok": 2,
            "moe_intermediate_size": 10, "norm_topk_prob": norm_topk_prob,
            "decoder_sparse_step": decoder_sparse_step, "mlp_only_layers": mlp_only_layers or []}


def make_deepseek_config(q_lora_rank=12, rope_interleave=True, yarn=True, norm_topk_prob=True,
                         n_shared_experts=1):
    # rms_norm_eps 1e-5 differs from the 1e-6 of q_a_layernorm / kv_a_layernorm, so mixing the
    # two up shows. num_key_value_heads is not read by MLA (here not even a divisor of the heads).
    cfg = {"model_type": "deepseek_v3", "hidden_size": 16, "intermediate_size": 24,
           "num_hidden_layers": 3, "num_attention_heads": 3, "num_key_value_heads": 2,
           "vocab_size": 37, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "max_position_embeddings": 64, "tie_word_embeddings": False,
           "q_lora_rank": q_lora_rank, "kv_lora_rank": 10, "qk_nope_head_dim": 6,
           "qk_rope_head_dim": 8, "v_head_dim": 5, "rope_interleave": rope_interleave,
           "n_routed_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 7,
           "n_group": 4, "topk_group": 2, "n_shared_experts": n_shared_experts,
           "routed_scaling_factor": 2.5, "norm_topk_prob": norm_topk_prob,
           "first_k_dense_replace": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
           "num_nextn_predict_layers": 1, "rope_scaling": dict(YARN) if yarn else None}
    return cfg


def expected_moe_layers(cfg):
    """Which layers are sparse, written out from the HF decoder-layer constructors."""
    out = []
    for i in range(cfg["num_hidden_layers"]):
        if cfg["model_type"] == "qwen3_moe":
            out.append(i not in cfg["mlp_only_layers"] and
                       (i + 1) % cfg["decoder_sparse_step"] == 0)
        else:
            out.append(i >= cfg["first_k_dense_replace"])
    return out


def make_weights(cfg, seed, mtp=False):
    """Only the tensors each layer's kind reads: a wrong dense/sparse rule fails on a missing
    tensor. mtp: also model.layers.{num_hidden_layers}.* (an MTP layer the forward must skip)."""
    rng = np.random.default_rng(seed)
    hid, inter, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]

    def r(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def swiglu(t, p, width):
        t[p + "gate_proj.weight"] = r(width, hid)
        t[p + "up_proj.weight"] = r(width, hid)
        t[p + "down_proj.weight"] = r(hid, width)

    t = {"model.embed_tokens.weight": r(V, hid, scale=1.0),
         "model.norm.weight": 1 + r(hid, scale=0.1), "lm_head.weight": r(V, hid)}
    sparse = expected_moe_layers(cfg)
    E = cfg.get("num_experts") or cfg.get("n_routed_experts")

    def layer(p, is_sparse):
        t[p + "input_layernorm.weight"] = 1 + r(hid, scale=0.1)
        t[p + "post_attention_layernorm.weight"] = 1 + r(hid, scale=0.1)
        a = p + "self_attn."
        if cfg["model_type"] == "qwen3_moe":
            H, KV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
            t[a + "q_proj.weight"] = r(H * D, hid)
            t[a + "k_proj.weight"] = r(KV * D, hid)
            t[a + "v_proj.weight"] = r(KV * D, hid)
            t[a + "o_proj.weight"] = r(hid, H * D)
            t[a + "q_norm.weight"] = 1 + r(D, scale=0.1)
            t[a + "k_norm.weight"] = 1 + r(D, scale=0.1)
        else:
            H, R = cfg["num_attention_heads"], cfg["kv_lora_rank"]
            qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
            if cfg["q_lora_rank"]:
                t[a + "q_a_proj.weight"] = r(cfg["q_lora_rank"], hid)
                t[a + "q_a_layernorm.weight"] = 1 + r(cfg["q_lora_rank"], scale=0.1)
                t[a + "q_b_proj.weight"] = r(H * qk, cfg["q_lora_rank"])
            else:
                t[a + "q_proj.weight"] = r(H * qk, hid)
            t[a + "kv_a_proj_with_mqa.weight"] = r(R + cfg["qk_rope_head_dim"], hid)
            t[a + "kv_a_layernorm.weight"] = 1 + r(R, scale=0.1)
            t[a + "kv_b_proj.weight"] = r(H * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), R)
            t[a + "o_proj.weight"] = r(hid, H * cfg["v_head_dim"])
        if not is_sparse:
            swiglu(t, p + "mlp.", inter)
            return
        t[p + "mlp.gate.weight"] = r(E, hid, scale=1.0)
        for e in range(E):
            swiglu(t, p + "mlp.experts.%d." % e, cfg["moe_intermediate_size"])
        if cfg["model_type"] == "deepseek_v3":
            t[p + "mlp.gate.e_score_correction_bias"] = r(E, scale=0.2)
            if cfg["n_shared_experts"]:
                swiglu(t, p + "mlp.shared_experts.",
                       cfg["n_shared_experts"] * cfg["moe_intermediate_size"])

    for i in range(cfg["num_hidden_layers"]):
        layer("model.layers.%d." % i, sparse[i])
    if mtp == "full":  # a whole MTP layer (sparse: past first_k_dense_replace), its own head
        p = "model.layers.%d." % cfg["num_hidden_layers"]
        layer(p, True)
        t[p + "embed_tokens.weight"] = r(V, hid, scale=1.0)
        for name in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
            t[p + name] = 1 + r(hid, scale=0.1)
        t[p + "eh_proj.weight"] = r(hid, 2 * hid)
        t[p + "shared_head.head.weight"] = r(V, hid)
        return t
    if mtp:
        p = "model.layers.%d." % cfg["num_hidden_layers"]
        for name in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
            t[p + name] = r(hid)
        t[p + "eh_proj.weight"] = r(hid, 2 * hid)
        t[p + "input_layernorm.weight"] = r(hid)
        t[p + "self_attn.kv_a_proj_with_mqa.weight"] = r(3, 5)  # nonsense shapes: never read
    return t


# ---------------------------------------------------------------------------------------------
# naive second formulation


def naive_inv_freq(d, theta, yarn, max_pos):
    """Per-dimension transcription of the default and yarn frequencies -> (list, attn factor)."""
    base = [theta ** (-2.0 * i / d) for i in range(d // 2)]
    if not yarn:
        return base, 1.0
    orig = yarn.get("original_max_position_embeddings") or max_pos
    factor = yarn["factor"] if yarn.get("factor") is not None else max_pos / orig

    def mscale(m):
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    att = yarn.get("attention_factor")
    if att is None:
        if yarn.get("mscale") and yarn.get("mscale_all_dim"):
            att = mscale(yarn["mscale"]) / mscale(yarn["mscale_all_dim"])
        else:
            att = mscale(1.0)
    # the dim index whose wavelength 2*pi/theta^(-2i/d) completes `n` rotations in orig tokens
    lo = d * math.log(orig / (2 * math.pi * (yarn.get("beta_fast") or 32))) / (2 * math.log(theta))
    hi = d * math.log(orig / (2 * math.pi * (yarn.get("beta_slow") or 1))) / (2 * math.log(theta))
    if yarn.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    if hi == lo:
        hi += 0.001
    out = []
    for i, f in enumerate(base):
        ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)  # 0: keep f; 1: f / factor
        out.append((1 - ramp) * f + ramp * f / factor)
    return out, att


def rotate_pairs(x, pos, inv_freq, att, interleave):
    """Rotates pair (2i, 2i+1) (interleave) or (i, i + d/2) by pos * inv_freq[i], scaled by att."""
    out, half = np.empty_like(x), x.size // 2
    for i in range(half):
        a, b = (2 * i, 2 * i + 1) if interleave else (i, i + half)
        c, s = math.cos(pos * inv_freq[i]), math.sin(pos * inv_freq[i])
        out[a] = (x[a] * c - x[b] * s) * att
        out[b] = (x[b] * c + x[a] * s) * att
    return out


def best_subset(values, k, allowed):
    """The k-subset of `allowed` indices with the largest sum of values (brute force)."""
    return max(itertools.combinations(allowed, k), key=lambda c: sum(values[j] for j in c))


def naive_route(cfg, logits, bias):
    """-> {expert: weight} for one token, by enumerating subsets."""
    E, k = logits.size, cfg.get("num_experts_per_tok")
    if cfg["model_type"] == "qwen3_moe":
        p = [math.exp(v - logits.max()) for v in logits]
        p = [v / sum(p) for v in p]
        chosen = best_subset(p, k, range(E))
        total = sum(p[e] for e in chosen) if cfg["norm_topk_prob"] else 1.0
        return {e: p[e] / total for e in chosen}
    s = [1 / (1 + math.exp(-v)) for v in logits]
    choice = [s[e] + bias[e] for e in range(E)]
    G = cfg["n_group"]
    per = E // G
    gscore = [sum(sorted(choice[g * per:(g + 1) * per])[-2:]) for g in range(G)]
    groups = best_subset(gscore, cfg["topk_group"], range(G))
    masked = [choice[e] if e // per in groups else 0.0 for e in range(E)]
    chosen = best_subset(masked, k, range(E))
    total = sum(s[e] for e in chosen) + 1e-20 if cfg["norm_topk_prob"] else 1.0
    return {e: s[e] / total * cfg["routed_scaling_factor"] for e in chosen}


class Naive:
    """One token at a time, explicit caches, loops over heads and experts."""

    def __init__(self, cfg, t):
        self.cfg, self.t = cfg, {k: v.astype(np.float64) for k, v in t.items()}
        mla = cfg["model_type"] == "deepseek_v3"
        d = cfg["qk_rope_head_dim"] if mla else cfg["head_dim"]
        self.inv_freq, self.att = naive_inv_freq(d, cfg["rope_theta"], cfg.get("rope_scaling"),
                                                 cfg.get("max_position_embeddings", 64))
        self.cache = [[] for _ in range(cfg["num_hidden_layers"] + 1)]  # + the MTP layer

    def norm(self, x, name, eps=None):
        eps = self.cfg["rms_norm_eps"] if eps is None else eps
        return x * (1.0 / math.sqrt(float(np.dot(x, x)) / x.size + eps)) * self.t[name]

    def lin(self, name, x):
        return self.t[name + ".weight"] @ x

    def swiglu(self, p, x):
        g, u = self.lin(p + "gate_proj", x), self.lin(p + "up_proj", x)
        return self.lin(p + "down_proj", g / (1 + np.exp(-g)) * u)

    def gqa(self, li, p, h, pos):
        c = self.cfg
        H, KV, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        q = self.lin(p + "q_proj", h).reshape(H, D)
        k = self.lin(p + "k_proj", h).reshape(KV, D)
        v = self.lin(p + "v_proj", h).reshape(KV, D)
        q = [rotate_pairs(self.norm(q[j], p + "q_norm.weight"), pos, self.inv_freq, self.att,
                          False) for j in range(H)]
        k = [rotate_pairs(self.norm(k[j], p + "k_norm.weight"), pos, self.inv_freq, self.att,
                          False) for j in range(KV)]
        self.cache[li].append((k, v))
        out = []
        for j in range(H):
            kv = j // (H // KV)
            s = np.array([np.dot(q[j], kk[kv]) / math.sqrt(D) for kk, _ in self.cache[li]])
            w = np.exp(s - s.max())
            out.append(sum(wi * vv[kv] for wi, (_, vv) in zip(w / w.sum(), self.cache[li])))
        return self.lin(p + "o_proj", np.concatenate(out))

    def mla(self, li, p, h, pos):
        """Weight-absorbed MLA over a latent cache of (normalised latent, rotated rope key)."""
        c = self.cfg
        H, R, N, RD, VD = (c["num_attention_heads"], c["kv_lora_rank"], c["qk_nope_head_dim"],
                           c["qk_rope_head_dim"], c["v_head_dim"])
        if c["q_lora_rank"]:
            q = self.lin(p + "q_b_proj", self.norm(self.lin(p + "q_a_proj", h),
                                                   p + "q_a_layernorm.weight", 1e-6))
        else:
            q = self.lin(p + "q_proj", h)
        q = q.reshape(H, N + RD)
        ckv = self.lin(p + "kv_a_proj_with_mqa", h)
        latent = self.norm(ckv[:R], p + "kv_a_layernorm.weight", 1e-6)
        k_rope = rotate_pairs(ckv[R:], pos, self.inv_freq, self.att, c["rope_interleave"])
        self.cache[li].append((latent, k_rope))
        w_kvb = self.t[p + "kv_b_proj.weight"].reshape(H, N + VD, R)
        scale = (N + RD) ** -0.5
        y = c.get("rope_scaling")
        if y and y.get("mscale_all_dim") and y["factor"] > 1:
            scale *= (0.1 * y["mscale_all_dim"] * math.log(y["factor"]) + 1.0) ** 2
        out = []
        for j in range(H):
            w_uk, w_uv = w_kvb[j, :N], w_kvb[j, N:]                # (N, R), (VD, R)
            q_latent = w_uk.T @ q[j, :N]                           # (R,)
            q_rope = rotate_pairs(q[j, N:], pos, self.inv_freq, self.att, c["rope_interleave"])
            s = np.array([(np.dot(q_latent, lat) + np.dot(q_rope, kr)) * scale
                          for lat, kr in self.cache[li]])
            w = np.exp(s - s.max())
            w /= w.sum()
            out.append(w_uv @ sum(wi * lat for wi, (lat, _) in zip(w, self.cache[li])))
        return self.lin(p + "o_proj", np.concatenate(out))

    def moe(self, p, h):
        c = self.cfg
        E = c.get("num_experts") or c.get("n_routed_experts")
        bias = self.t.get(p + "gate.e_score_correction_bias")
        weights = naive_route(c, self.t[p + "gate.weight"] @ h, bias)
        out = np.zeros_like(h)
        for e in range(E):  # every expert, masked
            mask = 1.0 if e in weights else 0.0
            out += mask * weights.get(e, 0.0) * self.swiglu(p + "experts.%d." % e, h)
        if c["model_type"] == "deepseek_v3" and c["n_shared_experts"]:
            out += self.swiglu(p + "shared_experts.", h)
        return out

    def layer(self, li, x, pos, is_sparse):
        p = "model.layers.%d." % li
        h = self.norm(x, p + "input_layernorm.weight")
        attend = self.mla if self.cfg["model_type"] == "deepseek_v3" else self.gqa
        x = x + attend(li, p + "self_attn.", h, pos)
        h = self.norm(x, p + "post_attention_layernorm.weight")
        return x + (self.moe(p + "mlp.", h) if is_sparse else self.swiglu(p + "mlp.", h))

    def hidden(self, tok, pos):
        """The final-norm hidden state at pos."""
        x = self.t["model.embed_tokens.weight"][tok].copy()
        sparse = expected_moe_layers(self.cfg)
        for li in range(self.cfg["num_hidden_layers"]):
            x = self.layer(li, x, pos, sparse[li])
        return self.norm(x, "model.norm.weight")

    def step(self, tok, pos):
        return self.t["lm_head.weight"] @ self.hidden(tok, pos)

    def mtp_step(self, h, next_tok, pos):
        """The MTP layer at pos: h_pos and token pos+1 -> logits of token pos+2."""
        li = self.cfg["num_hidden_layers"]
        p = "model.layers.%d." % li
        e = self.t[p + "embed_tokens.weight"][next_tok]
        x = self.t[p + "eh_proj.weight"] @ np.concatenate(
            [self.norm(e, p + "enorm.weight"), self.norm(h, p + "hnorm.weight")])
        x = self.layer(li, x, pos, True)
        return self.t[p + "shared_head.head.weight"] @ self.norm(x, p + "shared_head.norm.weight")


def naive_logits(cfg, t, tokens):
    n = Naive(cfg, t)
    return np.array([n.step(tok, pos) for pos, tok in enumerate(tokens)])


def naive_mtp_logits(cfg, t, tokens):
    n = Naive(cfg, t)
    hs = [n.hidden(tok, pos) for pos, tok in enumerate(tokens)]
    return np.array([n.mtp_step(hs[pos], tokens[pos + 1], pos) for pos in range(len(tokens) - 1)])


# ---------------------------------------------------------------------------------------------
# tests

TOKENS = [3, 17, 0, 36, 5, 5, 22, 9, 30, 1, 14]


class MoeMlaTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def model(self, name, cfg, tensors, dtype="F32", overrides=None):
        d = os.path.join(self.tmp.name, name)
        write_model(d, cfg, tensors, dtype, overrides=overrides)
        return ref_model.load_model(d)

    def run_ref(self, cfg, t, tokens):
        return ref_model.forward(cfg, t, tokens, list(range(len(tokens))))

    def check_against_naive(self, name, cfg_json, seed):
        tensors = make_weights(cfg_json, seed)
        cfg, t = self.model(name, cfg_json, tensors)
        self.assertEqual([cfg.is_moe_layer(i) for i in range(cfg.num_layers)],
                         expected_moe_layers(cfg_json))
        got = self.run_ref(cfg, t, TOKENS)
        want = naive_logits(cfg_json, tensors, TOKENS)
        self.assertLess(rel_err(got, want), 1e-10)
        self.assertGreater(np.ptp(got[-1]), 0.5)  # far from uniform
        return got

    def test_qwen3_moe_matches_naive(self):
        cases = [{}, {"norm_topk_prob": False},
                 {"decoder_sparse_step": 2, "mlp_only_layers": [2]},  # sparse: layer 1 only
                 {"mlp_only_layers": [0]}]
        for i, kw in enumerate(cases):
            with self.subTest(**kw):
                cfg = make_qwen3_moe_config(**kw)
                self.check_against_naive("q%d" % i, cfg, seed=10 + i)

    def test_deepseek_v3_matches_naive(self):
        cases = [{}, {"q_lora_rank": None}, {"rope_interleave": False},
                 {"q_lora_rank": None, "rope_interleave": False, "yarn": False},
                 {"yarn": False}, {"norm_topk_prob": False, "n_shared_experts": 0}]
        for i, kw in enumerate(cases):
            with self.subTest(**kw):
                self.check_against_naive("d%d" % i, make_deepseek_config(**kw), seed=20 + i)

    def test_deepseek_yarn_variants_match_naive(self):
        variants = [{"truncate": False}, {"attention_factor": 0.9}, {"mscale_all_dim": 0},
                    {"mscale": 0}, {"factor": None}]  # factor None: max_pos / original
        for i, change in enumerate(variants):
            with self.subTest(**change):
                cfg = make_deepseek_config()
                cfg["rope_scaling"].update(change)
                if change.get("factor", 1) is None:
                    del cfg["rope_scaling"]["mscale_all_dim"]  # HF's scaling needs a factor
                self.check_against_naive("y%d" % i, cfg, seed=30 + i)

    def test_variants_change_logits(self):
        # Each switch must matter, or the comparisons above would not test it.
        base_cfg = make_deepseek_config()
        tensors = make_weights(base_cfg, 40)
        cfg, t = self.model("base", base_cfg, tensors)
        base = self.run_ref(cfg, t, TOKENS)
        for change in ({"rope_interleave": False}, {"rope_scaling": None},
                       {"routed_scaling_factor": 1.0}, {"norm_topk_prob": False}):
            other = dict(base_cfg, **change)
            cfg, t = self.model("v", other, tensors)
            self.assertGreater(rel_err(self.run_ref(cfg, t, TOKENS), base), 1e-3, change)

    def test_causal(self):
        for cfg_json in (make_deepseek_config(), make_qwen3_moe_config()):
            cfg, t = self.model(cfg_json["model_type"], cfg_json, make_weights(cfg_json, 1))
            a = self.run_ref(cfg, t, [1, 2, 3, 4, 5, 6])
            b = self.run_ref(cfg, t, [1, 2, 3, 30, 31, 32])
            # equal up to summation order (the experts' row sets differ between a and b)
            np.testing.assert_allclose(a[:3], b[:3], rtol=1e-13, atol=1e-13)
            self.assertGreater(np.max(np.abs(a[3:] - b[3:])), 1e-3)
            np.testing.assert_allclose(a[:3], self.run_ref(cfg, t, [1, 2, 3]), rtol=1e-13,
                                       atol=1e-13)

    def test_mtp_layer_is_ignored(self):
        cfg_json = make_deepseek_config()
        with_mtp = make_weights(cfg_json, 2, mtp=True)
        without = {k: v for k, v in with_mtp.items() if not k.startswith("model.layers.3.")}
        self.assertLess(len(without), len(with_mtp))
        cfg, t1 = self.model("mtp", cfg_json, with_mtp)
        _, t2 = self.model("nomtp", cfg_json, without)
        np.testing.assert_array_equal(self.run_ref(cfg, t1, TOKENS), self.run_ref(cfg, t2, TOKENS))

    def test_mtp_layer_matches_naive(self):
        cfg_json = make_deepseek_config()
        tensors = make_weights(cfg_json, 5, mtp="full")
        cfg, t = self.model("mtp_full", cfg_json, tensors)
        got = ref_model.mtp_forward(cfg, t, TOKENS, list(range(len(TOKENS) - 1)))
        want = naive_mtp_logits(cfg_json, tensors, TOKENS)
        self.assertLess(rel_err(got, want), 1e-10)
        self.assertGreater(np.ptp(got[-1]), 0.5)
        # The order of the concatenation matters: swapped, the rows differ.
        p = "model.layers.%d." % cfg_json["num_hidden_layers"]
        swapped = dict(tensors)
        hid = cfg_json["hidden_size"]
        swapped[p + "eh_proj.weight"] = np.concatenate(
            [tensors[p + "eh_proj.weight"][:, hid:], tensors[p + "eh_proj.weight"][:, :hid]], 1)
        self.assertGreater(rel_err(naive_mtp_logits(cfg_json, swapped, TOKENS), want), 1e-3)
        with self.assertRaises(ref_model.RefError):  # no MTP layer in the checkpoint
            _, bare = self.model("mtp_none", cfg_json, make_weights(cfg_json, 5))
            ref_model.mtp_forward(cfg, bare, TOKENS, [0])

    def test_bf16_checkpoint_with_f32_router_bias(self):
        cfg_json = make_deepseek_config()
        tensors = make_weights(cfg_json, 3)
        biases = {n: "F32" for n in tensors if n.endswith("e_score_correction_bias")}
        self.assertEqual(len(biases), 2)
        cfg, t = self.model("bf16", cfg_json, tensors, dtype="BF16", overrides=biases)
        rounded = {}
        for name, arr in tensors.items():
            if name in biases:
                want = arr.astype(np.float64)
            else:
                bits = np.frombuffer(encode(arr, "BF16"), "<u2").astype(np.uint32) << 16
                want = bits.view(np.float32).reshape(arr.shape).astype(np.float64)
            np.testing.assert_array_equal(t[name], want, err_msg=name)
            rounded[name] = want
        self.assertFalse(np.array_equal(t["model.layers.1.mlp.gate.weight"],
                                        tensors["model.layers.1.mlp.gate.weight"]))
        self.assertLess(rel_err(self.run_ref(cfg, t, TOKENS),
                                naive_logits(cfg_json, rounded, TOKENS)), 1e-10)

    def test_refusals(self):
        for change in ({"scoring_func": "softmax"}, {"topk_method": "greedy"},
                       {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
                       {"n_group": 3}):
            with self.subTest(**{k: str(v) for k, v in change.items()}):
                with self.assertRaises(ref_model.RefError):
                    ref_model.Config(dict(make_deepseek_config(), **change))


class RoutingTest(unittest.TestCase):
    def test_noaux_tc_matches_brute_force(self):
        rng = np.random.default_rng(7)
        for norm, groups, topk_group, k in ((True, 4, 2, 4), (False, 8, 3, 3), (True, 1, 1, 5)):
            cfg_json = dict(make_deepseek_config(), n_routed_experts=16, n_group=groups,
                            topk_group=topk_group, num_experts_per_tok=k, norm_topk_prob=norm)
            cfg = ref_model.Config(cfg_json)
            logits = rng.standard_normal((300, 16)) * 2
            bias = rng.standard_normal(16) * 0.6  # large enough that 0.0 masks sometimes win
            idx, w = ref_model.route_noaux_tc(cfg, logits, bias)
            for row in range(logits.shape[0]):
                want = naive_route(cfg_json, logits[row], bias)
                self.assertEqual(sorted(idx[row]), sorted(want))
                got = dict(zip(idx[row], w[row]))
                for e, weight in want.items():
                    self.assertAlmostEqual(got[e], weight, delta=1e-14)

    def test_noaux_tc_masks_with_zero(self):
        # Two groups of two; group 0 wins (0.3 - 0.2 > -0.1 - 0.05). Its second expert's choice
        # is -0.2, below the 0.0 that HF's masked_fill gives group 1's experts, so top-3 takes
        # expert 0 and both masked experts 2, 3 (with -inf masking it would take 0, 1 and one
        # of 2, 3).
        cfg = ref_model.Config(dict(make_deepseek_config(), n_routed_experts=4, n_group=2,
                                    topk_group=1, num_experts_per_tok=3, norm_topk_prob=False))
        logits = np.zeros((1, 4))  # scores 0.5
        bias = np.array([-0.2, -0.7, -0.6, -0.55])
        idx, w = ref_model.route_noaux_tc(cfg, logits, bias)
        self.assertEqual(sorted(idx[0]), [0, 2, 3])
        np.testing.assert_allclose(w[0], [0.5 * 2.5] * 3, rtol=1e-15)

    def test_softmax_route_matches_brute_force(self):
        rng = np.random.default_rng(8)
        for norm in (True, False):
            cfg_json = make_qwen3_moe_config(norm_topk_prob=norm)
            cfg = ref_model.Config(cfg_json)
            logits = rng.standard_normal((100, 6))
            idx, w = ref_model.route_softmax(cfg, logits)
            for row in range(100):
                want = naive_route(cfg_json, logits[row], None)
                got = dict(zip(idx[row], w[row]))
                self.assertEqual(sorted(got), sorted(want))
                for e, weight in want.items():
                    self.assertAlmostEqual(got[e], weight, delta=1e-14)
            if norm:
                np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-14)


class YarnTest(unittest.TestCase):
    def config(self, **yarn):
        cfg = make_deepseek_config()
        cfg["qk_rope_head_dim"] = 64
        cfg["max_position_embeddings"] = 163840
        cfg["rope_scaling"] = dict({"type": "yarn", "factor": 40.0, "beta_fast": 32,
                                    "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
                                    "original_max_position_embeddings": 4096}, **yarn)
        return cfg

    def test_inv_freq_matches_transcription(self):
        for yarn in ({}, {"truncate": False}, {"attention_factor": 1.3}, {"mscale": 0.707},
                     {"mscale_all_dim": None}, {"beta_fast": 16, "beta_slow": 2},
                     {"factor": None}, {"original_max_position_embeddings": None}):
            with self.subTest(**{k: str(v) for k, v in yarn.items()}):
                cfg_json = self.config(**yarn)
                got, att = ref_model.rope_parameters(ref_model.Config(cfg_json))
                want, want_att = naive_inv_freq(64, 10000.0, cfg_json["rope_scaling"], 163840)
                np.testing.assert_allclose(got, want, rtol=1e-14, atol=0)
                self.assertAlmostEqual(att, want_att, delta=1e-15)

    def test_deepseek_v3_numbers(self):
        # DeepSeek-V3's rope_scaling. Correction dims: 64 ln(4096 / (2 pi 32)) / (2 ln 1e4) =
        # 10.47 -> floor 10, and 64 ln(4096 / (2 pi)) / (2 ln 1e4) = 22.51 -> ceil 23: dims 0..10
        # keep theta^(-2i/64), dims 23..31 are divided by the factor 40.
        cfg = ref_model.Config(self.config())
        inv, att = ref_model.rope_parameters(cfg)
        base = 10000.0 ** (-np.arange(32) / 32.0)
        np.testing.assert_allclose(inv[:11], base[:11], rtol=1e-15)
        np.testing.assert_allclose(inv[23:], base[23:] / 40.0, rtol=1e-15)
        self.assertTrue(np.all(inv[11:23] < base[11:23]) and np.all(inv[11:23] > base[11:23] / 40))
        self.assertEqual(att, 1.0)  # mscale == mscale_all_dim
        m = 0.1 * math.log(40.0) + 1.0
        cfg.qk_head_dim = 192
        self.assertAlmostEqual(ref_model.mla_softmax_scale(cfg), m * m / math.sqrt(192),
                               delta=1e-15)
        cfg.yarn = None
        self.assertAlmostEqual(ref_model.mla_softmax_scale(cfg), 1 / math.sqrt(192), delta=1e-15)


if __name__ == "__main__":
    unittest.main()
