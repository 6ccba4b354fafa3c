#!/usr/bin/env bash
# llama.cpp's llama-bench on the same shapes as pdserve bench-engine, run right after it on the
# same host, so that the two engines' decode (tg32) and prefill (pp512) figures compare.
#
#   LLAMA_BENCH=/path/to/llama-bench [GGUF=model.gguf | LLAMA_CONVERT=/path/to/convert_hf_to_gguf.py]
#     [GGUF_Q8=model-q8_0.gguf]
#     bench/llama_bench.sh [--preset llama-1b] [--threads 2] [--rounds 2] [--pdserve build/pdserve]
#
# The model is the preset bench-engine writes (models/<preset>-bf16, written on first use); its
# GGUF is either given (GGUF) or converted from that directory to F16 with llama.cpp's
# convert_hf_to_gguf.py (LLAMA_CONVERT; needs its Python requirements); likewise its Q8_0 GGUF
# (GGUF_Q8, or converted with --outtype q8_0 when LLAMA_CONVERT is set; left out when neither),
# llama.cpp's 8-bit format, beside pdserve's fp8 rows. Each round runs, in turn:
#   pdserve bench-engine --preset P --batches 1 --contexts 128 --phase decode --matmul both \
#     --dtype both                                        (bf16 and fp8 checkpoints)
#   pdserve bench-engine --preset P --phase prefill --prefill-tokens 512 --matmul both --dtype both
#   llama-bench -m GGUF [-m GGUF_Q8] -t THREADS -p 512 -n 32 -r 3   (pp512 and tg32)
# and prints both engines' tokens/s. No llama.cpp is built or needed by the rest of the project;
# without LLAMA_BENCH this script only says so and exits 2.
set -euo pipefail

preset=llama-1b
threads=2
rounds=2
pdserve=build/pdserve
while [[ $# -gt 0 ]]; do
  case "$1" in
    --preset) preset="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --pdserve) pdserve="$2"; shift 2 ;;
    *) echo "llama_bench.sh: unknown argument $1" >&2; exit 1 ;;
  esac
done

if [[ -z "${LLAMA_BENCH:-}" || ! -x "${LLAMA_BENCH}" ]]; then
  echo "llama_bench.sh: set LLAMA_BENCH to an llama-bench executable (llama.cpp build)" >&2
  exit 2
fi
if [[ ! -x "$pdserve" ]]; then
  echo "llama_bench.sh: no pdserve at $pdserve (build it: cmake --build build --target pdserve)" >&2
  exit 1
fi

model_dir="models/${preset}-bf16"
if [[ ! -d "$model_dir" ]]; then  # bench-engine writes the preset on first use
  "$pdserve" bench-engine --preset "$preset" --phase decode --batches 1 --contexts 16 \
    --seconds 0.1 --pairs 1 > /dev/null
fi
gguf="${GGUF:-}"
if [[ -z "$gguf" ]]; then
  if [[ -z "${LLAMA_CONVERT:-}" ]]; then
    echo "llama_bench.sh: set GGUF to an F16 GGUF of $model_dir, or LLAMA_CONVERT to" \
      "llama.cpp's convert_hf_to_gguf.py to make one" >&2
    exit 2
  fi
  gguf="models/${preset}-f16.gguf"
  if [[ ! -f "$gguf" ]]; then
    python3 "$LLAMA_CONVERT" "$model_dir" --outtype f16 --outfile "$gguf"
  fi
fi
gguf_q8="${GGUF_Q8:-}"
if [[ -z "$gguf_q8" && -n "${LLAMA_CONVERT:-}" ]]; then
  gguf_q8="models/${preset}-q8_0.gguf"
  if [[ ! -f "$gguf_q8" ]]; then
    python3 "$LLAMA_CONVERT" "$model_dir" --outtype q8_0 --outfile "$gguf_q8"
  fi
fi
models=(-m "$gguf")
if [[ -n "$gguf_q8" ]]; then models+=(-m "$gguf_q8"); fi

echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')," \
  "threads $threads, load $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 1; r <= rounds; ++r)); do
  echo "== round $r: pdserve bench-engine"
  "$pdserve" bench-engine --preset "$preset" --threads "$threads" --batches 1 --contexts 128 \
    --phase decode --matmul both --dtype both 2> /dev/null |
    grep -E "^(host|kernels|machine|model|$preset)"
  "$pdserve" bench-engine --preset "$preset" --threads "$threads" --phase prefill \
    --prefill-tokens 512 --matmul both --dtype both 2> /dev/null | grep -E "^$preset"
  echo "== round $r: llama-bench (F16${gguf_q8:+ and Q8_0}, pp512 and tg32)"
  "$LLAMA_BENCH" "${models[@]}" -t "$threads" -p 512 -n 32 -r 3 -o md
done
