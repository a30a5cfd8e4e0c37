#!/usr/bin/env bash
# The defaults of ddp's FSDP options against PyTorch's own, read from the
# PyTorch that PYTHON imports: FullStateDictConfig() (rank0_only,
# offload_to_cpu) and FullyShardedDataParallel's constructor
# (sync_module_states, forward_prefetch). With PyTorch 1.13, whose FSDP
# does not import on Debian 12's Python 3.11, it checks that and says so:
# the comparison runs in the LibTorch 2.11 configuration.
# Usage: defaults_parity.sh <fsdp_defaults_main> <python3>
# Prints "fsdp_defaults_parity: N of N checks passed" at the end.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../testing/checks.sh"
main=$1
python=$2
version=$("$python" -c 'import torch; print(torch.__version__)')
if ! "$python" -c 'import torch.distributed.fsdp' >/dev/null 2>&1; then
  echo "PyTorch $version: its FSDP does not import here; the defaults are compared in the LibTorch 2.11 configuration"
  check "PyTorch $version's FSDP does not import on this Python (the reason)" \
    bash -c "! '$python' -c 'import torch.distributed.fsdp' >/dev/null 2>&1"
  checks_summary fsdp_defaults_parity
  exit $?
fi
theirs=$("$python" - <<'PY'
import inspect
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel
c = FullStateDictConfig()
print("FullStateDictConfig.rank0_only=%d" % int(c.rank0_only))
print("FullStateDictConfig.offload_to_cpu=%d" % int(c.offload_to_cpu))
params = inspect.signature(FullyShardedDataParallel.__init__).parameters
print("FullyShardedDataParallel.sync_module_states=%d" % int(params["sync_module_states"].default))
print("FullyShardedDataParallel.forward_prefetch=%d" % int(params["forward_prefetch"].default))
PY
)
ours=$("$main")
echo "PyTorch $version:"; echo "$theirs"
echo "ddp:"; echo "$ours"
while read -r line; do
  name=${line%%=*}
  check "$name: ddp's default is PyTorch's ($line)" bash -c "grep -qx '$line' <<< '$ours'"
done <<< "$theirs"
checks_summary fsdp_defaults_parity
