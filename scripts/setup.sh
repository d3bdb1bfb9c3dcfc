#!/usr/bin/env bash
# Installs every Debian package tensordict-cpp needs. Idempotent: packages already present are skipped.
set -euo pipefail
PKGS=(
  build-essential cmake pkg-config
  libtorch-dev libopenblas0-pthread
  libcaf-dev libhdf5-dev libhiredis-dev redis-server
  libboost-dev libboost-test-dev
  libspdlog-dev rapidjson-dev libcli11-dev
  clang libclang-rt-14-dev
  libasan8 libubsan1 libtsan2
  python3-h5py hdf5-tools
  # distributed tensordicts (api/README.md): gloo's headers for c10d's ProcessGroupGloo, the Python rank of the
  # interop test (torch.distributed), and iproute2 for the tests' network namespaces
  libgloo-dev python3-torch iproute2
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "setup: all ${#PKGS[@]} packages already installed"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
