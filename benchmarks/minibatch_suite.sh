#!/usr/bin/env bash
# Mini-batch training on the GPU (benchmarks/minibatch.py), one process per layer, and minibatch.py runs each mode
# in a process of its own: a CUDA error of one mode (torch.compile's "misaligned address" on GATConv) poisons the
# process's context for every later mode, and in one process the mode timed last ran faster.
#   bash benchmarks/minibatch_suite.sh [graph] [layers] [extra args...]   (MODES=... to pick the modes,
#   LAYER_TIMEOUT=seconds per layer, default 270)
set -uo pipefail
graph=${1:-rmat-arxiv}
layers=${2:-gcn,sage_mean,sage_max,gin,gat,gatv2,transformer}
shift 2 2>/dev/null || shift $#
out=${OUT:-/tmp/gnn_io_out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 GNN_IO_DATA=${GNN_IO_DATA:-.bench_data}
for layer in ${layers//,/ }; do
  timeout ${LAYER_TIMEOUT:-270} python3 -m benchmarks.minibatch --graph "$graph" --layers "$layer" \
    --modes "${MODES:-eager,gnn_io,inductor,inductor_breaks}" "$@" >"$out/minibatch_${graph}_$layer.txt" 2>"$out/minibatch_${graph}_${layer}_stderr.txt"
  grep "^| $layer " "$out/minibatch_${graph}_$layer.txt" | cut -c1-300
done
