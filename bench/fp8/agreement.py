#!/usr/bin/python3
"""Greedy text of a bf16 model against its FP8 conversion (`pdserve quantize --dtype fp8`).

Runs `pdserve generate` greedily (temperature 0, --ignore-eos) on the same prompts with both
checkpoints and reports how far they agree: sequences identical, the mean length of the common
prefix, and the fraction of token positions equal. Reported, not asserted: FP8 weights are a
different model, near ties in the bf16 model's logits can flip, and one flipped token changes
the rest of a sequence.

    /usr/bin/python3 bench/fp8/agreement.py --pdserve build/pdserve \\
        [--model models/demo-llama] [--prompts 50] [--max-tokens 32] [--json]

The prompts are the model's own text: each is the first words of a fortune written by the bf16
model from a seeded random token (so they are in-distribution for the demo model), or, with
--prompt-file, one prompt per line.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile


def generate(pdserve, model, prompt_ids, max_tokens):
    cmd = [pdserve, "generate", "--model", model, "--prompt-ids",
           ",".join(str(t) for t in prompt_ids), "--max-tokens", str(max_tokens),
           "--temperature", "0", "--ignore-eos", "--json", "--threads", "1"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def prompts_from_model(pdserve, model, count, seed):
    """count prompts of 4-12 tokens: a seeded random start token, continued greedily by the model
    with a few random tokens mixed in, so the prompts differ."""
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        ids = [rng.randrange(vocab - 64) for _ in range(rng.randint(2, 5))]
        more = generate(pdserve, model, ids, rng.randint(2, 7))["token_ids"]
        prompts.append(ids + more)
    return prompts


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pdserve", default="build/pdserve")
    p.add_argument("--model", default="models/demo-llama", help="a bf16 checkpoint")
    p.add_argument("--fp8-model", help="its FP8 conversion (default: made with pdserve quantize)")
    p.add_argument("--prompts", type=int, default=50)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pd_fp8_agreement_") as tmp:
        fp8 = a.fp8_model
        if fp8 is None:
            fp8 = os.path.join(tmp, "fp8")
            subprocess.run([a.pdserve, "quantize", "--model", a.model, "--out", fp8,
                            "--dtype", "fp8"], check=True, capture_output=True)
        prompts = prompts_from_model(a.pdserve, a.model, a.prompts, a.seed)
        same = prefix_total = equal_positions = positions = 0
        rows = []
        for ids in prompts:
            x = generate(a.pdserve, a.model, ids, a.max_tokens)
            y = generate(a.pdserve, fp8, ids, a.max_tokens)
            tx, ty = x["token_ids"], y["token_ids"]
            prefix = 0
            while prefix < min(len(tx), len(ty)) and tx[prefix] == ty[prefix]:
                prefix += 1
            same += tx == ty
            prefix_total += prefix
            equal_positions += sum(1 for u, v in zip(tx, ty) if u == v)
            positions += max(len(tx), len(ty))
            rows.append({"prompt_ids": ids, "bf16": x["text"], "fp8": y["text"],
                         "common_prefix": prefix})
    n = len(prompts)
    report = {"model": a.model, "prompts": n, "max_tokens": a.max_tokens,
              "identical_sequences": same, "identical_fraction": same / n,
              "mean_common_prefix_tokens": prefix_total / n,
              "equal_token_fraction": equal_positions / positions}
    if a.json:
        report["rows"] = rows
        print(json.dumps(report, indent=2))
        return 0
    print("greedy text, bf16 %s vs its fp8 conversion: %d prompts x %d tokens" %
          (a.model, n, a.max_tokens))
    print("  identical sequences       %d / %d (%.2f)" % (same, n, same / n))
    print("  mean common prefix        %.1f tokens" % (prefix_total / n))
    print("  equal tokens (by position) %.3f" % (equal_positions / positions))
    for r in rows[:3]:
        print("  e.g. bf16: %r\n       fp8: %r" % (r["bf16"][:70], r["fp8"][:70]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
