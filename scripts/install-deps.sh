#!/usr/bin/env bash
# Installs what trainguard needs to build and test on Debian 12 (as root, or with sudo).
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libsqlite3-dev sqlite3 libpq-dev postgresql nlohmann-json3-dev libcli11-dev libxxhash-dev libre2-dev libcpp-httplib-dev libjemalloc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  pybind11-dev python3-dev python3-torch python3-numpy python3-pytest python3-pytest-xdist python3-prometheus-client
  python3-sklearn python3-pandas python3-fusepy
  procps iproute2 gdb util-linux file
  slurmctld slurmd slurm-client munge
  chromium chromium-driver python3-selenium
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  echo "installing: ${missing[*]}"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
