#!/usr/bin/env bash
# Issue 8's table in one command (on a GPU machine, without the device tool's 10-minute limit): TransformerConv,
# GATConv and GATv2Conv on the locally dense graphs and the rest of the suite, in bf16 and in TF32, with PyG
# eager, torch.compile default, and gnn_io with its automatic pick, the CSR path, the block path, a hybrid, and
# reordering off; each (graph, layer) in its own process. The harness records each pick's reason, predicted and
# measured times in results.json ("path_decisions"). One table per precision, $OUT/block_sparse_{bf16,tf32}/
# (the harness's --merge labels a table with one dtype, so the two are not merged).
#   bash benchmarks/block_sparse_suite.sh [graphs] [layers]   (MODES=... to pick the modes, REPS=10)
# Session 18 ran it in pieces (benchmarks/pending_gpu.sh session18c..j; docs/benchmarks/session18/README.md).
set -uo pipefail
graphs=${1:-sbm-dense,batch-random,tu-batch,SNAP-facebook_combined,MUSAE-wikipedia-squirrel,rmat-arxiv,ca-AstroPh,MUSAE-github,road-luxembourg-osm,uniform-large}
layers=${2:-transformer,gat,gatv2}
modes=${MODES:-eager,inductor,gnn_io,gnn_io_csr,gnn_io_block,gnn_io_hybrid,gnn_io_reorder_off}
out=${OUT:-/tmp/gnn_io_out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 GNN_IO_DATA=${GNN_IO_DATA:-.bench_data}
for precision in bf16 tf32; do
  flag=$([[ $precision == bf16 ]] && echo "--dtype bfloat16" || echo "--tf32")
  python3 -m benchmarks.harness --graphs "$graphs" --layers "$layers" --modes "$modes" $flag --reps ${REPS:-10} \
    --isolate --out "$out/block_sparse_$precision" 2>"$out/block_sparse_${precision}_stderr.txt" | grep -v '^{'
done
