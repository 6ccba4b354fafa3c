#!/usr/bin/python3
"""Trains pdserve's demo model, a small Llama, on the fortune cookies of Debian's `fortunes`.

  /usr/bin/python3 tools/train_demo_model.py --out models/demo-llama
      Learns a byte-level BPE tokenizer from the corpus, trains the model on one CPU thread
      (matmuls in bf16 through oneDNN, weights and loss in f32; --f32 for a CPU without bf16
      instructions, where bf16 is slow) and writes a Hugging Face model folder: config.json, generation_config.json, model.safetensors
      (bf16), tokenizer.json, tokenizer_config.json (Llama-3's chat template), README.md and
      LICENSE-corpus (the corpus's copyright file).

  /usr/bin/python3 tools/train_demo_model.py --check --model models/demo-llama --pdserve build/pdserve
      Greedy generation of this script's model (float64, weights read back from the folder)
      against `pdserve generate` on a few prompts: the token ids must agree, and the
      log-probabilities pdserve reports must be close to the reference's. Exit 0 when they do,
      1 when not, 77 (ctest's skip) when PyTorch or NumPy is not installed.

Needs PyTorch (Debian's python3-torch) and NumPy; nothing is downloaded. The corpus is every
fortune file of /usr/share/games/fortunes but the ASCII-art ones, split at the "%" lines; fortunes
holding control characters (overstrike) are left out; 2% are held out for the validation loss.

Training documents are "<|begin_of_text|>FORTUNE<|eot_id|>", and a third of them a chat turn in
Llama-3's template (a user asking for a fortune, the fortune as the assistant's answer), so a chat
completion answers with a fortune and stops at <|eot_id|>. The documents are concatenated and the
model learns from random windows of that stream.

Everything is seeded (--seed) and trained on one thread: the same command on the same CPU and
PyTorch build gives the same loss curve and weights, bit for bit. Across CPUs or PyTorch builds
the kernels round differently (bf16 above all), so the curve agrees closely but not exactly.
"""

import argparse
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("train_demo_model: needs PyTorch and NumPy (Debian's python3-torch); skipped",
          file=sys.stderr)
    sys.exit(77)  # ctest's skip code

from demo_corpus import (BOS, CHAT_FRACTION, CHAT_PROMPTS, CORPUS_DIR, CORPUS_LICENSE, EOT,
                         LLAMA3_CHAT_TEMPLATE, SPECIALS, Tokenizer, chat_text, pretokenize,
                         read_fortunes, train_bpe)


