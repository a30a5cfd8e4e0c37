#!/usr/bin/env bash
# The other half of pack.sh, on the GPU machine: points CTest's files at this
# folder and this checkout (they hold the paths of the machine that built
# them), and prints the export of LD_LIBRARY_PATH that finds this machine's
# LibTorch, NCCL and CUDA libraries (PYTHON's torch wheel).
#
# Usage: eval "$(bash tests/gpu/unpack.sh BUILD_DIR [PYTHON])"
set -euo pipefail
build=$(cd "${1:?usage: unpack.sh BUILD_DIR [PYTHON]}" && pwd)
python=${2:-python3}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
from=$(cat "$build/.packed_from")
source_from=$(dirname "$from")
python_from=$(cat "$build/.packed_python")
python_path=$(command -v "$python")
find "$build" -name CTestTestfile.cmake -print0 |
  xargs -0 sed -i -e "s#\"$python_from\"#\"$python_path\"#g" -e "s#$from#$build#g" -e "s#$source_from#$root#g"
site=$("$python" -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
libs=$site/torch/lib
for d in "$site"/nvidia/*/lib; do
  [[ -d $d ]] && libs=$libs:$d
done
echo "export LD_LIBRARY_PATH=$build:$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
