#!/usr/bin/env bash
# One hash of the files a build of fastreduce_torch's libraries reads (the
# same on any machine with the same files): scripts/device_build.sh records
# it, scripts/gpu_check.sh compares.
set -euo pipefail
cd "$(dirname "$0")/.."
find csrc include cmake CMakeLists.txt setup.py pyproject.toml -type f -print0 | LC_ALL=C sort -z |
  xargs -0 sha256sum | sha256sum | cut -d' ' -f1
