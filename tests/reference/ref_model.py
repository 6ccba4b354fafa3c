#!/usr/bin/python3
"""Independent float64 NumPy reference for Hugging Face Llama / Qwen2 / Qwen3 causal LMs.

It shares no code with pdserve: it parses config.json and the safetensors files itself and follows
the forward pass of transformers' modeling_llama.py / modeling_qwen2.py / modeling_qwen3.py:

  x = embed_tokens[ids]
  per layer:
    h = RMSNorm(x) * input_layernorm                  RMSNorm(x) = x / sqrt(mean(x^2) + eps)
    q, k, v = h @ Wq^T (+bq), h @ Wk^T (+bk), h @ Wv^T (+bv)     (T, heads|kv_heads, head_dim)
    qwen3: q = RMSNorm_head(q) * q_norm, k = RMSNorm_head(k) * k_norm  (before RoPE)
    RoPE: x*cos + rotate_half(x)*sin, rotate_half pairs dims i and i+d/2,
          inv_freq = 1 / theta^(arange(0, d, 2) / d), angle = pos * inv_freq
    attention: q head h reads kv head h // (heads / kv_heads); causal softmax(q k^T / sqrt(d)) v
    x = x + o_proj(attn) (+bo)
    x = x + down(silu(gate(h2)) * up(h2)),  h2 = RMSNorm(x) * post_attention_layernorm
  logits = RMSNorm(x) * norm @ (lm_head or embed_tokens when tie_word_embeddings)^T

Every bias tensor present in the checkpoint is applied (qwen2's q/k/v biases; llama's and qwen3's
attention_bias, which also puts a bias on o_proj). Everything is computed in float64.

CLI:
  ref_model.py --model DIR --requests REQ.json --out OUT.bin

REQ.json:  {"requests": [{"tokens": [int, ...], "positions": [int, ...]}, ...]}
  Each request is one sequence starting at position 0; `positions` lists the positions whose
  next-token logits to output (0 <= p < len(tokens)). Attention is causal, so the logits at
  position p depend only on tokens[0..p]: one request covers a prompt and its decode steps.

OUT.bin (little-endian):
  bytes 0..7    magic b"PDREFLG1"
  bytes 8..15   uint64 vocab_size
  bytes 16..23  uint64 num_rows  (sum of len(positions) over requests)
  then num_rows x vocab_size float64: the rows in request order, then position order.
"""

import argparse
import json
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
    else:
        raise RefError("unsupported safetensors dtype %s" % dtype)
    return arr.astype(np.float64).reshape(shape)


_DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}


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
# model

class Config:
    def __init__(self, cfg):
        self.model_type = cfg["model_type"]
        if self.model_type not in ("llama", "qwen2", "qwen3"):
            raise RefError("unsupported model_type %s" % self.model_type)
        self.hidden = int(cfg["hidden_size"])
        self.num_layers = int(cfg["num_hidden_layers"])
        self.num_heads = int(cfg["num_attention_heads"])
        self.num_kv_heads = int(cfg.get("num_key_value_heads") or self.num_heads)
        self.head_dim = int(cfg.get("head_dim") or self.hidden // self.num_heads)
        self.vocab = int(cfg["vocab_size"])
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.theta = float(cfg.get("rope_theta", 10000.0))
        self.tie = bool(cfg.get("tie_word_embeddings", False))
        scaling = cfg.get("rope_scaling")
        if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
            raise RefError("rope_scaling %s is not supported" % scaling)
        if self.num_heads % self.num_kv_heads:
            raise RefError("num_attention_heads not a multiple of num_key_value_heads")


def load_model(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = Config(json.load(f))
    return cfg, read_checkpoint(model_dir)


def rms_norm(x, w, eps):
    """x (..., n), w (n,) -> x / sqrt(mean(x^2) + eps) * w."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, positions, theta):
    """x (T, heads, d), positions (T,) -> rotated x, HF rotate_half convention."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)  # (d/2,)
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]   # (T, d/2)
    emb = np.concatenate([angles, angles], axis=-1)                       # (T, d)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]           # (T, 1, d)
    half = d // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def _linear(t, x, name):
    """x (T, in) @ W(out, in)^T (+ bias if the checkpoint has one) -> (T, out)."""
    y = x @ t[name + ".weight"].T
    bias = t.get(name + ".bias")
    return y if bias is None else y + bias


def attention(cfg, t, p, h, positions):
    """h (T, hidden) normed input of layer prefix p -> (T, hidden) attention output."""
    T, H, KV, D = h.shape[0], cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q = _linear(t, h, p + "self_attn.q_proj").reshape(T, H, D)
    k = _linear(t, h, p + "self_attn.k_proj").reshape(T, KV, D)
    v = _linear(t, h, p + "self_attn.v_proj").reshape(T, KV, D)
    if cfg.model_type == "qwen3":
        q = rms_norm(q, t[p + "self_attn.q_norm.weight"], cfg.eps)
        k = rms_norm(k, t[p + "self_attn.k_norm.weight"], cfg.eps)
    q, k = rope(q, positions, cfg.theta), rope(k, positions, cfg.theta)
    group = H // KV
    k = np.repeat(k, group, axis=1)  # (T, H, D): q head h reads kv head h // group
    v = np.repeat(v, group, axis=1)
    scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(D)   # (H, T, S)
    causal = np.triu(np.ones((T, T), dtype=bool), k=1)       # s > t is the future
    scores = np.where(causal[None], -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.einsum("hts,shd->thd", probs, v).reshape(T, H * D)
    return _linear(t, out, p + "self_attn.o_proj")


def forward(cfg, t, tokens, positions_out):
    """tokens (T,) ids of one sequence from position 0 -> (len(positions_out), vocab) logits."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.size == 0 or tokens.min() < 0 or tokens.max() >= cfg.vocab:
        raise RefError("token ids must be non-empty and within the vocab")
    x = t["model.embed_tokens.weight"][tokens]  # (T, hidden)
    positions = np.arange(tokens.size)
    for i in range(cfg.num_layers):
        p = "model.layers.%d." % i
        h = rms_norm(x, t[p + "input_layernorm.weight"], cfg.eps)
        x = x + attention(cfg, t, p, h, positions)
        h = rms_norm(x, t[p + "post_attention_layernorm.weight"], cfg.eps)
        gate = _linear(t, h, p + "mlp.gate_proj")
        up = _linear(t, h, p + "mlp.up_proj")
        x = x + _linear(t, gate / (1.0 + np.exp(-gate)) * up, p + "mlp.down_proj")
    sel = np.asarray(positions_out, dtype=np.int64)
    if sel.size and (sel.min() < 0 or sel.max() >= tokens.size):
        raise RefError("requested position outside the sequence")
    h = rms_norm(x[sel], t["model.norm.weight"], cfg.eps)
    head = t["model.embed_tokens.weight"] if cfg.tie else t.get("lm_head.weight")
    if head is None:
        raise RefError("lm_head.weight missing and tie_word_embeddings is false")
    return h @ head.T


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
            rows.extend(forward(cfg, tensors, req["tokens"], req["positions"]))
        write_logits(args.out, rows, cfg.vocab)
    except (RefError, OSError, KeyError, ValueError) as e:
        print("ref_model.py: error: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