# ---------------------------------------------------------------------------------------------
# The model: Hugging Face's LlamaForCausalLM forward pass, with its parameter names

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, d = c["hidden_size"], c["head_dim"]
        self.heads, self.kv_heads, self.head_dim = c["num_attention_heads"], c[
            "num_key_value_heads"], d
        self.q_proj = nn.Linear(h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)  # (b, heads, t, d)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        group = self.heads // self.kv_heads  # query head h reads kv head h // group
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (b, heads, t, t)
        att = scores.masked_fill(mask, float("-inf")).softmax(-1)
        return self.o_proj((att @ v).transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = Mlp(c)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class Llama(nn.Module):
    """state_dict() names are the checkpoint's (model.layers.0.self_attn.q_proj.weight, ...);
    the output projection is the embedding (tie_word_embeddings)."""

    def __init__(self, c):
        super().__init__()
        assert c["tie_word_embeddings"]
        self.config = c
        self.model = LlamaBody(c)

    def forward(self, ids):  # ids (b, t) -> logits (b, t, vocab)
        c, t = self.config, ids.shape[1]
        d = c["head_dim"]
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        angles = torch.arange(t, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (t, d/2)
        emb = torch.cat((angles, angles), dim=-1)
        dtype = self.model.norm.weight.dtype
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        return self.model.norm(x) @ self.model.embed_tokens.weight.t()


def init_weights(model, c):
    """GPT-2's: N(0, 0.02), the projections into the residual stream scaled by 1/sqrt(2 layers)."""
    for name, p in model.named_parameters():
        if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
            continue
        std = 0.02
        if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
            std /= math.sqrt(2 * c["num_hidden_layers"])
        nn.init.normal_(p, mean=0.0, std=std)


# ---------------------------------------------------------------------------------------------
# safetensors (the format is a little-endian u64 header size, a JSON header, then raw data)

def write_safetensors(path, tensors):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to(torch.bfloat16).contiguous()
        raw = t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for raw in blobs:
            f.write(raw)


def read_safetensors(path):
    """name -> float64 tensor (BF16 and F32 entries)."""
    with open(path, "rb") as f:
        data = f.read()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = np.frombuffer(data, dtype=np.uint8, count=end - start, offset=8 + size + start)
        if info["dtype"] == "BF16":
            arr = (raw.view("<u2").astype(np.uint32) << 16).view("<f4")
        elif info["dtype"] == "F32":
            arr = raw.view("<f4")
        else:
            raise ValueError(f"{path}: {name}: dtype {info['dtype']} is not read here")
        out[name] = torch.from_numpy(arr.astype(np.float64).reshape(info["shape"]))
    return out


# ---------------------------------------------------------------------------------------------
# Training

def model_config(args, vocab_size, tok):
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": vocab_size, "hidden_size": args.hidden_size,
        "intermediate_size": args.intermediate_size, "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads,
        "head_dim": args.hidden_size // args.heads, "max_position_embeddings": 4096,
        "rope_theta": 10000.0, "rope_scaling": None, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
        "bos_token_id": tok.special_ids[BOS], "eos_token_id": tok.special_ids[EOT],
        "torch_dtype": "bfloat16", "use_cache": True,
    }


def build_documents(fortunes, tok, rng):
    """Token ids of each fortune as a document: plain or, for CHAT_FRACTION of them, a chat turn."""
    docs = []
    for text in fortunes:
        if rng.random() < CHAT_FRACTION:
            docs.append(tok.encode(chat_text(rng.choice(CHAT_PROMPTS), text)))
        else:
            docs.append(tok.encode(BOS + text + EOT))
    return docs


def lr_at(step, args):
    """Linear warm-up, then cosine decay to a tenth."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def batches(stream, args, gen):
    """Random windows of the token stream: inputs (b, t) and their next tokens (b, t)."""
    starts = torch.randint(0, len(stream) - args.context - 1, (args.batch,), generator=gen)
    x = torch.stack([stream[s:s + args.context] for s in starts.tolist()])
    y = torch.stack([stream[s + 1:s + args.context + 1] for s in starts.tolist()])
    return x, y


def evaluate(model, stream, args):
    """Mean loss over consecutive windows of the held-out stream."""
    model.eval()
    losses = []
    with torch.no_grad():
        for s in range(0, len(stream) - args.context - 1, args.context)[:32]:
            x = stream[s:s + args.context][None]
            y = stream[s + 1:s + args.context + 1][None]
            logits = model(x)
            losses.append(F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1)).item())
    model.train()
    return sum(losses) / len(losses)


def train(args):
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    t0 = time.time()
    fortunes = read_fortunes(args.corpus)
    rng.shuffle(fortunes)
    num_val = len(fortunes) // 50
    val_fortunes, train_fortunes = fortunes[:num_val], fortunes[num_val:]
    word_counts = {}
    for text in train_fortunes:
        for word in pretokenize(text):
            key = word.encode("utf-8")
            word_counts[key] = word_counts.get(key, 0) + 1
    tokens, merges = train_bpe(word_counts, args.vocab_size - len(SPECIALS))
    tok = Tokenizer(tokens, merges, SPECIALS)
    train_docs = build_documents(train_fortunes, tok, rng)
    val_docs = build_documents(val_fortunes, tok, rng)
    stream = torch.tensor([i for d in train_docs for i in d], dtype=torch.long)
    val_stream = torch.tensor([i for d in val_docs for i in d], dtype=torch.long)
    text_bytes = sum(len(t.encode()) for t in train_fortunes)
    print(f"corpus: {len(fortunes)} fortunes ({len(train_fortunes)} train, {num_val} held out), "
          f"{text_bytes} bytes -> {len(stream)} tokens ({text_bytes / len(stream):.2f} bytes/token); "
          f"vocabulary {tok.vocab_size} ({len(merges)} merges); {time.time() - t0:.0f} s",
          flush=True)

    config = model_config(args, tok.vocab_size, tok)
    model = Llama(config)
    init_weights(model, config)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"model: {num_params} parameters; {args.steps} steps of {args.batch} x {args.context} "
          f"tokens ({args.steps * args.batch * args.context / len(stream):.1f} epochs)", flush=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)
    t_train, smooth = time.time(), None
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        x, y = batches(stream, args, gen)
        # bf16 matmuls (oneDNN; AMX or AVX-512 BF16 where the CPU has them), f32 weights and loss.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not args.f32):
            logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        smooth = loss.item() if smooth is None else 0.95 * smooth + 0.05 * loss.item()
        if step % args.log_every == 0 or step == args.steps - 1:
            line = f"step {step:5d}  loss {loss.item():.4f}  (smoothed {smooth:.4f})"
            if step % args.eval_every == 0 or step == args.steps - 1:
                line += f"  val {evaluate(model, val_stream, args):.4f}"
            print(f"{line}  {time.time() - t_train:.0f} s", flush=True)
    val = evaluate(model, val_stream, args)
    minutes = (time.time() - t0) / 60
    print(f"done: train loss (smoothed) {smooth:.4f}, held-out loss {val:.4f}, {minutes:.1f} min",
          flush=True)
    write_folder(args, model, config, tok, num_params, smooth, val)
    prompt = tok.encode(BOS + "The secret of life is")
    print("sample:", repr(tok.decode(greedy(model, prompt, 40))))


def write_folder(args, model, config, tok, num_params, train_loss, val_loss):
    os.makedirs(args.out, exist_ok=True)

    def dump(name, obj):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")

    dump("config.json", config)
    dump("generation_config.json", {"bos_token_id": config["bos_token_id"],
                                    "eos_token_id": config["eos_token_id"], "do_sample": False})
    dump("tokenizer.json", tok.tokenizer_json())
    dump("tokenizer_config.json", {
        "add_bos_token": True, "add_eos_token": False, "bos_token": BOS, "eos_token": EOT,
        "pad_token": "<|end_of_text|>", "chat_template": LLAMA3_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False, "model_max_length": 4096,
        "tokenizer_class": "PreTrainedTokenizerFast"})
    write_safetensors(os.path.join(args.out, "model.safetensors"), model.state_dict())
    shutil.copyfile(CORPUS_LICENSE, os.path.join(args.out, "LICENSE-corpus"))
    write_readme(args, config, num_params, train_loss, val_loss)


def write_readme(args, c, num_params, train_loss, val_loss):
    """The folder's README: what the model is, and the command that made it."""
    with open(os.path.join(args.out, "README.md"), "w", encoding="utf-8") as f:
        f.write(f"""# demo-llama

pdserve's demo model: a Llama of {num_params:,} parameters
({c['num_hidden_layers']} layers, hidden {c['hidden_size']}, {c['num_attention_heads']} query heads and {c['num_key_value_heads']} KV heads of {c['head_dim']}, MLP {c['intermediate_size']},
vocabulary {c['vocab_size']}, tied embeddings; bf16 weights) trained on the fortune cookies of
Debian's `fortunes` package (/usr/share/games/fortunes; their licence is LICENSE-corpus).
It writes English-like fortunes, not sense.

Made by

    {command_line(args)}

on one CPU thread, seeded (seed {args.seed}): training loss {train_loss:.3f} (moving average), held-out loss
{val_loss:.3f} (nats per token). The same command reproduces the loss curve and the weights on the same
CPU and PyTorch build; on another, float rounding makes them differ slightly. pdserve's greedy
output is checked against the script's PyTorch model by

    /usr/bin/python3 tools/train_demo_model.py --check --model models/demo-llama --pdserve build/pdserve
""")


def command_line(args):
    defaults = parser().parse_args([])
    flags = [f"--{k.replace('_', '-')}" + ("" if isinstance(v, bool) else f" {v}")
             for k, v in sorted(vars(args).items())
             if k not in ("check", "model", "pdserve") and v != getattr(defaults, k)]
    return " ".join(["/usr/bin/python3 tools/train_demo_model.py"] + flags)


# ---------------------------------------------------------------------------------------------
# Generation and the check against pdserve

def greedy(model, prompt_ids, num_tokens):
    """Greedy continuation (the whole sequence recomputed per token: short and simple)."""
    ids = list(prompt_ids)
    model.eval()
    with torch.no_grad():
        for _ in range(num_tokens):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt_ids):]


