#!/usr/bin/env bash
# Installs the SASS tools scripts/kernel_stats.sh needs (cuobjdump, nvdisasm) when the CUDA
# toolkit here lacks them, from the nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm Python wheels
# into TANGRAM_SASS_TOOLS (default ~/.cache/tangram/sass-tools), with pip.
#   scripts/install_sass_tools.sh              install when missing (idempotent), print nothing
#   scripts/install_sass_tools.sh --print-bin  print the directory holding both tools, if any
# Exit 0 when both tools are available afterwards, 1 otherwise.
set -euo pipefail
dir=${TANGRAM_SASS_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/tangram/sass-tools}
find_bin() {
  local nvcc_dir
  nvcc_dir=$(dirname "$(command -v nvcc 2>/dev/null || echo /nonexistent/nvcc)")
  for d in "$nvcc_dir" "$dir/nvidia/cu13/bin" "$dir/nvidia/cuda_cuobjdump/bin"; do
    [ -x "$d/cuobjdump" ] && [ -x "$d/nvdisasm" ] && { echo "$d"; return 0; }
  done
  local c n
  c=$(command -v cuobjdump || true)
  n=$(command -v nvdisasm || true)
  [ -n "$c" ] && [ -n "$n" ] && { dirname "$c"; return 0; }
  return 1
}
if [ "${1:-}" = --print-bin ]; then
  find_bin
  exit
fi
find_bin >/dev/null && exit 0
echo "install_sass_tools: installing cuobjdump and nvdisasm (Python wheels) into $dir" >&2
python3 -m pip install --quiet --disable-pip-version-check --target "$dir" \
  nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
find_bin >/dev/null
