#!/usr/bin/python3
"""Self-test of ref_model.py: random weights written with our own safetensors writer, checked
against a second, deliberately naive formulation (token-by-token decode with an explicit KV
cache, per-head loops, per-dimension RoPE), plus properties (causality, GQA == duplicated MHA,
sharded == single file, BF16/F16 decoding, tied embeddings) and the CLI.

Run: /usr/bin/python3 tests/reference/ref_model_selftest.py
"""

import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ref_model  # noqa: E402

# ---------------------------------------------------------------------------------------------
# writer


def encode(arr, dtype):
    arr = np.asarray(arr, dtype=np.float32)
    if dtype == "F32":
        return arr.astype("<f4").tobytes()
    if dtype == "F16":
        return arr.astype("<f2").tobytes()
    if dtype == "BF16":  # round to nearest even
        bits = arr.view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.astype("<u2").tobytes()
    raise ValueError(dtype)


def write_safetensors(path, tensors, dtype, overrides=None):
    """overrides: {name: dtype} for tensors stored in another dtype (deepseek_v3's F32 router
    bias in a BF16 checkpoint)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        tensor_dtype = (overrides or {}).get(name, dtype)
        raw = encode(tensors[name], tensor_dtype)
        header[name] = {"dtype": tensor_dtype, "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    hjson = json.dumps(header).encode()
    hjson += b" " * (-len(hjson) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)) + hjson + b"".join(blobs))


def make_config(model_type, heads=4, kv_heads=2, head_dim=8, tie=False, attention_bias=None):
    cfg = {"model_type": model_type, "hidden_size": 16, "intermediate_size": 24,
           "num_hidden_layers": 2, "num_attention_heads": heads,
           "num_key_value_heads": kv_heads, "head_dim": head_dim, "vocab_size": 37,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": tie}
    if attention_bias is not None:
        cfg["attention_bias"] = attention_bias
    return cfg


def make_weights(cfg, seed):
    rng = np.random.default_rng(seed)
    hid, inter, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    bias = cfg["model_type"] == "qwen2" or cfg.get("attention_bias", False)
    o_bias = bias and cfg["model_type"] != "qwen2"

    def r(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    t = {"model.embed_tokens.weight": r(cfg["vocab_size"], hid, scale=1.0),
         "model.norm.weight": 1 + r(hid, scale=0.1)}
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = r(cfg["vocab_size"], hid)
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        t[p + "input_layernorm.weight"] = 1 + r(hid, scale=0.1)
        t[p + "post_attention_layernorm.weight"] = 1 + r(hid, scale=0.1)
        for name, rows in (("q", q), ("k", kv), ("v", kv)):
            t[p + "self_attn.%s_proj.weight" % name] = r(rows, hid)
            if bias:
                t[p + "self_attn.%s_proj.bias" % name] = r(rows)
        t[p + "self_attn.o_proj.weight"] = r(hid, q)
        if o_bias:
            t[p + "self_attn.o_proj.bias"] = r(hid)
        if cfg["model_type"] == "qwen3":
            t[p + "self_attn.q_norm.weight"] = 1 + r(d, scale=0.1)
            t[p + "self_attn.k_norm.weight"] = 1 + r(d, scale=0.1)
        t[p + "mlp.gate_proj.weight"] = r(inter, hid)
        t[p + "mlp.up_proj.weight"] = r(inter, hid)
        t[p + "mlp.down_proj.weight"] = r(hid, inter)
    return t


def write_model(dirname, cfg, tensors, dtype="F32", shards=1, overrides=None):
    os.makedirs(dirname, exist_ok=True)
    with open(os.path.join(dirname, "config.json"), "w") as f:
        json.dump(cfg, f)
    if shards == 1:
        write_safetensors(os.path.join(dirname, "model.safetensors"), tensors, dtype, overrides)
        return
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        fname = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        part = {n: tensors[n] for n in names[s::shards]}
        write_safetensors(os.path.join(dirname, fname), part, dtype, overrides)
        weight_map.update({n: fname for n in part})
    with open(os.path.join(dirname, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


# ---------------------------------------------------------------------------------------------
# naive second formulation: one token at a time, explicit KV cache, loops over heads and dims


def naive_logits(cfg, t, tokens):
    """Returns (len(tokens), vocab) logits computed token by token."""
    H, KV, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta, L = cfg["rms_norm_eps"], cfg["rope_theta"], cfg["num_hidden_layers"]
    t = {k: v.astype(np.float64) for k, v in t.items()}

    def norm(x, w):
        return x * (1.0 / math.sqrt(float(np.dot(x, x)) / x.size + eps)) * w

    def lin(name, x):
        y = t[name + ".weight"] @ x
        return y + t[name + ".bias"] if name + ".bias" in t else y

    def rot(x, pos):  # x (D,): dims i and i + D/2 rotate together by pos * theta^(-2i/D)
        out = np.empty_like(x)
        for i in range(D // 2):
            a = pos * theta ** (-2.0 * i / D)
            x0, x1 = x[i], x[i + D // 2]
            out[i] = x0 * math.cos(a) - x1 * math.sin(a)
            out[i + D // 2] = x1 * math.cos(a) + x0 * math.sin(a)
        return out

    cache = [([], []) for _ in range(L)]  # per layer: keys, values: lists of (KV, D)
    rows = []
    for pos, tok in enumerate(tokens):
        x = t["model.embed_tokens.weight"][tok].copy()
        for li in range(L):
            p = "model.layers.%d." % li
            h = norm(x, t[p + "input_layernorm.weight"])
            q = lin(p + "self_attn.q_proj", h).reshape(H, D)
            k = lin(p + "self_attn.k_proj", h).reshape(KV, D)
            v = lin(p + "self_attn.v_proj", h).reshape(KV, D)
            if cfg["model_type"] == "qwen3":
                q = np.stack([norm(q[j], t[p + "self_attn.q_norm.weight"]) for j in range(H)])
                k = np.stack([norm(k[j], t[p + "self_attn.k_norm.weight"]) for j in range(KV)])
            q = np.stack([rot(q[j], pos) for j in range(H)])
            k = np.stack([rot(k[j], pos) for j in range(KV)])
            cache[li][0].append(k)
            cache[li][1].append(v)
            out = np.zeros((H, D))
            for j in range(H):
                kvh = j // (H // KV)
                s = np.array([np.dot(q[j], kk[kvh]) / math.sqrt(D) for kk in cache[li][0]])
                w = np.exp(s - s.max())
                w /= w.sum()
                out[j] = sum(wi * vv[kvh] for wi, vv in zip(w, cache[li][1]))
            x = x + lin(p + "self_attn.o_proj", out.reshape(-1))
            h = norm(x, t[p + "post_attention_layernorm.weight"])
            g, u = lin(p + "mlp.gate_proj", h), lin(p + "mlp.up_proj", h)
            x = x + lin(p + "mlp.down_proj", g / (1 + np.exp(-g)) * u)
        head = t["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else t["lm_head.weight"]
        rows.append(head @ norm(x, t["model.norm.weight"]))
    return np.array(rows)


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


class RefModelTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def model(self, name, cfg, tensors, dtype="F32", shards=1):
        d = os.path.join(self.tmp.name, name)
        write_model(d, cfg, tensors, dtype, shards)
        return ref_model.load_model(d)

    def run_ref(self, cfg, t, tokens):
        return ref_model.forward(cfg, t, tokens, list(range(len(tokens))))

    def test_rope_known_values(self):
        # head_dim 4, theta 100: inv_freq = [1, 0.1]; dims (0,2) and (1,3) rotate together.
        x = np.array([[[1.0, 2.0, 3.0, 4.0]]])
        inv_freq = np.array([1.0, 0.1])
        got = ref_model.rope(x, np.array([2]), inv_freq)[0, 0]
        c0, s0, c1, s1 = math.cos(2), math.sin(2), math.cos(0.2), math.sin(0.2)
        want = [1 * c0 - 3 * s0, 2 * c1 - 4 * s1, 3 * c0 + 1 * s0, 4 * c1 + 2 * s1]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)
        # position 0 is the identity
        np.testing.assert_array_equal(ref_model.rope(x, np.array([0]), inv_freq), x)
        # rope_parameters' default inv_freq for that head: theta^(-2i/d)
        cfg = ref_model.Config(make_config("llama", heads=1, kv_heads=1, head_dim=4))
        cfg.theta = 100.0
        inv, factor = ref_model.rope_parameters(cfg)
        np.testing.assert_allclose(inv, inv_freq, rtol=1e-15)
        self.assertEqual(factor, 1.0)
        # interleaved: pairs (0,1) and (2,3) rotate together; the result comes de-interleaved
        # ([x0', x2', x1', x3']), as transformers' apply_rotary_pos_emb_interleave leaves it.
        got = ref_model.rope(x, np.array([2]), inv_freq, interleave=True)[0, 0]
        want = [1 * c0 - 2 * s0, 3 * c1 - 4 * s1, 2 * c0 + 1 * s0, 4 * c1 + 3 * s1]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)
        # attention_factor scales cos and sin
        np.testing.assert_allclose(ref_model.rope(x, np.array([2]), inv_freq, 1.5),
                                   1.5 * ref_model.rope(x, np.array([2]), inv_freq), rtol=1e-15)

    def test_decodes_bf16_and_f16(self):
        raw = np.array([0x3F80, 0xC000, 0x3EAB], dtype="<u2").view(np.uint8)
        np.testing.assert_array_equal(ref_model._decode(raw, "BF16", [3]),
                                      [1.0, -2.0, 0.333984375])
        raw = np.array([0x3C00, 0xC000, 0x3555], dtype="<u2").view(np.uint8)
        np.testing.assert_array_equal(ref_model._decode(raw, "F16", [3]),
                                      [1.0, -2.0, 0.333251953125])

    def test_decodes_fp8_and_applies_block_scales(self):
        # e4m3fn: 1.0, -2.0, 448 (largest), 2^-9 (smallest subnormal), 0.875 * 2^-6.
        raw = np.array([0x38, 0xC0, 0x7E, 0x01, 0x07], dtype=np.uint8)
        np.testing.assert_array_equal(ref_model._decode(raw, "F8_E4M3", [5]),
                                      [1.0, -2.0, 448.0, 2.0 ** -9, 0.875 * 2.0 ** -6])
        self.assertTrue(np.isnan(ref_model._decode(np.array([0x7F], np.uint8), "F8_E4M3", [1])[0]))
        # W (130, 3): two row blocks, the second partial; scale_inv (2, 1).
        w = np.ones((130, 3))
        out = ref_model.dequantise_fp8({"a.weight": w, "a.weight_scale_inv": np.array([[2.0], [3.0]]),
                                        "b.weight": w})
        self.assertEqual(sorted(out), ["a.weight", "b.weight"])
        self.assertTrue((out["a.weight"][:128] == 2.0).all() and (out["a.weight"][128:] == 3.0).all())
        self.assertTrue((out["b.weight"] == 1.0).all())
        with self.assertRaises(ref_model.RefError):
            ref_model.dequantise_fp8({"a.weight": w, "a.weight_scale_inv": np.ones((1, 1))})

    def test_matches_naive_every_arch(self):
        cases = [("llama", {}), ("llama", {"attention_bias": True}), ("qwen2", {}),
                 ("qwen3", {}), ("qwen3", {"heads": 4, "kv_heads": 1, "head_dim": 6})]
        tokens = [3, 17, 0, 36, 5, 5, 22, 9]
        for model_type, kw in cases:
            with self.subTest(model_type=model_type, **kw):
                cfg_json = make_config(model_type, **kw)
                tensors = make_weights(cfg_json, seed=len(kw) + len(model_type))
                cfg, t = self.model(model_type + str(len(kw)), cfg_json, tensors)
                if cfg_json.get("attention_bias"):
                    self.assertIn("model.layers.0.self_attn.o_proj.bias", t)
                got = self.run_ref(cfg, t, tokens)
                want = naive_logits(cfg_json, tensors, tokens)
                self.assertEqual(got.shape, (len(tokens), 37))
                self.assertLess(rel_err(got, want), 1e-12)
                # far from uniform: the test would notice a broken layer
                self.assertGreater(np.ptp(got[-1]), 0.5)

    def test_causal(self):
        cfg_json = make_config("qwen3")
        cfg, t = self.model("m", cfg_json, make_weights(cfg_json, 1))
        a = self.run_ref(cfg, t, [1, 2, 3, 4, 5, 6])
        b = self.run_ref(cfg, t, [1, 2, 3, 30, 31, 32])
        np.testing.assert_array_equal(a[:3], b[:3])
        self.assertGreater(np.max(np.abs(a[3:] - b[3:])), 1e-3)
        c = self.run_ref(cfg, t, [1, 2, 3])
        np.testing.assert_allclose(a[:3], c, rtol=1e-13, atol=1e-13)

    def test_gqa_equals_duplicated_mha(self):
        gqa = make_config("qwen2", heads=4, kv_heads=2)
        tg = make_weights(gqa, 2)
        mha = make_config("qwen2", heads=4, kv_heads=4)
        tm = dict(tg)
        D = gqa["head_dim"]
        for i in range(gqa["num_hidden_layers"]):
            for n in ("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias"):
                key = "model.layers.%d.self_attn.%s" % (i, n)
                heads = tg[key].reshape(2, D, -1)  # q head h reads kv head h // 2
                tm[key] = np.repeat(heads, 2, axis=0).reshape((4 * D,) + tg[key].shape[1:])
        cg, wg = self.model("gqa", gqa, tg)
        cm, wm = self.model("mha", mha, tm)
        tokens = [4, 8, 15, 16, 23, 36]
        self.assertLess(rel_err(self.run_ref(cg, wg, tokens), self.run_ref(cm, wm, tokens)), 1e-13)

    def test_sharded_and_dtypes(self):
        cfg_json = make_config("llama")
        tensors = make_weights(cfg_json, 3)
        tokens = [1, 9, 2, 8]
        _, single = self.model("single", cfg_json, tensors)
        cfg, sharded = self.model("sharded", cfg_json, tensors, shards=3)
        self.assertEqual(sorted(single), sorted(sharded))
        np.testing.assert_array_equal(self.run_ref(cfg, single, tokens),
                                      self.run_ref(cfg, sharded, tokens))
        for dtype, np_round in (("BF16", None), ("F16", np.float16)):
            _, t = self.model(dtype, cfg_json, tensors, dtype=dtype)
            for name, arr in tensors.items():
                if np_round is None:
                    want = np.frombuffer(encode(arr, "BF16"), "<u2").astype(np.uint32) << 16
                    want = want.view(np.float32).reshape(arr.shape)
                else:
                    want = arr.astype(np_round)
                np.testing.assert_array_equal(t[name], want.astype(np.float64))

    def test_tied_embeddings(self):
        cfg_json = make_config("qwen3", tie=True)
        tensors = make_weights(cfg_json, 4)
        self.assertNotIn("lm_head.weight", tensors)
        cfg, t = self.model("tied", cfg_json, tensors)
        tokens = [7, 3, 1]
        self.assertLess(rel_err(self.run_ref(cfg, t, tokens),
                                naive_logits(cfg_json, tensors, tokens)), 1e-12)
        cfg.tie = False  # untied without lm_head.weight is refused
        with self.assertRaises(ref_model.RefError):
            self.run_ref(cfg, t, tokens)

    def test_cli_round_trip_and_errors(self):
        cfg_json = make_config("qwen2")
        tensors = make_weights(cfg_json, 5)
        d = os.path.join(self.tmp.name, "cli")
        write_model(d, cfg_json, tensors)
        req = os.path.join(self.tmp.name, "req.json")
        with open(req, "w") as f:
            json.dump({"requests": [{"tokens": [1, 2, 3, 4], "positions": [3, 1]},
                                    {"tokens": [5], "positions": [0]}]}, f)
        out = os.path.join(self.tmp.name, "out.bin")
        script = os.path.join(HERE, "ref_model.py")
        cmd = [sys.executable, script, "--model", d, "--requests", req, "--out", out]
        subprocess.run(cmd, check=True)
        rows = ref_model.read_logits(out)
        want = naive_logits(cfg_json, tensors, [1, 2, 3, 4])
        self.assertEqual(rows.shape, (3, 37))
        self.assertLess(rel_err(rows[0], want[3]), 1e-12)
        self.assertLess(rel_err(rows[1], want[1]), 1e-12)
        self.assertLess(rel_err(rows[2], naive_logits(cfg_json, tensors, [5])[0]), 1e-12)
        # greedy: the rows at positions 1..3 of [7, 8] + 3 greedy tokens are the ones the tokens
        # were taken from
        with open(req, "w") as f:
            json.dump({"requests": [{"tokens": [7, 8], "positions": [1, 2, 3], "greedy": 3}]}, f)
        subprocess.run(cmd, check=True)
        rows = ref_model.read_logits(out)
        seq = [7, 8] + [int(np.argmax(r)) for r in rows]
        want = naive_logits(cfg_json, tensors, seq)
        self.assertLess(rel_err(rows, want[1:4]), 1e-12)
        self.assertGreater(len(set(seq)), 2)
        # an out-of-vocab token, then a truncated file: exit 1 with a message, no traceback
        with open(req, "w") as f:
            json.dump({"requests": [{"tokens": [99], "positions": [0]}]}, f)
        r = subprocess.run(cmd, capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("within the vocab", r.stderr)
        path = os.path.join(d, "model.safetensors")
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) - 4)
        r = subprocess.run(cmd, capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("bad data_offsets", r.stderr)


if __name__ == "__main__":
    unittest.main()
