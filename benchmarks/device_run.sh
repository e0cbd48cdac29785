#!/usr/bin/env bash
# One call on the GPU machine: install, GPU tests, then the harness. Usage (from the repo root):
#   bash benchmarks/device_run.sh [none|tests|bench|all] [harness args...]
# With no argument (or none) it installs and prints the versions only: session 29 meant that and got the whole run
# (every GPU test and the default harness, 400 s of device time).
# Real graphs are read from $GNN_IO_DATA (a copy of shared/data's files carried to the machine).
set -uo pipefail
what=${1:-none}; shift || true
out=${OUT:-/tmp/gnn_io_out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 GNN_IO_DATA=${GNN_IO_DATA:-.bench_data}
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
# optional wheels carried to the machine (no package index there): nvmath-python and its CUDA bindings
if compgen -G ".wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-deps --no-index .wheels/*.whl >>"$out/install.log" 2>&1 || echo "wheels: install failed"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton, torch_geometric as g; print('torch', torch.__version__, 'triton', triton.__version__, 'pyg', g.__version__)"
status=0
if [[ $what == tests || $what == all ]]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$out/gpu_tests.txt" | tail -30
  status=${PIPESTATUS[0]}
fi
if [[ $what == bench || $what == all ]]; then
  python3 -m benchmarks.harness --out "$out/bench" "$@" 2>"$out/bench_stderr.txt" | tee "$out/bench_stdout.txt" | grep -v '^{' 
fi
exit $status
