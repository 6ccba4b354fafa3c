#!/usr/bin/env bash
# Installs the Debian packages pdserve needs to build, test and run. Idempotent: when every
# package is already installed it only runs dpkg-query and exits.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config clang-format
  clang libclang-rt-14-dev
  libgtest-dev libgmock-dev
  nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libcpp-httplib-dev
  libfabric-dev libfabric-bin libhwloc-dev libopenblas-dev libpcre2-dev
  libssl-dev
  python3 python3-numpy
  curl iproute2
)

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
