#!/usr/bin/env bash
# Runs each libFuzzer target for a stated time, one after another, and reports per target the
# executions, the edge coverage (cov), the features (ft) and the corpus size at the end.
#   fuzz/run.sh BUILD_DIR SECONDS [TARGET...]      (make fuzz: build-fuzz, FUZZ_SECONDS)
# Each target starts from its committed seeds (fuzz/corpus/<name>/, read only) and keeps what it
# finds in BUILD_DIR/fuzz-corpus/<name>/; a crash, leak, sanitizer report or hang (-timeout) leaves
# its input in BUILD_DIR/fuzz-artifacts/<name>/ and fails the run once every target has run.
set -euo pipefail

build_dir=${1:?usage: fuzz/run.sh BUILD_DIR SECONDS [TARGET...]}
seconds=${2:?usage: fuzz/run.sh BUILD_DIR SECONDS [TARGET...]}
shift 2
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(wire openai_request model_config safetensors tokenizer)
fi
fuzz_dir=$(cd "$(dirname "$0")" && pwd)

summary=()
failed=()
for name in "${targets[@]}"; do
  binary=$build_dir/fuzz/${name}_fuzz
  if [ ! -x "$binary" ]; then
    echo "fuzz/run.sh: $binary is not built" >&2
    exit 1
  fi
  work=$build_dir/fuzz-corpus/$name
  artifacts=$build_dir/fuzz-artifacts/$name
  log=$build_dir/fuzz-logs/$name.log
  mkdir -p "$work" "$artifacts" "$(dirname "$log")"
  dict=()
  if [ -f "$fuzz_dir/$name.dict" ]; then dict=(-dict="$fuzz_dir/$name.dict"); fi
  echo "== $name: ${seconds}s (log: $log)"
  status=0
  # The outer timeout is a backstop for a fuzzer that does not stop by itself.
  timeout $((seconds + 120)) "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -use_value_profile=1 -print_final_stats=1 -artifact_prefix="$artifacts/" "${dict[@]}" \
    "$work" "$fuzz_dir/corpus/$name" >"$log" 2>&1 || status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([^ ]*\).*/\1/p' <<<"$last")
  line=$(printf '%-15s execs %-10s cov %-6s ft %-7s corpus %s' "$name" "${execs:-?}" \
    "${cov:-?}" "${ft:-?}" "${corp:-?}")
  if [ "$status" -ne 0 ]; then
    line="$line  FAILED (exit $status; see $log and $artifacts/)"
    failed+=("$name")
  fi
  echo "$line"
  summary+=("$line")
done

echo "== fuzz summary (${seconds}s per target)"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz/run.sh: ${failed[*]} found a problem" >&2
  exit 1
fi
