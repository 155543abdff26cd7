#!/usr/bin/env bash
# Builds fastreduce_torch here for the GPU machine (its Python 3.12 and torch
# 2.11.0+cu130, sm_90), so that a fresh machine needs no build there (about
# 200 s of its device time). The two libraries, _build_info.py and a hash of
# the sources they came from land in .device_build/; a `run` that carries it
# has scripts/gpu_check.sh use them while the hash matches the tree's.
#   bash scripts/device_build.sh
# The first run makes a Python 3.12 venv with that torch ($DEVICE_VENV) and
# builds the whole extension (about 13 minutes on two cores); later runs
# rebuild what changed in $DEVICE_BUILD_DIR.
set -euo pipefail
torch_version=${DEVICE_TORCH:-2.11.0}
python=${DEVICE_PYTHON:-$HOME/.pyenv/versions/3.12.1/bin/python}
venv=${DEVICE_VENV:-/tmp/device-venv}
tree=${DEVICE_BUILD_DIR:-/tmp/device-build}
cd "$(dirname "$0")/.."

if [[ ! -x $venv/bin/python ]]; then
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q "torch==$torch_version" numpy setuptools wheel ninja
fi
# The working tree as a run sends it: tracked and untracked, not ignored, files
# (the sources' folders emptied first, so that a file deleted here is gone there
# too; the copies keep their times, so the build redoes only what changed). A
# file whose content changed is touched there: edited while the last build ran,
# its time can be older than the object built from its former content.
mkdir -p "$tree"
(cd "$tree" && find csrc include cmake -type f -print0 2>/dev/null | xargs -0 -r sha256sum) > "$tree.sums" || true
rm -rf "$tree/csrc" "$tree/include" "$tree/cmake"
git ls-files -z --cached --others --exclude-standard |
  tar --null --ignore-failed-read -T - -cf - | tar -xf - -C "$tree"
(cd "$tree" && { sha256sum -c "$tree.sums" 2>/dev/null || true; } | sed -n 's/: FAILED$//p' | xargs -r touch)
(cd "$tree" && TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=${MAX_JOBS:-2} \
  "$venv/bin/python" -m pip install -q --no-build-isolation --no-deps -e .)
mkdir -p .device_build
cp "$tree"/fastreduce_torch/{_C.cpython-312-x86_64-linux-gnu.so,libfastreduce_ops.so,libfastreduce_cpu_avx512.so,_build_info.py} .device_build/
bash "$tree/scripts/source_hash.sh" > .device_build/sources.sha256  # the sources built, not the tree's now
echo "built for the GPU machine: $(du -sh .device_build | cut -f1) in .device_build (carry it)"