def reference_logprobs(model, prompt_ids, generated):
    """Log-softmax rows of the model over prompt + generated: (len(generated), vocab)."""
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt_ids) + list(generated)]))[0]
    rows = logits[len(prompt_ids) - 1:len(prompt_ids) - 1 + len(generated)]
    return torch.log_softmax(rows, dim=-1)


CHECK_PROMPTS = ["The secret of life is", "A computer scientist walks into a bar and",
                 "Q: Why did the chicken cross the road?\nA:"]


def check(args):
    """pdserve's greedy tokens and logprobs against the script's model in float64."""
    torch.set_num_threads(1)
    with open(os.path.join(args.model, "config.json")) as f:
        config = json.load(f)
    model = Llama(config).double()
    weights = read_safetensors(os.path.join(args.model, "model.safetensors"))
    model.load_state_dict(weights, strict=True)
    tok = Tokenizer.from_folder(args.model)
    failed = 0
    for prompt in CHECK_PROMPTS:
        prompt_ids = [tok.special_ids[BOS]] + tok.encode(prompt)
        ref = greedy(model, prompt_ids, args.check_tokens)
        out = subprocess.run([args.pdserve, "--log-level", "warn", "generate", "--model",
                              args.model, "--prompt", prompt, "--max-tokens",
                              str(args.check_tokens), "--ignore-eos", "--json", "--threads", "1"],
                             capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(f"check: pdserve generate failed ({out.returncode}): {out.stderr}")
            return 1
        got = json.loads(out.stdout)
        ids, logprobs = got["token_ids"], got["logprobs"]
        same = next((i for i, (a, b) in enumerate(zip(ids, ref)) if a != b), len(ref))
        lp = reference_logprobs(model, prompt_ids, ids)
        worst = max(abs(lp[i, t].item() - logprobs[i]) for i, t in enumerate(ids))
        print(f"check: {prompt!r}: {same}/{len(ref)} greedy tokens agree, logprob error "
              f"{worst:.2e}: {tok.decode(ids)!r}")
        if same < len(ref):
            # A flip between two near-equal logits is float rounding, not a bug: after it the
            # sequences differ, so only the tokens before it are compared.
            gap = (lp[same, ref[same]] - lp[same, ids[same]]).item()
            print(f"check:   token {same}: pdserve {ids[same]}, reference {ref[same]} "
                  f"(reference logprob gap {gap:.2e})")
            if gap > args.tie_tolerance:
                failed += 1
        if worst > args.logprob_tolerance:
            print(f"check:   logprob error above {args.logprob_tolerance}")
            failed += 1
    print("check: " + ("FAILED" if failed else "ok"))
    return 1 if failed else 0


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="models/demo-llama", help="model folder to write")
    p.add_argument("--corpus", default=CORPUS_DIR)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--intermediate-size", type=int, default=704)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--context", type=int, default=128, help="tokens per training window")
    p.add_argument("--batch", type=int, default=32, help="windows per step")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--f32", action="store_true",
                   help="f32 matmuls in training (slower; for CPUs without bf16 support)")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--check", action="store_true", help="compare pdserve with this model")
    p.add_argument("--model", default="models/demo-llama", help="--check: the model folder")
    p.add_argument("--pdserve", default="build/pdserve", help="--check: the pdserve binary")
    p.add_argument("--check-tokens", type=int, default=40, help="--check: greedy tokens")
    p.add_argument("--tie-tolerance", type=float, default=1e-3,
                   help="--check: a differing token is a near tie below this logprob gap")
    p.add_argument("--logprob-tolerance", type=float, default=1e-3,
                   help="--check: largest |logprob difference| accepted")
    return p


def main():
    args = parser().parse_args()
    if args.check:
        return check(args)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
