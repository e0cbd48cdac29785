#!/usr/bin/env bash
# The GPU measurements the code still owes, in four device calls of under 10 minutes each (from the repo root,
# with .bench_data/ and .wheels/ carried as in benchmarks/device_run.sh; results land in $OUT):
#   bash benchmarks/pending_gpu.sh checks   # kernel tests on CUDA (CI=1, strict), GAT one-pass A/B, profiles
#   bash benchmarks/pending_gpu.sh tables   # harness on RMAT 2^20: GATConv (both backwards), SAGEConv max
#   bash benchmarks/pending_gpu.sh tables2  # harness on RMAT 2^20: GATv2Conv, TransformerConv
#   bash benchmarks/pending_gpu.sh tables3  # harness on RMAT 2^20: linear layers on gathered rows (PNA & co.)
#   bash benchmarks/pending_gpu.sh session14  # bias folded into attention, skip map apart: tests, A/B, memory
#   bash benchmarks/pending_gpu.sh session15  # RMAT 2^17: step anatomy and CPU profiles of attention and SAGE max
#   bash benchmarks/pending_gpu.sh session15b # GPU tests with the fast kernel launch; launch cost per call
#   bash benchmarks/pending_gpu.sh session15c # RMAT 2^17: fast launch against Triton's JIT launch, A/B and anatomy
#   bash benchmarks/pending_gpu.sh session16  # owed GPU tests; sampled CPU profiles of RMAT 2^17 steps
#   bash benchmarks/pending_gpu.sh session16b # the attention kernel tests session16 cut off; GAT kernels, RMAT 2^20
#   bash benchmarks/pending_gpu.sh session17  # owed: plan changes on CUDA; mini-batch switch A/B
#   bash benchmarks/pending_gpu.sh session17b # mini-batch subgraphs above the switch's edge bound
#   bash benchmarks/pending_gpu.sh session17c # split backward launch per pass; mini-batch TransformerConv
#   bash benchmarks/pending_gpu.sh session17d # each split pass at its measured launch: GPU tests, A/B
#   bash benchmarks/pending_gpu.sh session17e # mini-batch, each mode in its own process
#   bash benchmarks/pending_gpu.sh session17f # mini-batch: Inductor through a custom backend, and our options
#   bash benchmarks/pending_gpu.sh session17g # block-sparse TransformerConv (bf16, block model) kernel by kernel
#   bash benchmarks/pending_gpu.sh session17h # mini-batch GATConv: fused attention where Inductor fails
#   bash benchmarks/pending_gpu.sh session17i # block-sparse attention kernels: warps and stages
#   bash benchmarks/pending_gpu.sh session18  # owed: block-sparse layers after the retune (harness, bf16)
#   bash benchmarks/pending_gpu.sh session18b # block-sparse dot kernels with every head in one program
#   bash benchmarks/pending_gpu.sh session18c # their GPU tests, chooser timing fwd+bwd; TransformerConv bf16 table
#   bash benchmarks/pending_gpu.sh session18d # issue 8's table in TF32 (TransformerConv) and GAT in bf16 with eager
#   bash benchmarks/pending_gpu.sh session18e # op-level CSR and block after the all-heads change (refit); GAT bf16
#   bash benchmarks/pending_gpu.sh session18f # issue 8's table in TF32: TransformerConv and GAT, eager to block
#   bash benchmarks/pending_gpu.sh session18g # the refit chooser in bf16 across dense, RMAT, road and real graphs
#   bash benchmarks/pending_gpu.sh session18h # second refit, order gain timed fwd+bwd; GATv2 on the dense graphs
#   bash benchmarks/pending_gpu.sh session18i # the second refit's picks, bf16 and TF32, with each decision printed
#   bash benchmarks/pending_gpu.sh session18j # after the fix of the order timing's backward (call 8 crashed there)
#   bash benchmarks/pending_gpu.sh session18k # the dot block kernels' launch for fp32 inputs (TF32), swept apart
#   bash benchmarks/pending_gpu.sh session18l # GAT block kernels with every head in one program: tests, bf16 sweep
#   bash benchmarks/pending_gpu.sh session21  # GAT score fold and GATv2 pair fusion: CUDA tests, A/B (RMAT 2^20)
#   bash benchmarks/pending_gpu.sh session21b # CUDA tests, the fold's profile, GATv2's harness line
#   bash benchmarks/pending_gpu.sh session21c # GATConv with edge features: harness, eager to gnn_io, fold on/off
#   bash benchmarks/pending_gpu.sh session21d # CUDA tests after the fold's auto default
#   bash benchmarks/pending_gpu.sh session21e # GATConv with 64 edge features: fold on and off
#   bash benchmarks/pending_gpu.sh session21f # GATv2's fused pair against apart at mid size (A/B)
#   bash benchmarks/pending_gpu.sh session21g # float32 GATConv under 1.5M edges: Inductor vs fused, by graph shape
#   bash benchmarks/pending_gpu.sh session21h # the GAT mid-size rule (1M edges and 100k rows) against torch.compile
#   bash benchmarks/pending_gpu.sh session21i # issue 8: GCN block SpMM against cuSPARSE, bf16, dense graphs
#   bash benchmarks/pending_gpu.sh session21j # issue 8: GATConv TF32 on the 20,000-graph batch
#   bash benchmarks/pending_gpu.sh session21k # SpMM chooser with the backward timed: CUDA tests, GCN bf16 (auto)
#   bash benchmarks/pending_gpu.sh session21l # half-precision tile gate: GCN bf16 auto; GATConv TF32 on the batch
#   bash benchmarks/pending_gpu.sh session21m # declined graphs with Inductor's own tiles against torch.compile
#   bash benchmarks/pending_gpu.sh session21n # GATConv at arxiv size on the fused path: harness, eager to gnn_io
#   bash benchmarks/pending_gpu.sh session21o # SpMM chooser on the block model (bf16, 10 timing reps), decisions
#   bash benchmarks/pending_gpu.sh session21p # GCN bf16 on the block model: the pick against each forced path (A/B)
#   bash benchmarks/pending_gpu.sh session21q # the final state's CUDA tests (SpMM paths, dense layers, attention)
#   bash benchmarks/pending_gpu.sh session22  # memory anatomy of GATv2Conv and TransformerConv (RMAT 2^20)
#   bash benchmarks/pending_gpu.sh session22b # D in its own op: attention CUDA tests, anatomy, RMAT 2^20 harness
#   bash benchmarks/pending_gpu.sh session22c # the CUDA tests 22b's timeout cut; TF32 reorder gain, block model
#   bash benchmarks/pending_gpu.sh session22d # op-level CSR and block dot attention (refit); reorder gain again
#   bash benchmarks/pending_gpu.sh session22e # the final state's attention CUDA tests, in two timed parts
#   bash benchmarks/pending_gpu.sh session22f # the refit dot cost model (TF32): picks against forced paths, order gain
#   bash benchmarks/pending_gpu.sh session22g # TF32 pick against forced CSR on the two sparse graphs, interleaved
#   bash benchmarks/pending_gpu.sh session22h # op-level CSR and block GAT attention on the four graphs (the model's fit)
#   bash benchmarks/pending_gpu.sh session22i # CUDA-graph tests with the two-op attention backward
#   bash benchmarks/pending_gpu.sh session23  # linear-map gradients by row blocks: CUDA tests, RMAT 2^20 memory
#   bash benchmarks/pending_gpu.sh session23b # each block freed before the next: memory; profiles of the blocks
#   bash benchmarks/pending_gpu.sh session23c # blocks released, bias by column_sum: memory; A/B against Inductor's GEMMs
#   bash benchmarks/pending_gpu.sh session23d # the blocks' two passes on two streams: CUDA tests, A/B
#   bash benchmarks/pending_gpu.sh session23e # each block's products beside the next block's passes: tests, A/B
#   bash benchmarks/pending_gpu.sh session23f # the final state's CUDA tests (CUDA graphs with blocks, split backward)
#   bash benchmarks/pending_gpu.sh session23g # issue 5's three layers on RMAT 2^20, final state
#   bash benchmarks/pending_gpu.sh session23h # kernel profiles of TransformerConv, products whole and by blocks
#   bash benchmarks/pending_gpu.sh session23i # cProfile of TransformerConv steps with the projected op (2^20)
#   bash benchmarks/pending_gpu.sh session23j # final default against Inductor's products: GATv2 2^20, arxiv size
#   bash benchmarks/pending_gpu.sh session23k # the attention layers' CUDA tests in the final state
#   bash benchmarks/pending_gpu.sh session23l # memory anatomy of GATv2Conv and TransformerConv with the blocks
#   bash benchmarks/pending_gpu.sh session23m # the blocks' bias gradient by GEMV: tests, memory, A/B
#   bash benchmarks/pending_gpu.sh session23n # the projected tests on CUDA after the review
#   bash benchmarks/pending_gpu.sh session24  # the 3xTF32 GEMM against cuBLAS float32 (launches, errors)
#   bash benchmarks/pending_gpu.sh session24b # more launches, the in-kernel split, a K-major weight
#   bash benchmarks/pending_gpu.sh session24c # the split GEMMs in the layers: CUDA tests, A/B against cuBLAS
#   bash benchmarks/pending_gpu.sh session24d # the src pass's value row once; arxiv A/B of the GEMMs; harness lines
#   bash benchmarks/pending_gpu.sh session24e # SAGEConv max's CPU at arxiv size; split GEMMs in the SpMM layers
#   bash benchmarks/pending_gpu.sh session24f # split GEMMs under CUDA graphs; GATConv and SAGEConv max lines
#   bash benchmarks/pending_gpu.sh session24g # the split GEMM's tests on CUDA after the fixture fix
#   bash benchmarks/pending_gpu.sh session24h # the weight split on the host (x3pre) against tf32x3
#   bash benchmarks/pending_gpu.sh session24i # final lines: arxiv size with and without CUDA graphs, RMAT 2^20
#   bash benchmarks/pending_gpu.sh session24j # GATConv's step profile with the split GEMMs
#   bash benchmarks/pending_gpu.sh session24k # the GEMM kernel through fast_launch: tests, arxiv A/B
#   bash benchmarks/pending_gpu.sh session25  # GAT score fold again, now that the GEMMs are our 3xTF32 kernel
#   bash benchmarks/pending_gpu.sh session25b # GATConv on RMAT 2^20 with and without CUDA graphs (lead time, gaps)
#   bash benchmarks/pending_gpu.sh session25c # GAT's scores in the GEMM epilogue: CUDA tests, A/B, profile
#   bash benchmarks/pending_gpu.sh session25d # the epilogue's products one by one (side product forms)
#   bash benchmarks/pending_gpu.sh session25e # the products again (side rows padded to 64); layer A/B
#   bash benchmarks/pending_gpu.sh session25f # lead and idle gaps of GATConv's step (2^20) and TransformerConv's (2^17)
#   bash benchmarks/pending_gpu.sh session25g # final: CUDA tests (epilogue, CUDA graphs), GATConv 2^20 harness, gaps
#   bash benchmarks/pending_gpu.sh session25h # the gaps of GATConv's step with the CPU ops inside them
#   bash benchmarks/pending_gpu.sh session25i # CPU time per call of the GEMM ops that start GATConv's step
#   bash benchmarks/pending_gpu.sh session25j # GATConv's dst score terms by atomics (one_pass) against the segment sum
#   bash benchmarks/pending_gpu.sh session25k # GATConv's step memory with and without the score epilogue
#   bash benchmarks/pending_gpu.sh session25l # what is alive at GATConv's peak, with and without the epilogue
#   bash benchmarks/pending_gpu.sh session26  # GAT's dst score terms from the forward's mass: CUDA tests, A/B
#   bash benchmarks/pending_gpu.sh session26b # the mass form's step memory (harness) and A/B on uniform and grid
#   bash benchmarks/pending_gpu.sh session25m # h no longer kept for linear_scores' backward: CUDA tests, step memory
#   bash benchmarks/pending_gpu.sh session27  # RMAT 2^17: CPU profiles with the autograd thread; steps with CUDA graphs
#   bash benchmarks/pending_gpu.sh session27b # tall float32 GEMMs: tile kernel, x3round (since removed), stationary
#   bash benchmarks/pending_gpu.sh session27c # stationary kernel: sweep, CUDA tests, A/B against x3tile (2^20, 2^17)
#   bash benchmarks/pending_gpu.sh session27d # stationary kernel by inner chunks: sweep, CUDA tests, A/B, four layers
#   bash benchmarks/pending_gpu.sh session27e # closing table: GATConv and SAGEConv max on RMAT 2^20, eager to gnn_io
#   bash benchmarks/pending_gpu.sh session27f # the bias loaded once per program: sweep, dense CUDA tests
#   bash benchmarks/pending_gpu.sh session27g # final code: A/B against x3tile, GATConv and SAGEConv max
#   bash benchmarks/pending_gpu.sh session27h # final code: GEMM CUDA tests, the 128 -> 512 map's launches
#   bash benchmarks/pending_gpu.sh session28  # GAT's GEMM epilogue terms on both tall kernels, CUDA tests, A/B, profile
#   bash benchmarks/pending_gpu.sh session28b # the weight gradient: the wide kernel's launches, and each kernel's MMA
#   bash benchmarks/pending_gpu.sh session28c # RMAT 2^17: TransformerConv's and GATv2Conv's kernel profiles
#   bash benchmarks/pending_gpu.sh session28d # (reverted) RMAT 2^17 under CUDA graphs: the stationary kernel from 2^31
#   bash benchmarks/pending_gpu.sh session28e # final code: GEMM and CUDA-graph tests, the closing table
#   bash benchmarks/pending_gpu.sh session28f # session28e's tests again, with the time they need
#   bash benchmarks/pending_gpu.sh session28g # the weight gradient's split launches and piece counts
#   bash benchmarks/pending_gpu.sh session28h # (reverted) bias gradients summed by the weight gradient's launch
#   bash benchmarks/pending_gpu.sh session30a # the std layers' compiled and eager errors against float64 on CUDA
#                                             # (share_one_pass[multi_aggregation] failed again in session 30's call 3)
#   bash benchmarks/pending_gpu.sh session30b # the one-process SAGEConv mean outlier on ca-AstroPh: the harness's order
#                                             # twice, then the interleaved A/B of the same rows
#   bash benchmarks/pending_gpu.sh session30c # host synchronisations inside warmed-up steps (benchmarks/sync_probe.py)
#   bash benchmarks/pending_gpu.sh session30d # owed: test_graph_shapes on CUDA (awkward graphs, default and dynamic=True)
#   bash benchmarks/pending_gpu.sh session31a # cuSPARSE's nnz > rows * cols refusal fixed: test_ops and test_graph_shapes
#                                             # on CUDA, and the multi-aggregation case under the float64 rule
#   bash benchmarks/pending_gpu.sh session31b # rows to zero listed once per graph: CUDA tests of the changed kernels,
#                                             # A/B against the scan (GATConv RMAT 2^20, three layers at RMAT 2^17)
#   bash benchmarks/pending_gpu.sh session31c # final code: the CUDA reduction tests 31b's timeout cut, GATConv's closing
#                                             # line on RMAT 2^20 (eager, torch.compile, gnn_io), the awkward graphs
#   bash benchmarks/pending_gpu.sh session32a # the empty-y-grid fix on CUDA: session31d's 4 failed cases, its test, and
#                                             # torch.compile default on the same graph (does it crash too?)
#   bash benchmarks/pending_gpu.sh session32b # the awkward graphs in bfloat16 and float16 on CUDA (new sweep)
#   bash benchmarks/pending_gpu.sh session32c # the same after the gradient-scale term and seeded inputs
#   bash benchmarks/pending_gpu.sh session32d # the awkward graphs under GNN_IO_CUDAGRAPHS=1 (new sweep)
#   bash benchmarks/pending_gpu.sh session41f # the last review's change: attention-path and reordering CUDA tests
#   bash benchmarks/pending_gpu.sh session41e # session 41's final code: projected/packed-gradient and CUDA-graph CUDA tests
#   bash benchmarks/pending_gpu.sh session41d # the uniform graph's order under session 41's rule (bf16, TF32), A/B
#   bash benchmarks/pending_gpu.sh session41c # session 41's chooser changes: path/reorder CUDA tests; tu-batch GAT pick A/B; block model's order
#   bash benchmarks/pending_gpu.sh session41a # session41 on one GPU (kind nvidia-h200), part 1: attention/block/reorder/SpMM CUDA tests; tu-batch GAT hybrid A/B
#   bash benchmarks/pending_gpu.sh session41b # part 2: projected/packed/CUDA-graph tests; tu-batch GAT block A/B; uniform reordering A/B
#   bash benchmarks/pending_gpu.sh session41  # session 40's four-lane form (x4; run as session41a and session41b on one GPU in session 41): bf16 tu-batch GATConv pick vs hybrid/block; final CUDA tests; uniform reordering A/B
#   bash benchmarks/pending_gpu.sh session40e # session 40's changes checked (x4): tu-batch picks, whole gradients, projected-gradient CUDA tests
#   bash benchmarks/pending_gpu.sh session40d # tu-batch TF32: the CSR backward's blocks and projection (A/B, x4); bf16 TransformerConv's threshold checked
#   bash benchmarks/pending_gpu.sh session40c # session40b's answers further (x4): tu-batch TF32 profile CSR vs block; bf16 TransformerConv vs Inductor, sparse graphs
#   bash benchmarks/pending_gpu.sh session40b # session40's open questions interleaved (x4): TF32 tu-batch pick vs block; bf16 SNAP/squirrel vs Inductor and eager
#   bash benchmarks/pending_gpu.sh session40  # session39d's rows on 4 GPUs at once (kind nvidia-h200-x4): TF32 dense real graphs, squirrel, uniform; block CUDA tests
#   bash benchmarks/pending_gpu.sh session39d # owed by session 39: issue 8's rows never run at the layer level (TU batch, SNAP facebook, squirrel; uniform), PART=1|2|3|4
#   bash benchmarks/pending_gpu.sh session39  # issue 8 after the TF32 GATConv decline: CUDA tests of the paths and block kernels; A/B of the pick's position
#   bash benchmarks/pending_gpu.sh session39b # issue 8's GCN gap: block SpMM against cuSPARSE kernel by kernel (profiler), bf16 block model, TF32 batched graphs
#   bash benchmarks/pending_gpu.sh session39c # the block SpMM's outputs no longer zero-filled: its CUDA tests, GCN on the dense graphs (bf16 block model, TF32 batched)
#   bash benchmarks/pending_gpu.sh session38a # issue 8 on the H200: the dot attention op probed for the cost model's refit; bf16 sparse rows
#   bash benchmarks/pending_gpu.sh session38c # owed by session 38: the suite rows it lost (TF32 GAT and GATv2, bf16 GAT on road, dense hybrid), PART=1|2|3
#   bash benchmarks/pending_gpu.sh session38b # issue 8's suite rows on the sparse graphs, after the H200 refit (PREC=bf16|tf32, LAYERS=...)
#   bash benchmarks/pending_gpu.sh session37d # issue 8's GCN row: block-sparse SpMM against cuSPARSE on the dense graphs, bf16 and TF32
#   bash benchmarks/pending_gpu.sh session37c # issue 8's dense-graph rows, all three attention layers (PREC=bf16 or tf32)
#   bash benchmarks/pending_gpu.sh session37b # the block kernels store into the packed gradient: CUDA tests, profiles, TF32 layer
#   bash benchmarks/pending_gpu.sh session37  # issue 8: where the TF32 TransformerConv step goes, CSR against block (profiler)
#   bash benchmarks/pending_gpu.sh session36f # the same in bf16
#   bash benchmarks/pending_gpu.sh session36e # issue 8's unmet row now: TF32 TransformerConv, CSR against block, dense graphs
#   bash benchmarks/pending_gpu.sh session36d # issue 8's kernel tests on CUDA: block-sparse kernels, path choice, reordering
#   bash benchmarks/pending_gpu.sh session36c # issues 4 and 5's layers on the grid and uniform graphs of 2^20 nodes
#   bash benchmarks/pending_gpu.sh session36b # RMAT 2^17: kernel tables of TransformerConv and SAGEConv max steps (profiler)
#   bash benchmarks/pending_gpu.sh session36  # CUDA graphs without GNN_IO_FORCE (tests); float32 TransformerConv's threshold (A/B)
#   bash benchmarks/pending_gpu.sh session35c # under CUDA graphs, the cost model's declined graphs fused instead (A/B)
#   bash benchmarks/pending_gpu.sh session35t # final state: issues 4 and 5's layers on RMAT 2^20, eager / compile / gnn_io
#   bash benchmarks/pending_gpu.sh session35u # the same at RMAT 2^17 (arxiv size), with CUDA graphs too
#   bash benchmarks/pending_gpu.sh session35b # the rows kernel by default at scale: CUDA tests of the reduction kernels
#   bash benchmarks/pending_gpu.sh session35  # owed: session34k, then GATv2Conv on ca-AstroPh against torch.compile (A/B)
#   bash benchmarks/pending_gpu.sh session34k # owed: the rows kernel's step A/B with its measured launch
#   bash benchmarks/pending_gpu.sh session34j # the rows kernel for the light items: tests, probe, A/B at RMAT 2^20
#   bash benchmarks/pending_gpu.sh session34i # the forward's bandwidth share after the light launch; more launch candidates
#   bash benchmarks/pending_gpu.sh session34h # the suite rows where gnn_io trailed, interleaved (TransformerConv, GATConv)
#   bash benchmarks/pending_gpu.sh session34g # the light launch's rule at RMAT 2^17, with and without CUDA graphs (A/B)
#   bash benchmarks/pending_gpu.sh session34f # the reduction kernels' light items launched apart: CUDA tests, A/B
#   bash benchmarks/pending_gpu.sh session34d # issue 4's bandwidth floors; the suite against torch.compile (SAGEConv max, GATConv)
#   bash benchmarks/pending_gpu.sh session34e # the suite against torch.compile (GATv2Conv, TransformerConv)
#   bash benchmarks/pending_gpu.sh session34c # the same by py-spy (34b's in-process sampler broke CUDA graph trees)
#   bash benchmarks/pending_gpu.sh session34b # where a CUDA-graph step's CPU time goes (GCNConv, SAGEConv max)
#   bash benchmarks/pending_gpu.sh session34  # GINConv against torch.compile at RMAT 2^17 (A/B); GCNConv with CUDA graphs
#   bash benchmarks/pending_gpu.sh session33j # owed: backward tiles A/B (RMAT 2^20); GAT/GCN/GIN under CUDA graphs
#   bash benchmarks/pending_gpu.sh session33i # owed: CUDA-graph tests with the report's "recorded whole" assertion
#   bash benchmarks/pending_gpu.sh session33h # final: RMAT 2^17 table with the tall kernels' CUDA-graph threshold
#   bash benchmarks/pending_gpu.sh session33g # the tall 3xTF32 GEMMs at RMAT 2^17 under CUDA graphs (A/B); 33e's table
#   bash benchmarks/pending_gpu.sh session33f # gnn_io at RMAT 2^17: session 28's and 32's trees against this one
#   bash benchmarks/pending_gpu.sh session33d # RMAT 2^17 with and without CUDA graphs, ours and Inductor's; CG sweep
#   bash benchmarks/pending_gpu.sh session33e # the same table for GATv2Conv, GCNConv, GINConv
#   bash benchmarks/pending_gpu.sh session33c # after the fixes: partitions, step anatomy, the CUDA-graph tests
#   bash benchmarks/pending_gpu.sh session33b # Inductor's reasons for skipping CUDA graphs at RMAT 2^17, by layer
#   bash benchmarks/pending_gpu.sh session33  # CUDA-graph steps at RMAT 2^17: CPU per call, GPU busy time, gaps
#   bash benchmarks/pending_gpu.sh session32e # after the mask indexing moved to the plan: that sweep, the edge-input
#                                             # cases on CUDA, host waits and step times with edge inputs needing grad
#                                             # (owed: STEPS=0 ... session32e, whose CUDA-graph sweep call 9's
#                                             # filter cut before gat_edge_attr and gcn_weight)
#   bash benchmarks/pending_gpu.sh session31d # owed: test_graph_shapes's bipartite and edge-input cases on CUDA (new),
#                                             # CUDA-graph tests after the listed zero rows
#   bash benchmarks/pending_gpu.sh session29a # owed: session29's tests in two calls (cold, the whole list needs ~600 s)
#   bash benchmarks/pending_gpu.sh session29b # owed: the second half
#   bash benchmarks/pending_gpu.sh session29  # every CUDA test outside tests/gpu (kernels and top-level files)
#   bash benchmarks/pending_gpu.sh session28i # owed: RMAT 2^17, CPU stacks of SAGEConv max and TransformerConv by py-spy
#                                             # (carry .bench_data and .wheels, with the py-spy wheel in .wheels/)
#   bash benchmarks/pending_gpu.sh session22j # after the review: path tests and the TF32 picks on the dense graphs
#   bash benchmarks/pending_gpu.sh session19  # owed by session 18: block GAT/GATv2 tests on CUDA (call 11 cut them),
#                                             # GAT's launch combination, TF32 and peaks after the last changes
#
# Owed since session 13 (no device time was left there); all run in session 14, docs/benchmarks/session14/README.md:
# - gnn_io::addmm_into (gnn_inductor/gemm_accumulate.py) in place of aten.addmm_: checked on CPU with CI=1 only;
# - the one-pass GAT backward (GNN_IO_ATTENTION_BACKWARD=one_pass, harness mode gnn_io_one_pass): opt-in until
#   the A/B below shows it ahead on the large graphs (then make it the default for the GAT family);
# - the split backward's row gradients without a memset (default): the profile's aten::zeros rows should drop
#   by one 512 MiB fill per step (GAT; two for GATv2, three for TransformerConv);
# - D computed in the split backward's dst pass (harness mode gnn_io_delta_kernel kept the kernel): A/B below on
#   GATv2Conv and TransformerConv, a tie; session 22 moved D into gnn_io::attention_delta and removed the mode;
# - GEMMs of gathered rows moved before the gather (gnn_inductor/gather_linear.py; harness mode
#   gnn_io_no_gather_linear turns it off): PNAConv, GeneralConv, EdgeConv;
# - session 12's attention hub slots and forward without a memset, and gather_scatter_backward_mm.
#
# Owed since session 15 (no device time was left): host-side cdiv / next_power_of_2 in the launch code
# (kernels/launch.py; CPU only: python -m benchmarks.python_overhead 2.957 -> 2.902 ms per step), and
# GNN_IO_ATTENTION_BACKWARD=one_pass_segment (GAT's dst score-term gradients per edge, summed by the SpMM):
# rerun the GPU kernel tests with them and A/B the segment variant (session16).
set -uo pipefail
what=${1:-checks}
out=${OUT:-/tmp/gnn_io_out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 GNN_IO_DATA=${GNN_IO_DATA:-.bench_data}
if [[ -z ${GNN_IO_PENDING_NESTED:-} ]]; then  # an entry that runs others (session38c) sets up once
  bash benchmarks/device_run.sh none >"$out/setup.txt" 2>&1; cat "$out/setup.txt"
fi
export GNN_IO_PENDING_NESTED=1

kernel_tests() {  # kernel_tests SECONDS FILE...: the files' CUDA tests (CI=1, strict), the summary kept
  local seconds=$1; shift
  CI=1 GNN_IO_STRICT=1 timeout "$seconds" python3 -m pytest -q -p no:cacheprovider "$@" -k "not interpreter" 2>&1 \
    | tee "$out/gpu_tests.txt" | tail -2
}
block_sweep() {  # block_sweep SECONDS NAME PROBE_ARGS...: block-sparse launches swept on the block model (RCM)
  local seconds=$1 name=$2; shift 2
  timeout "$seconds" python3 -m benchmarks.probe --parts block_launch --graphs sbm-dense --attention-graphs sbm-dense \
    "$@" --out "$out/$name" >"$out/$name.txt" 2>&1
  grep "^| block_launch" "$out/$name.txt" | cut -c1-200
}
harness_table() {  # harness_table SECONDS NAME HARNESS_ARGS...: each (graph, layer) in its own process, table out
  local seconds=$1 name=$2; shift 2
  timeout "$seconds" python3 -m benchmarks.harness "$@" --isolate --out "$out/$name" 2>"$out/${name}_stderr.txt" \
    | tee "$out/${name}_stdout.txt" | grep -v '^{'
}
last_decisions() {  # last_decisions KEY RESULTS_JSON...: each gnn_io record's last path decision, by KEY (graph, layer)
  python3 - "$@" <<'PY'
import json, sys
key = sys.argv[1]
for path in sys.argv[2:]:
    for r in json.load(open(path))["results"]:
        if r["mode"] == "gnn_io":
            for d in (r.get("path_decisions", []) or [])[-1:]:
                print(r[key], {k: d.get(k) for k in ("path", "order", "predicted_ms", "measured_forward_ms")})
PY
}

four_gpus() {  # four_gpus ENTRY: exit unless the machine has 4 GPUs (kind nvidia-h200-x4)
  local gpus; gpus=$(nvidia-smi -L | wc -l)
  (( gpus >= 4 )) || { echo "$1: needs 4 GPUs (kind nvidia-h200-x4), found $gpus" >&2; exit 2; }
}
lane() {  # lane N COMMANDS...: on GPU N and cores 16N..16N+15, Inductor's compile threads capped, log in lane$N.log
  local n=$1; shift
  CUDA_VISIBLE_DEVICES=$n TORCHINDUCTOR_COMPILE_THREADS=8 taskset -c $((16 * n))-$((16 * n + 15)) bash -c "$*" \
    >"$out/lane$n.log" 2>&1
}
show_lanes() {  # show_lanes: each lane's log, the device lines left out
  for n in 0 1 2 3; do echo "== lane $n"; grep -v "^NVIDIA\|^torch " "$out/lane$n.log" | cut -c1-260; done
}

if [[ $what == checks ]]; then
  CI=1 GNN_IO_STRICT=1 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_triton.py \
    tests/test_gemm_accumulate.py tests/test_direct_ops.py tests/gpu/test_gather_scatter_cuda.py 2>&1 \
    | tee "$out/kernel_tests.txt" | tail -6
  python3 -m benchmarks.ab --layers gat --graphs rmat-large,uniform-large,grid-large \
    --modes gnn_io,gnn_io_one_pass --rounds 30 2>"$out/ab_stderr.txt" | tee "$out/ab_gat_one_pass.txt" | tail -8
  # (session 14 A/B'd gnn_io_delta_kernel against gnn_io here: a tie; the mode is gone since session 22)
  for mode in gnn_io gnn_io_one_pass; do
    python3 -m benchmarks.profile_layer --layer gat --graph rmat-large --mode $mode --rows 20 \
      >"$out/profile_gat_$mode.txt" 2>&1
    grep -E "^== |attention|zero|fill|Self CUDA time total" "$out/profile_gat_$mode.txt" | head -12
  done
elif [[ $what == tables ]]; then
  python3 -m benchmarks.harness --graphs rmat-large --layers gat --modes eager,inductor,gnn_io,gnn_io_one_pass \
    --reps 10 --out "$out/gat" 2>"$out/gat_stderr.txt" | tee "$out/gat_stdout.txt" | grep -v '^{'
  python3 -m benchmarks.harness --graphs rmat-large --layers sage_max --modes eager,inductor,gnn_io \
    --reps 10 --out "$out/sage_max" 2>"$out/sage_max_stderr.txt" | tee "$out/sage_max_stdout.txt" | grep -v '^{'
elif [[ $what == tables2 ]]; then
  python3 -m benchmarks.harness --graphs rmat-large --layers gatv2,transformer --modes eager,inductor,gnn_io \
    --reps 10 --out "$out/attention" 2>"$out/attention_stderr.txt" | tee "$out/attention_stdout.txt" | grep -v '^{'
elif [[ $what == tables3 ]]; then
  python3 -m benchmarks.harness --graphs rmat-large --layers pna,general_max,edge_conv \
    --modes eager,inductor,gnn_io,gnn_io_no_gather_linear --reps 5 --out "$out/gather_linear" \
    2>"$out/gather_linear_stderr.txt" | tee "$out/gather_linear_stdout.txt" | grep -v '^{'
elif [[ $what == session14 ]]; then
  # the attention bias folded into the op (GNN_IO_ATTENTION_BIAS) and TransformerConv's skip map kept out of the
  # fused GEMM (GNN_IO_FUSE_LINEARS=all is the old grouping): kernel tests, then time and memory A/B
  CI=1 GNN_IO_STRICT=1 timeout 170 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_triton.py \
    -k "bias or fused_matches" 2>&1 | tee "$out/kernel_tests.txt" | tail -3
  timeout 200 python3 -m benchmarks.harness --graphs rmat-large --layers gat,gatv2 --modes eager,gnn_io,gnn_io_no_bias_fold \
    --reps 5 --out "$out/bias" 2>"$out/bias_stderr.txt" | grep -v '^{' | tail -5
  timeout 170 python3 -m benchmarks.harness --graphs rmat-large --layers transformer \
    --modes eager,inductor,gnn_io,gnn_io_fuse_all --reps 5 --out "$out/skip" 2>"$out/skip_stderr.txt" | grep -v '^{' | tail -3
  timeout 80 python3 -m benchmarks.memory_anatomy --layers transformer --graph rmat-large --modes gnn_io --rows 16 \
    2>"$out/anatomy_stderr.txt" | tee "$out/anatomy.txt"
elif [[ $what == session14b ]]; then
  # the bias added in the forward kernels' store (epilogue), then interleaved A/B of both memory changes
  CI=1 GNN_IO_STRICT=1 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_triton.py \
    -k "bias or without_a_memset" 2>&1 | tee "$out/kernel_tests.txt" | tail -2
  timeout 200 python3 -m benchmarks.ab --layers gat,gatv2 --graphs rmat-large --modes gnn_io_no_bias_fold,gnn_io \
    --rounds 20 2>"$out/ab_stderr.txt" | tee "$out/ab_bias.txt" | tail -3
  timeout 120 python3 -m benchmarks.ab --layers transformer --graphs rmat-large --modes gnn_io_fuse_all,gnn_io \
    --rounds 20 2>>"$out/ab_stderr.txt" | tee "$out/ab_skip.txt" | tail -2
elif [[ $what == session15 ]]; then
  # mid-size graphs (RMAT 2^17, 1.1M edges): where the CPU time of a step goes, per layer (issues 4 and 5)
  timeout 300 python3 -m benchmarks.step_anatomy --layers transformer,gatv2,sage_max --graph rmat-arxiv \
    --modes inductor,gnn_io --steps 30 >"$out/anatomy.txt" 2>"$out/anatomy_stderr.txt"; tail -9 "$out/anatomy.txt"
  for layer in transformer sage_max; do
    timeout 90 python3 -m benchmarks.cpu_profile --layer $layer --graph rmat-arxiv --mode gnn_io --rows 45 \
      >"$out/cpu_profile_$layer.txt" 2>&1; grep "^==" "$out/cpu_profile_$layer.txt"
  done
  timeout 90 python3 -m benchmarks.profile_layer --layer transformer --graph rmat-arxiv --mode gnn_io --rows 30 \
    >"$out/profile_transformer.txt" 2>&1
elif [[ $what == session15b ]]; then
  # kernels launched through kernels/launch.py's fast path: every GPU test, then the launch cost alone
  CI=1 GNN_IO_STRICT=1 timeout 400 python3 -m pytest -q -p no:cacheprovider tests/gpu tests/kernels/test_attention_triton.py \
    -k "not interpreter" 2>&1 | tee "$out/gpu_tests.txt" | tail -4
  timeout 90 python3 -m benchmarks.op_overhead >"$out/op_overhead.txt" 2>&1; tail -14 "$out/op_overhead.txt"
elif [[ $what == session15c ]]; then
  # the fast launch against Triton's JIT launch on mid-size graphs: interleaved A/B, then the step anatomy
  timeout 240 python3 -m benchmarks.ab --layers transformer,gatv2,sage_max --graphs rmat-arxiv \
    --modes gnn_io_jit_launch,gnn_io --rounds 20 2>"$out/ab_stderr.txt" | tee "$out/ab_launch.txt" | tail -5
  timeout 300 python3 -m benchmarks.step_anatomy --layers transformer,gatv2,sage_max --graph rmat-arxiv \
    --modes inductor,gnn_io --steps 30 >"$out/anatomy.txt" 2>"$out/anatomy_stderr.txt"; tail -8 "$out/anatomy.txt"
elif [[ $what == session15d ]]; then
  # what the attention ops' Python calls, per call (cProfile callees), RMAT 2^17
  timeout 120 python3 -m benchmarks.cpu_profile --layer transformer --graph rmat-arxiv --mode gnn_io --rows 60 \
    --steps 50 --callees "attention_triton.py:.*\(forward\),attention_triton.py:.*\(backward\),attention.py:.*\(_forward\),attention.py:.*\(attention_backward\),attention.py:.*\(attention_forward\),_split_pass,_grad_buffers" \
    >"$out/cpu_profile_transformer.txt" 2>&1; grep "^==" "$out/cpu_profile_transformer.txt"
  timeout 120 python3 -m benchmarks.cpu_profile --layer sage_max --graph rmat-arxiv --mode gnn_io --rows 60 --steps 50 \
    --callees "gather_scatter.py:.*\(gather_scatter_forward\),gather_scatter.py:.*\(gather_scatter_backward_mm\),gather_scatter_triton.py:.*\(forward\)" \
    >"$out/cpu_profile_sage_max.txt" 2>&1; grep "^==" "$out/cpu_profile_sage_max.txt"
elif [[ $what == session15e ]]; then
  # tensors passed to the launcher as addresses: the kernel tests that launch through it, then the A/B again
  CI=1 GNN_IO_STRICT=1 timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_attention_triton.py \
    tests/gpu/test_gather_scatter_cuda.py tests/kernels/test_rng.py -k "not interpreter" 2>&1 | tee "$out/gpu_tests.txt" | tail -2
  timeout 200 python3 -m benchmarks.ab --layers transformer,gatv2,sage_max --graphs rmat-arxiv \
    --modes gnn_io_jit_launch,gnn_io --rounds 20 2>"$out/ab_stderr.txt" | tee "$out/ab_launch.txt" | tail -5
elif [[ $what == session16 ]]; then
  # owed by session 15: the kernel tests with the host-side cdiv / next_power_of_2 and the segment variant of the
  # one-pass GAT backward, its A/B against the default split backward, then where the CPU time of an arxiv-size
  # step goes by stack sampling (benchmarks/stack_sampler.py: no per-call cost, unlike cProfile)
  CI=1 GNN_IO_STRICT=1 timeout 400 python3 -m pytest -q -p no:cacheprovider tests/gpu tests/kernels/test_attention_triton.py \
    -k "not interpreter" 2>&1 | tee "$out/gpu_tests.txt" | tail -2
  timeout 150 python3 -m benchmarks.ab --layers gat --graphs rmat-large,rmat-arxiv --modes gnn_io,gnn_io_one_pass_segment \
    --rounds 20 2>"$out/ab_stderr.txt" | tee "$out/ab_segment.txt" | tail -3
  for layer in transformer gatv2 sage_max; do
    timeout 90 python3 -m benchmarks.cpu_profile --layer $layer --graph rmat-arxiv --mode gnn_io --rows 60 --sampler \
      >"$out/sampled_$layer.txt" 2>&1; grep "^==" "$out/sampled_$layer.txt"
  done
elif [[ $what == session16b ]]; then
  # the attention kernel tests cut off by session16's 400 s limit; GAT on RMAT 2^20, kernel by kernel, with the
  # default split backward and with the segment variant (equal in session16's A/B: where does each pass go?)
  CI=1 GNN_IO_STRICT=1 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_triton.py \
    -k "not interpreter" 2>&1 | tee "$out/gpu_tests_attention.txt" | tail -2
  for mode in gnn_io gnn_io_one_pass_segment; do
    timeout 120 python3 -m benchmarks.profile_layer --layer gat --graph rmat-large --mode $mode --rows 22 \
      >"$out/profile_gat_$mode.txt" 2>&1; grep -A 26 "^==" "$out/profile_gat_$mode.txt" | cut -c1-60,100-175 | head -30
  done
elif [[ $what == session17 ]]; then
  # owed by session 16: the plan changes on CUDA (dedupe, one-sync index checks, searchsorted offsets, one-sync
  # work items) through the GPU tests, then mini-batch training with the switch to torch.compile's code for small
  # churning graphs against the rewrites kept (gnn_io_churn_off), one process per layer
  CI=1 GNN_IO_STRICT=1 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu -k "not interpreter" 2>&1 \
    | tee "$out/gpu_tests.txt" | tail -2
  MODES=eager,gnn_io,gnn_io_churn_off,inductor timeout 260 bash benchmarks/minibatch_suite.sh rmat-arxiv \
    gcn,sage_max,transformer --steps 20
elif [[ $what == session17b ]]; then
  # subgraphs above the switch's 1M-edge bound (rewrites kept, plan rebuilt per step): where is the crossover?
  MODES=gnn_io,inductor timeout 150 bash benchmarks/minibatch_suite.sh rmat-large gcn --batch 65536 --fanout 25,10 \
    --pool 10 --steps 10
elif [[ $what == session17c ]]; then
  # the split backward's passes launched apart (GATConv on RMAT 2^20: the src pass is 4.1 of the backward's
  # 5.7 ms); mini-batch TransformerConv, which kept gnn_io 20% behind torch.compile: why (near misses), and
  # Inductor's 3-D tiles (GNN_IO_INDUCTOR_MAX_TILES=3) in the graph it runs whole
  timeout 260 python3 -m benchmarks.probe --parts split_sweep --graphs rmat-large --attention-graphs rmat-large \
    --families gat,gatv2,dot --out "$out/split_sweep" >"$out/split_sweep.txt" 2>&1
  grep "^| split_sweep" "$out/split_sweep.txt" | cut -c1-160
  MODES=gnn_io,gnn_io_tiles3,inductor timeout 150 bash benchmarks/minibatch_suite.sh rmat-arxiv transformer --steps 20
  grep "^== {" "$out/minibatch_rmat-arxiv_transformer.txt" | cut -c1-600
elif [[ $what == session17d ]]; then
  # each split backward pass at its own launch (session 17's sweep): the kernel tests that run the split backward,
  # then whole layers against session 9's launch in both passes, interleaved
  CI=1 GNN_IO_STRICT=1 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_triton.py \
    -k "not interpreter and (split or one_pass or fused_matches or bias)" 2>&1 | tee "$out/gpu_tests.txt" | tail -2
  timeout 330 python3 -m benchmarks.ab --layers gat,gatv2,transformer --graphs rmat-large,rmat-arxiv \
    --modes gnn_io_split_s9,gnn_io --rounds 10 2>"$out/ab_stderr.txt" | tee "$out/ab_split_launch.txt" | tail -8
elif [[ $what == session17e ]]; then
  # mini-batch training with each mode in its own process (benchmarks/minibatch.py now does that: in one process
  # the mode timed last ran faster), then subgraphs above the switch's edge bound
  MODES=eager,gnn_io,inductor timeout 400 bash benchmarks/minibatch_suite.sh rmat-arxiv gcn,sage_max,transformer \
    --steps 20
  MODES=gnn_io,inductor timeout 170 bash benchmarks/minibatch_suite.sh rmat-large gcn --batch 65536 --fanout 25,10 \
    --pool 10 --steps 10
elif [[ $what == session17f ]]; then
  # mini-batch: gnn_io behind torch.compile where it runs torch.compile's own code (SAGEConv max switched,
  # TransformerConv declined). Inductor behind a custom backend callable (compile_fx), and through the backend's
  # own Inductor options (inner_compile), each mode in its own process
  MODES=inductor,compile_fx,inner_compile,gnn_io timeout 560 bash benchmarks/minibatch_suite.sh rmat-arxiv \
    sage_max,transformer --steps 20
elif [[ $what == session17g ]]; then
  # issue 8: the block-sparse path's TransformerConv layer kernel by kernel (bf16, the block model), against the
  # CSR path's, to see where the block path's time goes
  for mode in gnn_io_block gnn_io_csr; do
    timeout 150 python3 -m benchmarks.profile_layer --layer transformer --graph sbm-dense --mode $mode --dtype bfloat16 \
      --rows 24 >"$out/profile_transformer_$mode.txt" 2>&1
    grep -A 30 "^==" "$out/profile_transformer_$mode.txt" | cut -c1-62,100-180 | head -32
  done
elif [[ $what == session17h ]]; then
  # mini-batch GATConv: torch.compile fails there (an unbacked-size assertion), and gnn_io, which leaves small
  # float32 attention to Inductor, ran its graph op by op (1.5x eager); now the fused attention runs instead
  MODES=eager,gnn_io,inductor_breaks timeout 300 bash benchmarks/minibatch_suite.sh rmat-arxiv gat --steps 20
  grep -h "^== {" "$out/minibatch_rmat-arxiv_gat.txt" | cut -c1-400
elif [[ $what == session17i ]]; then
  # issue 8: the block-sparse attention kernels ran at Triton's default launch (4 warps, 3 stages) on 16 x 32 tiles;
  # warps and stages per kernel, bf16, the block model in RCM order
  block_sweep 330 block_launch --families ${FAMILIES:-dot,gat,gatv2}
elif [[ $what == session18 ]]; then
  # owed by session 17 (no device time left): the block-sparse and attention kernel tests on CUDA after the block
  # kernels' launch retune, operand and D changes; then whole layers on the locally dense graphs, block and CSR
  # forced and the chooser's pick, bf16, each mode in its own process (issue 8's harness table)
  kernel_tests 240 tests/kernels/test_block_sparse.py tests/kernels/test_block_sparse_gat.py \
    tests/kernels/test_attention_paths.py tests/kernels/test_attention_triton.py
  harness_table 330 bf16 --graphs sbm-dense,batch-random --layers transformer,gat \
    --modes inductor,gnn_io,gnn_io_csr,gnn_io_block --dtype bfloat16 --reps 10
elif [[ $what == session18b ]]; then
  # issue 8: the dot kernels with all heads per program (batched [H, 16, 16] dots, tile columns and edge ids read
  # once per tile): their CUDA tests, then warps and stages swept with and without, bf16, block model in RCM order
  kernel_tests 150 tests/kernels/test_block_sparse.py
  block_sweep 400 block_launch --families dot
elif [[ $what == session18c ]]; then
  # all-heads dot kernels, uninitialised buffers where every row is written, the chooser's fwd+bwd check: the
  # block-sparse and path tests on CUDA, then issue 8's TransformerConv table in bf16 with PyG eager for the error
  kernel_tests 200 tests/kernels/test_block_sparse.py tests/kernels/test_block_sparse_gat.py \
    tests/kernels/test_attention_paths.py
  harness_table 380 bf16 --graphs sbm-dense,batch-random --layers transformer \
    --modes eager,inductor,gnn_io,gnn_io_csr,gnn_io_block --dtype bfloat16 --reps 10 | tail -4
elif [[ $what == session18d ]]; then
  harness_table 330 tf32 --graphs sbm-dense,batch-random --layers transformer \
    --modes eager,inductor,gnn_io,gnn_io_csr,gnn_io_block --tf32 --reps 10 | tail -4
  harness_table 250 gat_bf16 --graphs sbm-dense,batch-random --layers gat \
    --modes eager,gnn_io,gnn_io_csr,gnn_io_block --dtype bfloat16 --reps 10 | tail -4
elif [[ $what == session18e ]]; then
  # the op forward+backward on each path and order, for the cost model's refit after the all-heads dot kernels
  timeout 300 python3 -m benchmarks.probe --parts attention --graphs sbm-dense,batch-random \
    --attention-graphs sbm-dense,batch-random --families dot,gat --orders none,rcm --out "$out/attention_paths" \
    >"$out/attention_paths.txt" 2>&1
  grep "^| attention" "$out/attention_paths.txt" | cut -c1-220
  harness_table 250 gat_bf16 --graphs sbm-dense,batch-random --layers gat \
    --modes eager,gnn_io,gnn_io_csr,gnn_io_block --dtype bfloat16 --reps 10 | tail -3
elif [[ $what == session18f ]]; then
  harness_table 560 tf32 --graphs sbm-dense,batch-random --layers transformer,gat \
    --modes eager,inductor,gnn_io,gnn_io_csr,gnn_io_block --tf32 --reps 10 | tail -5
elif [[ $what == session18g ]]; then
  kernel_tests 120 tests/kernels/test_attention_paths.py
  harness_table 440 chooser \
    --graphs sbm-dense,batch-random,rmat-arxiv,ca-AstroPh,MUSAE-github,road-luxembourg-osm --layers transformer,gat \
    --modes gnn_io,gnn_io_csr,gnn_io_block --dtype bfloat16 --reps 10 | tail -13
elif [[ $what == session18h ]]; then
  kernel_tests 120 tests/kernels/test_attention_paths.py
  harness_table 150 auto_bf16 --graphs sbm-dense,batch-random --layers transformer,gat \
    --modes gnn_io --dtype bfloat16 --reps 10 | tail -4
  for flag in "--dtype bfloat16" "--tf32"; do
    name=$(echo $flag | tr -dc 'a-z0-9')
    harness_table 170 "gatv2_$name" --graphs sbm-dense,batch-random --layers gatv2 \
      --modes eager,inductor,gnn_io $flag --reps 5 | tail -2
  done
elif [[ $what == session18i || $what == session18j ]]; then
  if [[ $what == session18j ]]; then
    kernel_tests 120 tests/kernels/test_attention_paths.py
  fi
  for flag in "--dtype bfloat16" "--tf32"; do
    name=$(echo $flag | tr -dc 'a-z0-9')
    harness_table 250 "auto_$name" --graphs ${GRAPHS:-sbm-dense,batch-random} --layers transformer,gat \
      --modes ${MODES:-gnn_io,gnn_io_csr,gnn_io_block} $flag --reps 5 | grep "^| sbm\|^| batch"
    python3 -c "
import json, sys
for r in json.load(open(sys.argv[1]))['results']:
    if r['mode'] == 'gnn_io':
        for d in r.get('path_decisions', [])[-1:]:
            print(r['graph'][:10], r['layer'], d['path'], d['order'], d['predicted_ms'], d['measured_forward_ms'])
" "$out/auto_$name/results.json"
  done
elif [[ $what == session18k ]]; then
  kernel_tests 100 tests/kernels/test_block_sparse.py
  block_sweep 330 block_launch_tf32 --families dot --block-dtype tf32
elif [[ $what == session18l ]]; then
  kernel_tests 120 tests/kernels/test_block_sparse_gat.py
  block_sweep 250 block_launch_gat --families gat
elif [[ $what == session19 ]]; then
  # owed by session 18 (no device time left): test_block_sparse_gat.py on CUDA in full (call 11's timeout cut it
  # at 70%; GATv2's 4-D all-heads form is in the rest), the head-block cap (MAX_PROGRAM_CHANNELS) and the
  # chooser's memory fix; then GAT's per-kernel launch bests timed together (the sweep's first row), and the
  # TF32 rows and peaks again
  kernel_tests 300 tests/kernels/test_block_sparse.py tests/kernels/test_block_sparse_gat.py \
    tests/kernels/test_attention_paths.py
  block_sweep 120 block_launch_gat --families gat | head -3
  harness_table 170 tf32 --graphs sbm-dense,batch-random --layers transformer,gat \
    --modes gnn_io,gnn_io_csr,gnn_io_block --tf32 --reps 5 | grep "^| sbm\|^| batch"
elif [[ $what == session19p ]]; then
  # session 19's first call: the owed block-sparse tests on CUDA, then where the large-RMAT step goes for issue 4
  # (SAGEConv max) and issue 5 (GATConv), fp32, one profile each
  kernel_tests 330 tests/kernels/test_block_sparse.py tests/kernels/test_block_sparse_gat.py \
    tests/kernels/test_attention_paths.py
  for layer in ${LAYERS:-gat sage_max}; do
    timeout 100 python3 -m benchmarks.profile_layer --layer $layer --graph rmat-large --mode gnn_io --rows 30 \
      >"$out/profile_${layer}_rmat_large.txt" 2>&1
    head -45 "$out/profile_${layer}_rmat_large.txt" | cut -c1-60,100-200
  done
elif [[ $what == session19q ]]; then
  # the dense ops around the message passing in their variants (bias-gradient column sum, fp32 GEMM layouts),
  # then issue 4 and 5's large-RMAT layers side by side before any change of this session
  timeout 90 python3 -m benchmarks.dense_ops | tee "$out/dense_ops.txt"
  harness_table 400 large --graphs rmat-large --layers sage_max,gat --modes eager,inductor,gnn_io --reps 10 | tail -4
elif [[ $what == session19r ]]; then
  # issues 4 and 5 on the card their targets name (call it with kind nvidia-h100-x1): the large RMAT graph, every
  # layer of the two issues, after the two-stage bias-gradient sum
  timeout 60 python3 -m benchmarks.dense_ops | grep "column sum" | head -6
  harness_table 520 large --graphs rmat-large --layers ${LAYERS:-sage_max,gat,gatv2,transformer} \
    --modes eager,inductor,gnn_io --reps 10 | tail -5
elif [[ $what == session19s ]]; then
  # the arxiv-sized RMAT graph for issues 4 and 5, with and without CUDA graphs
  harness_table 420 arxiv --graphs rmat-arxiv --layers ${LAYERS:-sage_max,gatv2,transformer} \
    --modes eager,inductor,gnn_io,gnn_io_cg --reps 30 | tail -5
elif [[ $what == session19t ]]; then
  # call 4 found gnn_io_cg failing on GATv2Conv and TransformerConv ("tensors in the cudagraph pool not tracked as
  # outputs"): where the leaked tensors come from, and the CUDA-graph test file
  for layer in ${LAYERS:-transformer gatv2}; do
    GNN_IO_CUDAGRAPHS=1 timeout 120 python3 -m benchmarks.cg_debug $layer rmat-arxiv >"$out/cg_debug_$layer.txt" 2>&1
    grep -v "^ *File\|^    " "$out/cg_debug_$layer.txt" | tail -40 | cut -c1-300
    grep -n "gnn_inductor\|kernels/" "$out/cg_debug_$layer.txt" | head -30 | cut -c1-250
  done
  [[ -n ${LAYERS:-} ]] || kernel_tests 150 tests/gpu/test_cudagraphs_cuda.py
elif [[ $what == session19u ]]; then
  # the CUDA-graph fix (no per-plan cache filled during a capture): the test file, which now switches graphs, then
  # call 4's failing cases
  kernel_tests 150 tests/gpu/test_cudagraphs_cuda.py
  harness_table 300 arxiv_cg --graphs rmat-arxiv --layers ${LAYERS:-gatv2,transformer} \
    --modes eager,inductor,gnn_io,gnn_io_cg --reps 30 | tail -3
elif [[ $what == session19v ]]; then
  # call 7 found the SpMM family failing the CUDA-graph test once it switches graphs (a kept cuSPARSE workspace, a
  # block format built inside a capture): after the capture guards, the test file again
  kernel_tests 170 tests/gpu/test_cudagraphs_cuda.py
  grep "^FAILED\|^E  .*Error" "$out/gpu_tests.txt" | head -12 | cut -c1-250
elif [[ $what == session20 ]]; then
  # owed by session 19 (no device time left): the CUDA-graph test with its graph switch after the SpMM capture
  # guards; the attention kernels with row-strided gradients (packed gradients); TransformerConv with and without
  # them on RMAT 2^20 (time and step memory); then session 18's TF32 table
  kernel_tests 300 tests/gpu/test_cudagraphs_cuda.py tests/gpu/test_attention_cuda.py \
    tests/kernels/test_attention_split_backward.py
  grep "^FAILED" "$out/gpu_tests.txt" | head -12 | cut -c1-250
  harness_table 250 packed --graphs rmat-large --layers transformer --modes gnn_io,gnn_io_no_packed --reps 10 | tail -3
elif [[ $what == session20b ]]; then
  # the fp32 GEMM variants again (row blocks: does cuBLAS pick its faster kernel? GATConv's GEMMs, session 19),
  # then session 18's TF32 table
  timeout 90 python3 -m benchmarks.dense_ops | tee "$out/dense_ops.txt" | grep gemm
  harness_table 170 tf32 --graphs sbm-dense,batch-random --layers transformer,gat \
    --modes gnn_io,gnn_io_csr,gnn_io_block --tf32 --reps 5 | grep "^| sbm\|^| batch"
elif [[ $what == session20c ]]; then
  # session 20 call 2: the two tests call 1 failed, after their fixes (a CPU/CUDA compare in the packed-gradient
  # test; a flat 1e-4 on GIN's weight gradient), then session20b's GEMM variants and TF32 table
  kernel_tests 200 tests/gpu/test_cudagraphs_cuda.py tests/kernels/test_attention_split_backward.py
  grep "^FAILED" "$out/gpu_tests.txt" | head -12 | cut -c1-250
  timeout 90 python3 -m benchmarks.dense_ops | tee "$out/dense_ops.txt" | grep gemm
  harness_table 170 tf32 --graphs sbm-dense,batch-random --layers transformer,gat \
    --modes gnn_io,gnn_io_csr,gnn_io_block --tf32 --reps 5 | grep "^| sbm\|^| batch"
elif [[ $what == session20d ]]; then
  # issues 4 and 5, "never slower than torch.compile on the suite": the small and mid-size graphs again (last run in
  # session 9), eager, torch.compile default and gnn_io, one harness run per layer so a timeout costs one layer
  for layer in sage_max gat gatv2 transformer; do
    timeout 140 python3 -m benchmarks.harness --graphs Planetoid-Cora,ca-AstroPh,MUSAE-github,soc-Slashdot0902,road-luxembourg-osm,rmat-arxiv \
      --layers $layer --modes eager,inductor,gnn_io --reps 10 --out "$out/suite_$layer" 2>"$out/suite_${layer}_stderr.txt" \
      | tee "$out/suite_${layer}_stdout.txt" | grep "^| [a-zA-Z]" | grep -v "^| graph" | cut -d'|' -f2,5,6,7,8,10,19,21
  done
elif [[ $what == session20e ]]; then
  # the suite cases of call 3 where gnn_io was behind torch.compile (each is declined by the cost model, so the
  # same Inductor code runs, plus the plan's index checks for SAGEConv max), interleaved; then where an arxiv-size
  # SAGEConv max step (issue 4's 1.5 ms) spends its CPU and GPU time
  python3 -m benchmarks.ab --layers sage_max --graphs Planetoid-Cora,ca-AstroPh --rounds 200 2>"$out/ab_stderr.txt" \
    | tee "$out/ab_sage_max.txt" | tail -4
  python3 -m benchmarks.ab --layers gat,transformer --graphs MUSAE-github --rounds 200 2>>"$out/ab_stderr.txt" \
    | tee "$out/ab_github.txt" | tail -4
  timeout 120 python3 -m benchmarks.step_anatomy --layers sage_max --graph rmat-arxiv --modes inductor,gnn_io \
    >"$out/anatomy_sage_max.txt" 2>&1; grep "^|" "$out/anatomy_sage_max.txt" | tail -4
  timeout 120 python3 -m benchmarks.cpu_profile --layer sage_max --graph rmat-arxiv --mode gnn_io --sampler \
    >"$out/cpu_profile_sage_max.txt" 2>&1; tail -3 "$out/cpu_profile_sage_max.txt"
  timeout 100 python3 -m benchmarks.profile_layer --layer sage_max --graph rmat-arxiv --mode gnn_io --rows 25 \
    >"$out/profile_sage_max.txt" 2>&1; grep -E "Self CUDA time total" "$out/profile_sage_max.txt"
elif [[ $what == session20f ]]; then
  # GAT's segment backward with its dst terms stored by transposed-CSR position (contiguous) and D's bias taken out
  # in the delta kernel: CUDA tests, interleaved A/B against the default split backward, the kernels of a step
  CI=1 GNN_IO_STRICT=1 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_triton.py \
    -k "(one_pass or source_position or bias) and not interpreter" 2>&1 | tee "$out/gpu_tests.txt" | tail -2
  grep "^FAILED" "$out/gpu_tests.txt" | head -12 | cut -c1-250
  python3 -m benchmarks.ab --layers gat --graphs rmat-large,rmat-arxiv --modes gnn_io,gnn_io_one_pass_segment \
    --rounds 20 2>"$out/ab_stderr.txt" | tee "$out/ab_segment.txt" | tail -4
  for mode in gnn_io gnn_io_one_pass_segment; do
    timeout 100 python3 -m benchmarks.profile_layer --layer gat --graph rmat-large --mode $mode --rows 22 \
      >"$out/profile_gat_$mode.txt" 2>&1
    grep -E "^== |attention|_spmm|_delta|Self CUDA time total" "$out/profile_gat_$mode.txt" | cut -c1-60,100-175 | head -14
  done
elif [[ $what == session20g ]]; then
  # GATConv's backward now defaults to the segment form (GNN_IO_ATTENTION_BACKWARD unset = auto): the attention
  # kernel tests and the end-to-end GPU attention tests on CUDA, issue 5's GATConv line on RMAT 2^20 with eager
  # and torch.compile in the same run, then the A/B on uniform-large
  CI=1 GNN_IO_STRICT=1 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_triton.py \
    tests/kernels/test_attention_split_backward.py tests/gpu/test_attention_cuda.py -k "not interpreter" 2>&1 \
    | tee "$out/gpu_tests.txt" | tail -2
  grep "^FAILED" "$out/gpu_tests.txt" | head -12 | cut -c1-250
  harness_table 150 gat --graphs rmat-large --layers gat --modes eager,inductor,gnn_io --reps 10 \
    | grep "^| rmat" | cut -d'|' -f2,6-12,16-19,23-
  timeout 100 python3 -m benchmarks.ab --layers gat --graphs uniform-large --modes gnn_io_split,gnn_io \
    --rounds 10 2>"$out/ab_stderr.txt" | tee "$out/ab_auto.txt" | tail -3
elif [[ $what == session20h ]]; then
  # the segment backward's src pass launch swept (GATConv, RMAT 2^20; rows "dst" have no dst pass to tune now)
  timeout 200 python3 -m benchmarks.probe --parts split_sweep --graphs rmat-large --attention-graphs rmat-large \
    --families gat --out "$out/split_sweep" >"$out/split_sweep.txt" 2>&1
  grep "^| split_sweep" "$out/split_sweep.txt" | grep -v "| dst |" | cut -c1-160
elif [[ $what == session20i ]]; then
  # the segment backward's per-destination sum (0.81 ms of GATConv's step on RMAT 2^20): the SpMM's launch for
  # four-wide rows
  timeout 200 python3 -m benchmarks.probe --parts segment_sum --graphs rmat-large,rmat-arxiv \
    --attention-graphs rmat-large,rmat-arxiv --out "$out/segment_sum" >"$out/segment_sum.txt" 2>&1
  grep "^| segment_sum\|^| error" "$out/segment_sum.txt" | cut -c1-160
elif [[ $what == session20j ]]; then
  # after the per-destination sum's launch change: its CUDA tests, GATConv's A/B against the split backward on
  # RMAT 2^20 and 2^17, and issue 5's GATConv line again (eager and torch.compile in the same run)
  CI=1 GNN_IO_STRICT=1 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_triton.py \
    -k "(one_pass or source_position or bias) and not interpreter" 2>&1 | tee "$out/gpu_tests.txt" | tail -2
  timeout 200 python3 -m benchmarks.ab --layers gat --graphs rmat-large,rmat-arxiv --modes gnn_io_split,gnn_io \
    --rounds 20 2>"$out/ab_stderr.txt" | tee "$out/ab_final.txt" | tail -4
  harness_table 150 gat --graphs rmat-large --layers gat --modes eager,inductor,gnn_io --reps 10 \
    | grep "^| rmat" | cut -d'|' -f2,6-12,16-19,23-
elif [[ $what == session20k ]]; then
  # float32 GATConv is left to Inductor under 1.5M edges (gnn_inductor/cost.py, session 9's near tie at 1.1M):
  # with the segment backward, the fused attention forced against Inductor at 0.6-1.1M edges, interleaved
  timeout 300 python3 -m benchmarks.ab --layers gat --graphs rmat-arxiv,soc-Slashdot0902,MUSAE-github \
    --modes inductor,gnn_io_force --rounds 100 2>"$out/ab_stderr.txt" | tee "$out/ab_gat_threshold.txt" | tail -5
elif [[ $what == session20l ]]; then
  # the packed-gradient test after its fix for GAT's default segment backward (call 6 failed its expectation)
  CI=1 GNN_IO_STRICT=1 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_split_backward.py \
    -k "not interpreter" 2>&1 | tee "$out/gpu_tests.txt" | tail -2
elif [[ $what == session20m ]]; then
  # CUDA graphs with GATConv's new default backward (positions built at the warm-up, outside the graph's pool)
  CI=1 GNN_IO_STRICT=1 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cudagraphs_cuda.py 2>&1 \
    | tee "$out/gpu_tests.txt" | tail -2
  grep "^FAILED" "$out/gpu_tests.txt" | head -12 | cut -c1-250
elif [[ $what == session20n ]]; then
  # GATConv on MUSAE-github (left to Inductor whole) trailed torch.compile by 2% (call 4): Inductor's 3-D tiles,
  # which the backend turns off, against torch.compile, interleaved
  timeout 200 python3 -m benchmarks.ab --layers gat --graphs MUSAE-github --modes inductor,gnn_io_tiles3 \
    --rounds 200 2>"$out/ab_stderr.txt" | tee "$out/ab_tiles3.txt" | tail -3
elif [[ $what == session21 ]]; then
  # GAT's score projections folded into its GEMM (gnn_inductor/score_fold.py), its packed gradient with zero
  # columns; GATv2's two maps fused now that their gradients are packed: CUDA tests, then A/B on RMAT 2^20
  CI=1 GNN_IO_STRICT=1 timeout 170 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_attention_cuda.py \
    tests/test_score_fold.py tests/test_packed_grads.py -k "not interpreter" 2>&1 | tee "$out/gpu_tests.txt" | tail -4
  for modes in gnn_io_no_score_fold,gnn_io gnn_io_score_fold_tight,gnn_io; do
    timeout 150 python3 -m benchmarks.ab --layers gat --graphs rmat-large --modes $modes --rounds 16 \
      2>>"$out/ab_stderr.txt" | tee -a "$out/ab_gat.txt" | tail -2
  done
  timeout 150 python3 -m benchmarks.ab --layers gatv2 --graphs rmat-large --modes gnn_io,gnn_io_fuse_pairs \
    --rounds 12 2>>"$out/ab_stderr.txt" | tee "$out/ab_gatv2.txt" | tail -2
elif [[ $what == session21b ]]; then
  # CUDA tests with the fold opt-in and GATv2's pair fused by default; where the fold's time goes; GATv2's line
  CI=1 GNN_IO_STRICT=1 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_attention_cuda.py \
    tests/test_score_fold.py tests/test_packed_grads.py tests/test_linear_fusion.py -k "not interpreter" 2>&1 \
    | tee "$out/gpu_tests.txt" | tail -4
  for mode in gnn_io gnn_io_score_fold; do
    timeout 100 python3 -m benchmarks.profile_layer --layer gat --graph rmat-large --mode $mode --rows 16 \
      2>/dev/null >"$out/profile_gat_$mode.txt"; grep -m1 "Self CUDA time" "$out/profile_gat_$mode.txt"
  done
  harness_table 150 gatv2 --graphs rmat-large --layers gatv2 --modes gnn_io --reps 10
elif [[ $what == session21c ]]; then
  # GATConv with edge features: lin_edge's GEMM makes the [E, H] scores alone (score_fold auto, the default)
  harness_table 560 gat_edge --graphs rmat-large --layers gat_edge --modes eager,inductor,gnn_io_no_score_fold,gnn_io \
    --reps 10
elif [[ $what == session21d ]]; then
  # CUDA tests after the fold's auto default (GAT with edge features folds lin_edge) and the pair fusion
  CI=1 GNN_IO_STRICT=1 timeout 560 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_attention_cuda.py \
    tests/gpu/test_cudagraphs_cuda.py -k "not interpreter" 2>&1 | tee "$out/gpu_tests.txt" | tail -4
elif [[ $what == session21f ]]; then
  # GATv2's pair of maps fused (the new default) against apart, where the rewrite runs at mid size
  timeout 560 python3 -m benchmarks.ab --layers gatv2 --graphs MUSAE-github,soc-Slashdot0902,rmat-arxiv \
    --modes gnn_io_no_pairs,gnn_io --rounds 60 2>"$out/ab_stderr.txt" | tee "$out/ab_gatv2_pairs.txt" | tail -6
elif [[ $what == session21g ]]; then
  # float32 GATConv below the cost model's 1.5M edges: Inductor against the fused path forced, by graph shape
  timeout 560 python3 -m benchmarks.ab --layers gat --modes inductor,gnn_io_force --rounds 40 \
    --graphs rmat-arxiv,rmat-16-1000000,rmat-17-600000,rmat-18-1200000,rmat-16-500000,soc-Slashdot0902,MUSAE-github,ca-AstroPh,road-luxembourg-osm \
    2>"$out/ab_stderr.txt" | tee "$out/ab_gat_threshold.txt" | tail -12
elif [[ $what == session21h ]]; then
  # the GAT mid-size rule: the default against torch.compile where it now takes the fused path and where not
  timeout 560 python3 -m benchmarks.ab --layers gat --modes inductor,gnn_io --rounds 60 \
    --graphs rmat-arxiv,rmat-18-1200000,soc-Slashdot0902 2>"$out/ab_stderr.txt" | tee "$out/ab_gat_rule.txt" | tail -6
elif [[ $what == session21i ]]; then
  # issue 8, owed: GCN's block-sparse SpMM against cached cuSPARSE on the locally dense graphs (bf16)
  harness_table 560 gcn_bf16 --graphs sbm-dense,batch-random --layers gcn \
    --modes inductor,gnn_io_spmm_cusparse,gnn_io_spmm_block,gnn_io --dtype bfloat16 --reps 10
elif [[ $what == session21j ]]; then
  # issue 8, owed: GATConv in TF32 on the 20,000-graph batch (session 20's run timed out there)
  harness_table 560 gat_tf32 --graphs batch-random --layers gat --modes gnn_io_csr,gnn_io_block,gnn_io --tf32 --reps 5
elif [[ $what == session21k ]]; then
  # the SpMM chooser timing forward and backward: its CUDA tests, then GCN bf16 on the dense graphs (auto)
  CI=1 GNN_IO_STRICT=1 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_spmm_paths.py \
    tests/kernels/test_block_sparse_spmm.py tests/gpu/test_cuda.py -k "not interpreter" 2>&1 | tee "$out/gpu_tests.txt" | tail -3
  harness_table 300 gcn_auto --graphs sbm-dense,batch-random --layers gcn --modes gnn_io --dtype bfloat16 --reps 10
elif [[ $what == session21l ]]; then
  # after the half-precision tile gate (12): GCN bf16 auto on the dense graphs, then GATConv TF32 on the batch
  harness_table 200 gcn_auto --graphs sbm-dense,batch-random --layers gcn --modes gnn_io --dtype bfloat16 --reps 10
  harness_table 350 gat_tf32 --graphs batch-random --layers gat --modes gnn_io_csr,gnn_io_block,gnn_io --tf32 --reps 5
elif [[ $what == session21m ]]; then
  # graphs left to Inductor whole now compile with Inductor's own tiles: against torch.compile, interleaved
  timeout 560 python3 -m benchmarks.ab --layers gat --graphs MUSAE-github,ca-AstroPh --modes inductor,gnn_io \
    --rounds 200 2>"$out/ab_stderr.txt" | tee "$out/ab_declined.txt" | tail -5
elif [[ $what == session21n ]]; then
  # GATConv at arxiv size now on the fused path by default: the harness line, eager to gnn_io
  harness_table 500 gat_arxiv --graphs rmat-arxiv,rmat-18-1200000 --layers gat --modes eager,inductor,gnn_io --reps 20
elif [[ $what == session21o ]]; then
  # the SpMM chooser on the block model (bf16) with 10 timing reps: forced paths and auto, each decision printed
  harness_table 400 gcn_sbm --graphs sbm-dense --layers gcn --modes gnn_io_spmm_cusparse,gnn_io_spmm_block,gnn_io \
    --dtype bfloat16 --reps 20
  python3 - "$out/gcn_sbm/results.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    for d in r.get("path_decisions", []) or []:
        if d.get("family") == "spmm":
            print(r["mode"], d.get("path"), d.get("reason"), d.get("measured_forward_ms"))
PY
  rm -f "$out/gcn_sbm/speedup.png" "$out/gcn_sbm/results.md"
elif [[ $what == session21p ]]; then
  # GCN bf16 on the block model: the chooser's pick against each forced path, interleaved
  for modes in gnn_io_spmm_cusparse,gnn_io gnn_io_spmm_block,gnn_io; do
    timeout 250 python3 -m benchmarks.ab --layers gcn --graphs sbm-dense --dtype bfloat16 --modes $modes --rounds 100 \
      2>>"$out/ab_stderr.txt" | tee -a "$out/ab_gcn_sbm.txt" | tail -1
  done
elif [[ $what == session21q ]]; then
  # the final state's CUDA tests: SpMM paths (10 timing reps, half-precision gate), GCN/GIN/SAGE on CUDA, attention
  CI=1 GNN_IO_STRICT=1 timeout 560 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_spmm_paths.py \
    tests/kernels/test_block_sparse_spmm.py tests/gpu/test_cuda.py tests/gpu/test_attention_cuda.py \
    -k "not interpreter and not dropout" 2>&1 | tee "$out/gpu_tests.txt" | tail -3
elif [[ $what == session22 ]]; then
  # what is alive at the peak of a GATv2Conv and a TransformerConv step on RMAT 2^20 (issue 5's 2.5 / 3 GB)
  timeout 500 python3 -m benchmarks.memory_anatomy --layers gatv2,transformer --graph rmat-large --modes gnn_io \
    >"$out/anatomy.txt" 2>"$out/anatomy_stderr.txt"; tail -3 "$out/anatomy_stderr.txt"
  head -90 "$out/anatomy.txt"
elif [[ $what == session22b ]]; then
  # gnn_io::attention_delta before the backward op: CUDA tests of the attention kernels, then what the step holds
  # at its peak and the harness lines of the three attention layers on RMAT 2^20
  CI=1 GNN_IO_STRICT=1 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_delta.py \
    tests/kernels/test_attention_triton.py tests/kernels/test_attention_split_backward.py tests/test_packed_grads.py \
    tests/gpu/test_attention_cuda.py -k "not interpreter" 2>&1 | tee "$out/gpu_tests.txt" | tail -3
  timeout 200 python3 -m benchmarks.memory_anatomy --layers gatv2,transformer --graph rmat-large --modes gnn_io \
    >"$out/anatomy.txt" 2>"$out/anatomy_stderr.txt"; grep -A8 "alive at its peak" "$out/anatomy.txt"
  harness_table 240 attention --graphs rmat-large --layers gat,gatv2,transformer --modes gnn_io --reps 10
elif [[ $what == session22c ]]; then
  # the attention CUDA tests session22b's timeout cut, the block-sparse kernels' (their backward reads D now)
  CI=1 GNN_IO_STRICT=1 timeout 330 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_attention_cuda.py \
    tests/test_packed_grads.py tests/kernels/test_block_sparse.py tests/kernels/test_block_sparse_gat.py \
    -k "not interpreter" 2>&1 | tee "$out/gpu_tests.txt" | tail -3
  # issue 8: the reordering's predicted gain against the measured one in TF32 (session 18 had one odd sample)
  harness_table 200 tf32_order --graphs sbm-dense --layers transformer --modes gnn_io --tf32 --reps 5 | tail -2
  python3 - "$out/tf32_order/results.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    for d in r.get("path_decisions", []) or []:
        print(r["layer"], {k: d.get(k) for k in ("path", "order", "reason", "predicted_ms", "measured_forward_ms",
                                                  "order_build_ms")})
PY
  rm -f "$out/tf32_order/speedup.png" "$out/tf32_order/results.md"
elif [[ $what == session22d ]]; then
  # the dot attention op (fwd+bwd) per path and order on four graphs, for the CSR constants of the cost model;
  # then the TF32 order gain with the identity order timed as what it would run
  timeout 360 python3 -m benchmarks.probe --parts attention --families dot --orders none,rcm \
    --graphs sbm-dense,batch-random,rmat-arxiv,MUSAE-wikipedia-squirrel \
    --attention-graphs sbm-dense,batch-random,rmat-arxiv,MUSAE-wikipedia-squirrel --out "$out/probe" \
    >"$out/probe.txt" 2>&1; grep "^| attention" "$out/probe.txt" | cut -c1-230
  harness_table 170 tf32_order --graphs sbm-dense --layers transformer --modes gnn_io --tf32 --reps 5 | tail -1
  last_decisions layer "$out/tf32_order/results.json"
  rm -f "$out/tf32_order/speedup.png" "$out/tf32_order/results.md"
elif [[ $what == session22e ]]; then
  # the final state's attention tests on CUDA, in two parts so that each prints its summary within its timeout
  CI=1 GNN_IO_STRICT=1 timeout 270 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_attention_cuda.py \
    tests/kernels/test_attention_delta.py tests/test_packed_grads.py -k "not interpreter" 2>&1 \
    | tee "$out/gpu_tests_1.txt" | tail -2
  CI=1 GNN_IO_STRICT=1 timeout 290 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_paths.py \
    tests/kernels/test_block_sparse.py tests/kernels/test_block_sparse_gat.py -k "not interpreter" 2>&1 \
    | tee "$out/gpu_tests_2.txt" | tail -2
elif [[ $what == session22f ]]; then
  # the refit TF32 dot model (CSR locality term, block constants): the pick against each forced path on four
  # graphs, each decision printed (predicted and measured gains), then the path tests on CUDA
  harness_table 300 tf32_dense --graphs sbm-dense,batch-random --layers transformer \
    --modes gnn_io,gnn_io_csr,gnn_io_block --tf32 --reps 5 | grep "^| [a-zM]"
  harness_table 150 tf32_sparse --graphs rmat-arxiv,MUSAE-wikipedia-squirrel --layers transformer \
    --modes gnn_io,gnn_io_csr --tf32 --reps 5 | grep "^| [a-zM]"
  last_decisions graph "$out/tf32_dense/results.json" "$out/tf32_sparse/results.json"
  rm -f "$out"/tf32_*/speedup.png "$out"/tf32_*/results.md
  kernel_tests 120 tests/kernels/test_attention_paths.py
elif [[ $what == session22g ]]; then
  # 22f's sequential harness put the auto pick (CSR) 21% behind forced CSR on squirrel: the same path, so drift?
  # Interleaved A/B in TF32 (the override makes torch.backends.cuda.matmul.allow_tf32 read true)
  TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 timeout 300 python3 -m benchmarks.ab --layers transformer \
    --graphs MUSAE-wikipedia-squirrel,rmat-arxiv --modes gnn_io_csr,gnn_io --rounds 60 2>"$out/ab_stderr.txt" \
    | tee "$out/ab_tf32_sparse.txt" | tail -4
elif [[ $what == session22h ]]; then
  # the GAT family's op (fwd+bwd) per path, order and precision on session22d's four graphs: does its model fit?
  timeout 400 python3 -m benchmarks.probe --parts attention --families gat --orders none,rcm \
    --graphs sbm-dense,batch-random,rmat-arxiv,MUSAE-wikipedia-squirrel \
    --attention-graphs sbm-dense,batch-random,rmat-arxiv,MUSAE-wikipedia-squirrel --out "$out/probe" \
    >"$out/probe.txt" 2>&1; grep "^| attention" "$out/probe.txt" | cut -c1-200
elif [[ $what == session22i ]]; then
  # the attention backward's new first op (attention_delta) inside CUDA graph trees, every layer and path
  CI=1 GNN_IO_STRICT=1 timeout 450 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cudagraphs_cuda.py 2>&1 \
    | tee "$out/gpu_tests.txt" | tail -3
elif [[ $what == session22j ]]; then
  # after the review (one source-CSR cleanup for both first-call timings): the path tests on CUDA, then the TF32
  # picks on the two dense graphs with their decisions
  kernel_tests 150 tests/kernels/test_attention_paths.py tests/gpu/test_attention_cuda.py
  harness_table 240 tf32_review --graphs sbm-dense,batch-random --layers transformer --modes gnn_io --tf32 --reps 5 \
    | grep "^| [a-z]"
  last_decisions graph "$out/tf32_review/results.json"
  rm -f "$out/tf32_review/speedup.png" "$out/tf32_review/results.md"
elif [[ $what == session23 ]]; then
  # the fused linear map's gradients by blocks of rows (gnn_io::attention_backward_projected): CUDA tests, then
  # step memory and time of GATv2Conv and TransformerConv on RMAT 2^20 with it on (256 MiB and 64 MiB blocks) and off
  kernel_tests 200 tests/test_projected_grads.py tests/test_packed_grads.py tests/kernels/test_attention_delta.py
  harness_table 330 projected --graphs rmat-large --layers gatv2,transformer \
    --modes gnn_io_no_projected,gnn_io,gnn_io_chunk64 --reps 10 | grep "^| [a-z]"
  rm -f "$out/projected/speedup.png"
elif [[ $what == session23b ]]; then
  # each block freed before the next is allocated: step memory again; kernel profiles of a TransformerConv step
  # with the products whole and by 64 MiB blocks (where do the blocks' 0.2 ms each go?)
  harness_table 200 projected --graphs rmat-large --layers gatv2,transformer --modes gnn_io,gnn_io_chunk64 --reps 10 \
    | grep "^| [a-z]"
  rm -f "$out/projected/speedup.png"
  for mode in gnn_io_no_projected gnn_io_chunk64; do
    timeout 150 python3 -m benchmarks.profile_layer --layer transformer --graph rmat-large --mode $mode --rows 22 \
      >"$out/profile_$mode.txt" 2>&1
    sed -n '/^== /,/^$/p' "$out/profile_$mode.txt" | head -30 | cut -c1-62,100-175
  done
elif [[ $what == session23c ]]; then
  # blocks no longer held by the passes' buffer map, the bias gradient by column_sum: step memory, then the time
  # against the products left to Inductor, interleaved, at 2^20 (six and four blocks) and at arxiv size (one)
  harness_table 150 projected --graphs rmat-large --layers gatv2,transformer --modes gnn_io --reps 5 \
    | grep "^| [a-z]" | cut -d'|' -f4,8,19
  rm -f "$out/projected/speedup.png"
  timeout 250 python3 -m benchmarks.ab --layers transformer,gatv2 --graphs rmat-large \
    --modes gnn_io_no_projected,gnn_io --rounds 12 2>"$out/ab_stderr.txt" | tee "$out/ab_large.txt" | tail -3
  timeout 120 python3 -m benchmarks.ab --layers transformer,gatv2 --graphs rmat-arxiv \
    --modes gnn_io_no_projected,gnn_io --rounds 30 2>>"$out/ab_stderr.txt" | tee "$out/ab_arxiv.txt" | tail -3
elif [[ $what == session23d ]]; then
  # the blocks' two passes side by side on two streams: CUDA tests, then A/B against one stream and against the
  # products left to Inductor (2^20), and a kernel profile of the default
  kernel_tests 150 tests/test_projected_grads.py
  timeout 330 python3 -m benchmarks.ab --layers transformer,gatv2 --graphs rmat-large \
    --modes gnn_io_one_stream,gnn_io --rounds 12 2>"$out/ab_stderr.txt" | tee "$out/ab_streams.txt" | tail -2
  timeout 200 python3 -m benchmarks.ab --layers transformer --graphs rmat-large \
    --modes gnn_io_no_projected,gnn_io --rounds 12 2>>"$out/ab_stderr.txt" | tee "$out/ab_large.txt" | tail -1
elif [[ $what == session23e ]]; then
  # each block's products on a third stream beside the next block's passes (two 128 MiB block buffers in turn):
  # CUDA tests, step memory, A/B against the passes-only streams and against the products left to Inductor
  kernel_tests 150 tests/test_projected_grads.py
  harness_table 150 projected --graphs rmat-large --layers gatv2,transformer --modes gnn_io --reps 5 \
    | grep "^| [a-z]" | cut -d'|' -f4,8,19
  timeout 330 python3 -m benchmarks.ab --layers transformer,gatv2 --graphs rmat-large \
    --modes gnn_io_no_projected,gnn_io --rounds 12 2>"$out/ab_stderr.txt" | tee "$out/ab_large.txt" | tail -2
  timeout 200 python3 -m benchmarks.ab --layers transformer --graphs rmat-large \
    --modes gnn_io_pass_streams,gnn_io --rounds 12 2>>"$out/ab_stderr.txt" | tee "$out/ab_streams.txt" | tail -1
elif [[ $what == session23f ]]; then
  # the final state's CUDA tests: blocks inside CUDA graph trees, the projected op, the split backward (row0)
  CI=1 GNN_IO_STRICT=1 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cudagraphs_cuda.py \
    tests/test_projected_grads.py -k "blocks or projected or matches or bad" 2>&1 | tee "$out/gpu_tests_1.txt" | tail -2
  CI=1 GNN_IO_STRICT=1 timeout 330 python3 -m pytest -q -p no:cacheprovider -x \
    tests/kernels/test_attention_split_backward.py -k "not interpreter" 2>&1 | tee "$out/gpu_tests_2.txt" | tail -2
elif [[ $what == session23g ]]; then
  # issue 5's layers on RMAT 2^20 in the final state (the products by blocks where they apply), time and memory
  harness_table 400 attention --graphs rmat-large --layers gat,gatv2,transformer --modes gnn_io --reps 10 \
    | grep "^| [a-z]" | cut -d'|' -f2,5,8,19,22
  rm -f "$out/attention/speedup.png"
elif [[ $what == session23h ]]; then
  # where the blocks' 0.6 ms go: kernel profiles of a TransformerConv step (RMAT 2^20), products whole and by blocks
  for mode in gnn_io_no_projected gnn_io; do
    timeout 150 python3 -m benchmarks.profile_layer --layer transformer --graph rmat-large --mode $mode --rows 30 \
      >"$out/profile_$mode.txt" 2>&1
    sed -n '/^== /,/^$/p' "$out/profile_$mode.txt" | head -38 | cut -c1-62,100-175
  done
elif [[ $what == session23i ]]; then
  # the projected op's 8.9 ms of CPU a call (session23h): where it goes (cProfile of TransformerConv steps, 2^20)
  timeout 200 python3 -m benchmarks.cpu_profile --layer transformer --graph rmat-large --mode gnn_io --steps 5 \
    --rows 30 >"$out/cpu_profile.txt" 2>&1
  grep -v "^$" "$out/cpu_profile.txt" | head -60 | cut -c1-200
elif [[ $what == session23j ]]; then
  # the final default against the products left to Inductor: GATv2Conv at 2^20 (not A/B'd directly before), and
  # both layers at arxiv size, where the packed gradient is one block (the pass leaves it alone)
  timeout 200 python3 -m benchmarks.ab --layers gatv2 --graphs rmat-large \
    --modes gnn_io_no_projected,gnn_io --rounds 12 2>"$out/ab_stderr.txt" | tee "$out/ab_large.txt" | tail -1
  timeout 150 python3 -m benchmarks.ab --layers transformer,gatv2 --graphs rmat-arxiv \
    --modes gnn_io_no_projected,gnn_io --rounds 30 2>>"$out/ab_stderr.txt" | tee "$out/ab_arxiv.txt" | tail -2
elif [[ $what == session23k ]]; then
  # the final state's attention layers on CUDA against eager PyG (every family, edge features, dropout, bf16)
  CI=1 GNN_IO_STRICT=1 timeout 480 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_attention_cuda.py \
    tests/kernels/test_attention_delta.py -k "not interpreter" 2>&1 | tee "$out/gpu_tests.txt" | tail -2
elif [[ $what == session23l ]]; then
  # what GATv2Conv's and TransformerConv's steps hold at their peaks with the products by blocks (RMAT 2^20)
  timeout 300 python3 -m benchmarks.memory_anatomy --layers gatv2,transformer --graph rmat-large --modes gnn_io \
    >"$out/anatomy.txt" 2>"$out/anatomy_stderr.txt"; tail -3 "$out/anatomy_stderr.txt"
  grep -B2 -A14 "alive at its peak" "$out/anatomy.txt" | cut -c1-180
elif [[ $what == session23m ]]; then
  # the blocks' bias gradient by a GEMV against ones (no 160 MiB reduction buffer at GATv2Conv's peak): CUDA tests,
  # step memory, and the time against the products left to Inductor (2^20, interleaved)
  kernel_tests 100 tests/test_projected_grads.py
  harness_table 150 projected --graphs rmat-large --layers gatv2,transformer --modes gnn_io --reps 5 \
    | grep "^| [a-z]" | cut -d'|' -f4,8,19
  timeout 300 python3 -m benchmarks.ab --layers gatv2,transformer --graphs rmat-large \
    --modes gnn_io_no_projected,gnn_io --rounds 10 2>"$out/ab_stderr.txt" | tee "$out/ab_large.txt" | tail -2
elif [[ $what == session23n ]]; then
  # after the review's refactor (stream switch read once a call, bounds and GEMV operand made once): CUDA tests
  CI=1 GNN_IO_STRICT=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_projected_grads.py \
    tests/gpu/test_cudagraphs_cuda.py -k "not interpreter and (op_matches or blocks or bad or matcher or switch)" 2>&1 \
    | tee "$out/gpu_tests.txt" | tail -2
elif [[ $what == session24 ]]; then
  # the 3xTF32 Triton GEMM (kernels/dense_triton.py) against cuBLAS float32: launches, splits, errors
  for spec in "1048576 128 128" "1048576 128 512" "131072 128 128" "131072 128 512"; do
    set -- $spec
    timeout 200 python3 -m benchmarks.dense_ops --rows $1 --width $2 --x3 $3 2>&1 | tee "$out/x3_$1_$2_$3.txt" \
      | grep -v "^| --- "
  done
elif [[ $what == session24b ]]; then
  # more launches, the in-kernel split (x3split), the input gradient with a K-major weight
  for spec in "1048576 128 128" "1048576 128 512"; do
    set -- $spec
    timeout 280 python3 -m benchmarks.dense_ops --rows $1 --width $2 --x3 $3 2>&1 | tee "$out/x3_$1_$2_$3.txt" \
      | grep -v "^| --- " | sort -t'|' -k2,2 -k4,4n | awk -F'|' '{ if (seen[$2]++ < 6) print }'
  done
elif [[ $what == session24c ]]; then
  # the 3xTF32 GEMMs in the layers: CUDA tests, then A/B against cuBLAS's float32 GEMMs, then the harness line
  kernel_tests 200 tests/kernels/test_dense_triton.py tests/test_dense_gemm.py tests/test_gemm_accumulate.py \
    tests/test_projected_grads.py
  timeout 330 python3 -m benchmarks.ab --layers gat,sage_max,gatv2,transformer --graphs rmat-large \
    --modes gnn_io_cublas,gnn_io --rounds 6 2>"$out/ab_stderr.txt" | tee "$out/ab_large.txt" | tail -6
elif [[ $what == session24d ]]; then
  # the src pass's own value row loaded once (ROW_VALUE): split-backward CUDA tests, then A/B; the split GEMMs
  # against cuBLAS at arxiv size; the harness lines of issues 4 and 5's layers (time and step memory).
  # Run once (call 4); ROW_VALUE was then reverted (GAT 0.94x), so its A/B mode no longer exists.
  kernel_tests 150 tests/kernels/test_attention_split_backward.py
  timeout 200 python3 -m benchmarks.ab --layers gat,gatv2,transformer --graphs rmat-large \
    --modes gnn_io_no_row_value,gnn_io --rounds 6 2>"$out/ab_stderr.txt" | tee "$out/ab_row_value.txt" | tail -4
  timeout 200 python3 -m benchmarks.ab --layers transformer,gatv2,sage_max --graphs rmat-arxiv \
    --modes gnn_io_cublas,gnn_io --rounds 30 2>>"$out/ab_stderr.txt" | tee "$out/ab_arxiv.txt" | tail -4
  harness_table 240 large --graphs rmat-large --layers gat,gatv2,transformer,sage_max --modes gnn_io --reps 10 \
    | grep "^| [a-zR]" | cut -d'|' -f2-12
elif [[ $what == session24e ]]; then
  # where SAGEConv max's step at arxiv size spends its CPU (sampler and cProfile, the forward op's callees);
  # the split GEMMs against cuBLAS in the SpMM layers on RMAT 2^20
  timeout 150 python3 -m benchmarks.cpu_profile --layer sage_max --graph rmat-arxiv --mode gnn_io --sampler --rows 40 \
    --callees "gather_scatter.py:.*(gather_scatter_forward),gather_scatter.py:.*(gather_scatter_backward_mm)" \
    >"$out/cpu_profile_sage_max.txt" 2>&1; head -3 "$out/cpu_profile_sage_max.txt"
  timeout 260 python3 -m benchmarks.ab --layers gcn,sage_mean,gin --graphs rmat-large \
    --modes gnn_io_cublas,gnn_io --rounds 6 2>"$out/ab_stderr.txt" | tee "$out/ab_spmm.txt" | tail -4
elif [[ $what == session24f ]]; then
  # the split GEMMs inside CUDA graph trees and compiled layers (thresholds lowered), then the harness lines of
  # GATConv (after the revert) and SAGEConv max against eager (the forward's error at full size)
  CI=1 GNN_IO_STRICT=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cudagraphs_cuda.py \
    tests/test_dense_gemm.py -k "x3 or compiled_layers or rewrites or leaves" 2>&1 | tee "$out/gpu_tests.txt" | tail -2
  harness_table 240 large --graphs rmat-large --layers gat,sage_max --modes eager,gnn_io --reps 10 \
    | grep "^| [a-zR]" | cut -d'|' -f5,6,8,13,16,19,20,21
elif [[ $what == session24g ]]; then
  # after the fixture fix: the split GEMM's kernel and pass tests on CUDA (compiled layers included)
  kernel_tests 200 tests/kernels/test_dense_triton.py tests/test_dense_gemm.py tests/test_gemm_accumulate.py
elif [[ $what == session24h ]]; then
  # the weight split once on the host (x3pre) against Triton's in-loop tf32x3: the tall products' launches
  # (run once, call 8: x3pre no faster and 1.3e-6 off float64 against 1.7e-7, so it was reverted; the benchmark
  # now sweeps tf32x3 and x3split again)
  for spec in "1048576 128 128" "1048576 128 512"; do
    set -- $spec
    timeout 250 python3 -m benchmarks.dense_ops --rows $1 --width $2 --x3 $3 2>&1 | tee "$out/x3_$1_$2_$3.txt" \
      | grep -v "^| --- " | grep -v nan | sort -t'|' -k2,2 -k4,4g | awk -F'|' '{ if (seen[$2]++ < 4) print }'
  done
elif [[ $what == session24i ]]; then
  # final state: the arxiv-size lines with and without CUDA graphs (the 512-wide maps take the split GEMM there),
  # and GATv2Conv and TransformerConv on RMAT 2^20 without call 4's row hoist
  harness_table 270 arxiv --graphs rmat-arxiv --layers transformer,gatv2,sage_max --modes gnn_io,gnn_io_cg --reps 20 \
    | grep "^| [a-zR]" | cut -d'|' -f5,8,13,16
  harness_table 200 large --graphs rmat-large --layers gatv2,transformer --modes gnn_io --reps 10 \
    | grep "^| [a-zR]" | cut -d'|' -f5,8,13,16,19
elif [[ $what == session24j ]]; then
  # GATConv's step on RMAT 2^20 kernel by kernel with the split GEMMs (what is left of the 10 ms target)
  timeout 200 python3 -m benchmarks.profile_layer --layer gat --graph rmat-large --mode gnn_io --rows 30 \
    >"$out/profile_gat.txt" 2>&1; grep -E "^== |Self CUDA time total" "$out/profile_gat.txt" | head -3
elif [[ $what == session24k ]]; then
  # _mm_kernel through fast_launch: its tests on CUDA, then the arxiv-size A/B of the 512-wide maps again
  kernel_tests 200 tests/kernels/test_dense_triton.py tests/test_dense_gemm.py
  timeout 200 python3 -m benchmarks.ab --layers transformer,gatv2 --graphs rmat-arxiv \
    --modes gnn_io_cublas,gnn_io --rounds 30 2>"$out/ab_stderr.txt" | tee "$out/ab_arxiv.txt" | tail -3
elif [[ $what == session25 ]]; then
  # the score fold (session 21: lost with cuBLAS's 144-column GEMMs) with the split GEMMs: A/B, fold profile
  timeout 300 python3 -m benchmarks.ab --layers gat --graphs rmat-large \
    --modes gnn_io,gnn_io_score_fold --rounds 8 2>"$out/ab_stderr.txt" | tee "$out/ab_fold.txt" | tail -3
  GNN_IO_SCORE_FOLD=1 timeout 200 python3 -m benchmarks.profile_layer --layer gat --graph rmat-large --mode gnn_io \
    --rows 30 >"$out/profile_gat_fold.txt" 2>&1; grep -E "^== |Self CUDA time total|_mm_kernel|triton_" \
    "$out/profile_gat_fold.txt" | head -12
elif [[ $what == session25b ]]; then
  # how much of GATConv's RMAT 2^20 step is the CPU's lead and gaps: CUDA graph trees replay it in one launch
  timeout 300 python3 -m benchmarks.ab --layers gat --graphs rmat-large \
    --modes gnn_io,gnn_io_cg --rounds 10 2>"$out/ab_stderr.txt" | tee "$out/ab_cg.txt" | tail -3
  harness_table 240 large --graphs rmat-large --layers gat --modes gnn_io,gnn_io_cg --reps 10 \
    | grep "^| [a-zR]" | cut -d'|' -f5,8,13,16,19
elif [[ $what == session25c ]]; then
  # gnn_io::linear_scores (the scores from the feature GEMM's tiles, their gradients inside the backward GEMMs)
  kernel_tests 200 tests/test_head_scores.py tests/kernels/test_dense_triton.py
  timeout 300 python3 -m benchmarks.ab --layers gat --graphs rmat-large \
    --modes gnn_io_no_score_epilogue,gnn_io_score_epilogue --rounds 10 2>"$out/ab_stderr.txt" \
    | tee "$out/ab_epilogue.txt" | tail -3
  GNN_IO_SCORE_FOLD=epilogue timeout 200 python3 -m benchmarks.profile_layer --layer gat --graph rmat-large \
    --mode gnn_io --rows 30 >"$out/profile_gat_epilogue.txt" 2>&1; grep -E "^== |Self CUDA time total|_mm_kernel|triton_" \
    "$out/profile_gat_epilogue.txt" | cut -c1-60,150-200 | head -12
elif [[ $what == session25d ]]; then
  timeout 200 python3 -m benchmarks.head_scores_ops 2>&1 | tee "$out/head_scores_ops.txt" | tail -12
elif [[ $what == session25e ]]; then
  timeout 200 python3 -m benchmarks.head_scores_ops 2>&1 | tee "$out/head_scores_ops.txt" | tail -13
  timeout 300 python3 -m benchmarks.ab --layers gat --graphs rmat-large \
    --modes gnn_io_no_score_epilogue,gnn_io_score_epilogue --rounds 10 2>"$out/ab_stderr.txt" \
    | tee "$out/ab_epilogue.txt" | tail -1
elif [[ $what == session25f ]]; then
  timeout 150 python3 -m benchmarks.gpu_gaps --layer gat --graph rmat-large 2>&1 | tee "$out/gaps_gat.txt" \
    | grep -v Warn | tail -24
  timeout 150 python3 -m benchmarks.gpu_gaps --layer transformer --graph rmat-arxiv 2>&1 \
    | tee "$out/gaps_transformer_arxiv.txt" | grep -A12 "^| step" | tail -12
elif [[ $what == session25g ]]; then
  kernel_tests 240 tests/test_head_scores.py tests/test_score_fold.py tests/test_dense_gemm.py \
    tests/gpu/test_cudagraphs_cuda.py
  harness_table 300 large --graphs rmat-large --layers gat --modes eager,inductor,gnn_io --reps 10 \
    | grep "^| [a-zR]" | cut -d'|' -f5-10,14-16,19-22
  timeout 150 python3 -m benchmarks.gpu_gaps --layer gat --graph rmat-large 2>&1 | tee "$out/gaps_gat.txt" \
    | grep -v -i warn | tail -16
elif [[ $what == session25h ]]; then
  timeout 150 python3 -m benchmarks.gpu_gaps --layer gat --graph rmat-large 2>&1 | tee "$out/gaps_gat.txt" \
    | grep -v -i warn | tail -14
elif [[ $what == session25i ]]; then
  timeout 120 python3 -m benchmarks.linear_scores_overhead 2>&1 | tee "$out/linear_scores_overhead.txt" | tail -9
elif [[ $what == session25j ]]; then
  timeout 300 python3 -m benchmarks.ab --layers gat --graphs rmat-large --modes gnn_io,gnn_io_one_pass --rounds 8 \
    2>"$out/ab_stderr.txt" | tee "$out/ab_one_pass.txt" | tail -1
elif [[ $what == session25k ]]; then
  GNN_IO_SCORE_FOLD=0 harness_table 200 memory_off --graphs rmat-large --layers gat --modes gnn_io --reps 10 \
    | grep "^| [a-zR]" | cut -d'|' -f5,8,11,14-16,19-21
  harness_table 200 memory_on --graphs rmat-large --layers gat --modes gnn_io --reps 10 \
    | grep "^| [a-zR]" | cut -d'|' -f5,8,11,14-16,19-21
elif [[ $what == session25l ]]; then
  timeout 280 python3 -m benchmarks.memory_anatomy --layers gat --graph rmat-large \
    --modes gnn_io_no_score_epilogue,gnn_io --rows 14 >"$out/memory_anatomy_gat.txt" 2>&1
  grep -v -i warn "$out/memory_anatomy_gat.txt" | tail -45
elif [[ $what == session25m ]]; then
  # owed by session 25 (its device time ran out): the version that keeps no h, tests, step memory both ways, A/B
  kernel_tests 100 tests/test_head_scores.py
  harness_table 150 memory_on --graphs rmat-large --layers gat --modes gnn_io --reps 10 \
    | grep "^| [a-zR]" | cut -d'|' -f5,8,11,14-16,19-21
  GNN_IO_SCORE_FOLD=0 harness_table 150 memory_off --graphs rmat-large --layers gat --modes gnn_io --reps 10 \
    | grep "^| [a-zR]" | cut -d'|' -f5,8,11,14-16,19-21
  timeout 300 python3 -m benchmarks.ab --layers gat --graphs rmat-large \
    --modes gnn_io_no_score_epilogue,gnn_io_score_epilogue --rounds 10 2>"$out/ab_stderr.txt" \
    | tee "$out/ab_epilogue.txt" | tail -1
elif [[ $what == session26 ]]; then
  # GAT's dst score terms from the forward's mass (GNN_IO_ATTENTION_BACKWARD auto = mass): CUDA tests, A/B on RMAT 2^20
  kernel_tests 280 tests/kernels/test_attention_mass.py tests/kernels/test_attention_split_backward.py \
    tests/kernels/test_attention_delta.py tests/test_direct_ops.py
  timeout 300 python3 -m benchmarks.ab --layers gat --graphs rmat-large \
    --modes gnn_io_one_pass_segment,gnn_io --rounds 10 2>"$out/ab_stderr.txt" | tee "$out/ab_mass.txt" | tail -1
elif [[ $what == session26p ]]; then
  # the mass form against the segment form, kernel by kernel (GAT, RMAT 2^20)
  for mode in gnn_io gnn_io_one_pass_segment; do
    timeout 120 python3 -m benchmarks.profile_layer --layer gat --graph rmat-large --mode $mode --rows 16 \
      >"$out/profile_gat_$mode.txt" 2>&1; grep -A 20 "^==" "$out/profile_gat_$mode.txt" | cut -c1-60,100-175 | head -24
  done
elif [[ $what == session26q ]]; then
  # the mass form's kernels alone, by launch (GAT, RMAT 2^20): forward with the mass, D, the src pass
  timeout 400 python3 -m benchmarks.probe --parts mass_launch --graphs rmat-large --attention-graphs rmat-large \
    --out "$out/mass_launch" >"$out/mass_launch.txt" 2>&1; grep "^| mass_launch\|rror" "$out/mass_launch.txt" | cut -c1-200
elif [[ $what == session26r ]]; then
  # session 26's kernels and A/B of GAT's exact-maximum forward (GNN_IO_ATTENTION_MAX) against the running maximum:
  # that variant was removed after them (no step gain); results in docs/benchmarks/session26/
  echo "$what: its variant is gone (docs/benchmarks/session26/README.md, section 3)" >&2; exit 2
elif [[ $what == session26c ]]; then
  # the segment form against the mass form on RMAT 2^20, uniform and grid (call 9 ran this with the exact maximum,
  # since removed, on the mass side, and a 16-round exact-against-running A/B first)
  timeout 360 python3 -m benchmarks.ab --layers gat --graphs rmat-large,uniform-large,grid-large \
    --modes gnn_io_one_pass_segment,gnn_io --rounds 8 2>"$out/ab_stderr.txt" | tee "$out/ab_session.txt" | tail -3
elif [[ $what == session26b ]]; then
  # after this session's changes: the CUDA tests of every file they touch, then the step memory with the mass form
  # and with the segment form (harness, each setting in its own process)
  kernel_tests 330 tests/kernels/test_attention_triton.py tests/kernels/test_attention_mass.py \
    tests/kernels/test_attention_delta.py tests/kernels/test_attention_split_backward.py tests/test_packed_grads.py \
    tests/test_projected_grads.py tests/test_direct_ops.py
  harness_table 100 memory_mass --graphs rmat-large --layers gat --modes gnn_io --reps 10 \
    | grep "^| [a-zR]" | cut -d'|' -f5,8,11,14-16,19-21
  GNN_IO_ATTENTION_BACKWARD=one_pass_segment harness_table 100 memory_segment --graphs rmat-large --layers gat \
    --modes gnn_io --reps 10 | grep "^| [a-zR]" | cut -d'|' -f5,8,11,14-16,19-21
elif [[ $what == session26d ]]; then
  # the closing table: GATConv on RMAT 2^20 against PyG eager and torch.compile default, the final code
  harness_table 500 gat_final --graphs rmat-large --layers gat --modes eager,inductor,gnn_io --reps 10 \
    | grep "^| [a-zR]" | cut -d'|' -f5-16,19-21
elif [[ $what == session26e ]]; then
  # the mass form where float32 GATConv is fused at about 1M edges (RMAT 2^17 and 2^18), against the segment form
  timeout 400 python3 -m benchmarks.ab --layers gat --graphs rmat-arxiv,rmat-18-1200000 \
    --modes gnn_io_one_pass_segment,gnn_io --rounds 20 2>"$out/ab_stderr.txt" | tee "$out/ab_small.txt" | tail -2
elif [[ $what == session26f ]]; then
  # register caps (maxnreg) on GAT's forward and src pass, and the registers each compiled variant uses
  timeout 300 python3 -m benchmarks.probe --parts mass_launch --graphs rmat-large --attention-graphs rmat-large \
    --out "$out/mass_launch" >"$out/mass_launch.txt" 2>&1; grep "^| mass_launch\|rror" "$out/mass_launch.txt" | cut -c1-220
elif [[ $what == session26g ]]; then
  # the src pass under a 56-register cap (call 12: 2.67 against 3.00 ms alone): the GATConv step, A/B
  timeout 250 python3 -m benchmarks.ab --layers gat --graphs rmat-large \
    --modes gnn_io,gnn_io_src_maxnreg56 --rounds 12 2>"$out/ab_stderr.txt" | tee "$out/ab_maxnreg.txt" | tail -1
elif [[ $what == session26h ]]; then
  # the src pass under a 56-register cap: split-backward CUDA tests, A/B on the uniform and grid graphs
  kernel_tests 150 tests/kernels/test_attention_split_backward.py tests/kernels/test_attention_mass.py
  timeout 250 python3 -m benchmarks.ab --layers gat --graphs uniform-large,grid-large \
    --modes gnn_io_src_uncapped,gnn_io --rounds 8 2>"$out/ab_stderr.txt" | tee "$out/ab_maxnreg2.txt" | tail -2
elif [[ $what == session27 ]]; then
  # RMAT 2^17 steps bound by the CPU: where the CPU time goes, the autograd engine's device thread included
  # (stack sampler --all-threads), and the steps with and without CUDA graphs (harness, each in its own process)
  for layer in sage_max transformer; do
    timeout 120 python3 -m benchmarks.cpu_profile --layer $layer --graph rmat-arxiv --mode gnn_io --rows 70 --sampler \
      --all-threads >"$out/sampled_$layer.txt" 2>&1; grep "^==" "$out/sampled_$layer.txt"
  done
  harness_table 300 arxiv --graphs rmat-arxiv --layers sage_max,transformer --modes inductor,gnn_io,gnn_io_cg \
    --reps 20 | grep "^| [a-zR]" | cut -d'|' -f2-8
elif [[ $what == session27b ]]; then
  # the tall float32 GEMMs: the tile kernel and the weight-stationary persistent kernel at each launch
  # (kernels/dense_triton.py); as call 2 ran it, it also timed the tile kernel with its split made in the kernel and
  # the products chained (x3round, since removed: slower and less accurate, docs/dense.md)
  for shape in "1048576 128 128" "131072 128 128" "1048576 128 512" "131072 128 512"; do
    set -- $shape
    timeout 150 python3 -m benchmarks.dense_ops --rows $1 --width $2 --stationary $3 >"$out/stationary_$1_$3.txt" 2>&1
    sort -t'|' -k4 -n "$out/stationary_$1_$3.txt" | grep "^| [fd]" | awk -F'|' '{print $2"|"$3"|"$4"|"$5}' \
      | sort -t'|' -k1,1 -k3n | awk -F'|' '$1 != prev {n=0} {prev=$1; if (n++ < 4 || $2 ~ /used|cuBLAS|round/) print}'
  done
elif [[ $what == session27c ]]; then
  # the weight-stationary kernel as the default for tall float32 products (GNN_IO_FP32_GEMM=x3): its launches, the
  # CUDA tests of the files it touches, then the step against session 24's tile kernel (x3tile), A/B (call 3 ran it
  # with the tall threshold lowered to 2^31 for the stationary kernel: the RMAT 2^17 rows; reverted after)
  for shape in "1048576 128 128" "131072 128 128"; do
    set -- $shape
    timeout 100 python3 -m benchmarks.dense_ops --rows $1 --width $2 --stationary $3 >"$out/stationary_$1_$3.txt" 2>&1
    grep "^| [fd]" "$out/stationary_$1_$3.txt" | awk -F'|' '{print $2"|"$3"|"$4"|"$5}' | sort -t'|' -k1,1 -k3n \
      | awk -F'|' '$1 != prev {n=0} {prev=$1; if (n++ < 3 || $2 ~ /tile|cuBLAS/) print}'
  done
  kernel_tests 200 tests/kernels/test_dense_triton.py tests/test_dense_gemm.py tests/test_head_scores.py \
    tests/test_gemm_accumulate.py tests/gpu/test_cudagraphs_cuda.py
  timeout 200 python3 -m benchmarks.ab --layers gat,sage_max --graphs rmat-large --modes gnn_io_x3tile,gnn_io \
    --rounds 6 2>"$out/ab_stderr.txt" | tee "$out/ab_large.txt" | tail -2
  timeout 120 python3 -m benchmarks.ab --layers sage_max,transformer --graphs rmat-arxiv --modes gnn_io_x3tile,gnn_io \
    --rounds 20 2>>"$out/ab_stderr.txt" | tee "$out/ab_arxiv.txt" | tail -2
elif [[ $what == session27d ]]; then
  # the weight-stationary kernel with its inner range summed by chunks on the CUDA cores (accuracy of the tile
  # kernel?): launches and errors, the CUDA tests, the step against the tile kernel across layers (A/B)
  for shape in "1048576 128 128" "1048576 128 512"; do
    set -- $shape
    timeout 100 python3 -m benchmarks.dense_ops --rows $1 --width $2 --stationary $3 >"$out/stationary_$1_$3.txt" 2>&1
    grep "^| [fd]" "$out/stationary_$1_$3.txt" | awk -F'|' '{print $2"|"$3"|"$4"|"$5}' | cut -c1-90
  done
  kernel_tests 200 tests/kernels/test_dense_triton.py tests/test_dense_gemm.py tests/test_head_scores.py \
    tests/test_gemm_accumulate.py tests/gpu/test_cudagraphs_cuda.py
  timeout 280 python3 -m benchmarks.ab --layers gat,sage_max,gcn,transformer --graphs rmat-large \
    --modes gnn_io_x3tile,gnn_io --rounds 4 2>"$out/ab_stderr.txt" | tee "$out/ab_large.txt" | tail -4
elif [[ $what == session27e ]]; then
  # the closing table: GATConv and SAGEConv max on RMAT 2^20 against PyG eager and torch.compile default, with session
  # 24's tile kernel (x3tile) in the same processes
  harness_table 480 closing --graphs rmat-large --layers gat,sage_max --modes eager,inductor,gnn_io_x3tile,gnn_io \
    --reps 10 | grep "^| [a-zR]" | cut -d'|' -f5-16,19-23
elif [[ $what == session27f ]]; then
  # the weight-stationary kernel with the bias loaded once per program (call 4: the forward, with a bias, took 0.69 ms
  # at inner chunks of 32 against 0.55 for the input gradient, without): launches and errors, the dense CUDA tests
  timeout 100 python3 -m benchmarks.dense_ops --rows 1048576 --width 128 --stationary 128 \
    >"$out/stationary_1048576_128.txt" 2>&1
  grep "^| [fd]" "$out/stationary_1048576_128.txt" | awk -F'|' '{print $2"|"$3"|"$4"|"$5}' | cut -c1-90
  kernel_tests 150 tests/kernels/test_dense_triton.py tests/test_head_scores.py
elif [[ $what == session27g ]]; then
  # final code (bias loaded once, two programs per SM): the step against session 24's tile kernel, A/B
  timeout 250 python3 -m benchmarks.ab --layers gat,sage_max --graphs rmat-large --modes gnn_io_x3tile,gnn_io \
    --rounds 4 2>"$out/ab_stderr.txt" | tee "$out/ab_large.txt" | tail -2
elif [[ $what == session27h ]]; then
  # final code: the CUDA tests of the GEMM files (and GATConv, SAGEConv max, TransformerConv in CUDA graph trees with
  # every GEMM on the kernels), then the 128 -> 512 map's launches with chunks of 32 and the bias loaded once
  kernel_tests 260 tests/kernels/test_dense_triton.py tests/test_dense_gemm.py tests/test_head_scores.py \
    tests/test_gemm_accumulate.py tests/gpu/test_cudagraphs_cuda.py
  timeout 80 python3 -m benchmarks.dense_ops --rows 1048576 --width 128 --stationary 512 \
    >"$out/stationary_1048576_512.txt" 2>&1
  grep "^| [fd]" "$out/stationary_1048576_512.txt" | awk -F'|' '{print $2"|"$3"|"$4"|"$5}' | cut -c1-90
elif [[ $what == session28 ]]; then
  # owed by session 27 (docs/benchmarks/session27/README.md, "Next"): what GAT's epilogue terms cost on each tall
  # kernel, alone; then the CUDA tests, GATConv's step A/B and its profile. Session 28's call 1 also ran the
  # per-row-tile epilogue (GNN_IO_STATIONARY_HOIST=0, harness mode gnn_io_epilogue_loop), removed after that call
  for setting in x3tile x3; do
    GNN_IO_FP32_GEMM=$setting timeout 120 python3 -m benchmarks.head_scores_ops >"$out/head_scores_$setting.txt" 2>&1
    echo "== $setting"; grep "^| [fd]" "$out/head_scores_$setting.txt"
  done
  kernel_tests 150 tests/kernels/test_dense_triton.py tests/test_head_scores.py
  timeout 200 python3 -m benchmarks.ab --layers gat --graphs rmat-large --modes gnn_io_x3tile,gnn_io \
    --rounds 4 2>"$out/ab_stderr.txt" | tee "$out/ab_gat.txt" | tail -2
  timeout 100 python3 -m benchmarks.profile_layer --layer gat --graph rmat-large --mode gnn_io --rows 16 \
    >"$out/profile_gat.txt" 2>&1; grep -E "^== |kernel|Self CUDA time total" "$out/profile_gat.txt" | head -16
elif [[ $what == session28b ]]; then
  # ran once (session 28, call 2): the weight gradient by a wide kernel (full-width output tiles, the split made in
  # the kernel) against the split launch, `dense_ops --wide`; 1.1-2.2x slower, removed after. The code is commit 6538c36
  echo "session28b: removed after its call; docs/dense.md and docs/benchmarks/session28/call2_wide_*.txt have it" >&2
  exit 2
elif [[ $what == session28c ]]; then
  # RMAT 2^17 (arxiv-size): where TransformerConv's and GATv2Conv's GPU time goes (targets 2.5 and 3.5 ms a step)
  for layer in transformer gatv2; do
    timeout 120 python3 -m benchmarks.profile_layer --layer $layer --graph rmat-arxiv --mode gnn_io --rows 40 \
      >"$out/profile_${layer}_arxiv.txt" 2>&1
    grep -E "^== |Self CUDA time total" "$out/profile_${layer}_arxiv.txt" | head -3
    awk '/Self CUDA %/{n++} n==1' "$out/profile_${layer}_arxiv.txt" | grep -v "^ *gnn_io::\|^ *##\|autograd\|Compiled\|Torch-Compiled" \
      | awk '{print $1, $(NF-3), $NF}' | head -30
  done
elif [[ $what == session28d ]]; then
  # ran once (session 28, call 4): under CUDA graph trees, the weight-stationary kernel's tall products from 2^31
  # multiply-adds at RMAT 2^17, A/B against the same replays with cuBLAS (harness mode gnn_io_cg_cublas): SAGEConv
  # max 0.88x, GATv2Conv 0.97x, TransformerConv and GATConv ties; reverted (commit a22074c has it)
  echo "session28d: reverted after its call; docs/dense.md and docs/benchmarks/session28/call4_*.txt have it" >&2
  exit 2
elif [[ $what == session28e ]]; then
  # final code: the GEMM and CUDA-graph tests on CUDA, then the closing table (GATConv and SAGEConv max on RMAT 2^20
  # against PyG eager and torch.compile default)
  kernel_tests 200 tests/kernels/test_dense_triton.py tests/test_dense_gemm.py tests/test_head_scores.py \
    tests/test_gemm_accumulate.py tests/gpu/test_cudagraphs_cuda.py
  harness_table 330 closing --graphs rmat-large --layers gat,sage_max --modes eager,inductor,gnn_io \
    --reps 10 | grep "^| [a-zR]" | cut -d'|' -f5-16,19-23
elif [[ $what == session28f ]]; then
  # session28e's tests again, with the time they need (its 200 s cut them at about 75%)
  kernel_tests 330 tests/kernels/test_dense_triton.py tests/test_dense_gemm.py tests/test_head_scores.py \
    tests/test_gemm_accumulate.py tests/gpu/test_cudagraphs_cuda.py
elif [[ $what == session28g ]]; then
  # the weight gradient's split launch (128, 64, 32, 4, 4; 132 pieces since session 24) against more launches and
  # piece counts, 128 -> 128 and 128 -> 512 at 2^20 rows
  for width in 128 512; do
    timeout 250 python3 -m benchmarks.dense_ops --rows 1048576 --width 128 --x3 $width --only wgrad \
      >"$out/wgrad_$width.txt" 2>&1
    grep "^| w" "$out/wgrad_$width.txt" | sort -t'|' -k4 -n | head -8 | cut -c1-100
  done
elif [[ $what == session28h ]]; then
  # ran once (session 28, calls 8-9): bias gradients summed by their weight gradient's split launch
  # (gnn_io::mm_rowsum), A/B on RMAT 2^20 against Inductor's reductions: SAGEConv max, GINConv and TransformerConv
  # all 1.00x over 14 rounds; reverted (commit 29cae44 has it)
  echo "session28h: reverted after its calls; docs/dense.md and docs/benchmarks/session28/call8_*, call9_* have it" >&2
  exit 2
elif [[ $what == session29 ]]; then
  # every CUDA test outside tests/gpu (session 29's call 1 ran tests/gpu whole: 5 failures, fixed since): the kernel
  # files and the top-level files with CUDA tests, failures listed at the end (-rf). The timeout interrupts (SIGINT):
  # pytest then still prints the failures' summary (call 5 ran out at 90% with SIGTERM and lost its one failure's name)
  CI=1 GNN_IO_STRICT=1 timeout -s INT 540 python3 -m pytest -q -rf -p no:cacheprovider tests/kernels tests/test_dense_gemm.py \
    tests/test_head_scores.py tests/test_gemm_accumulate.py tests/test_score_fold.py tests/test_projected_grads.py \
    tests/test_packed_grads.py tests/test_direct_ops.py tests/test_linear_fusion.py tests/test_gather_linear.py \
    -k "not interpreter" 2>&1 | tee "$out/gpu_tests.txt" | grep -v "^[.sF]*  *\[" | tail -25
elif [[ $what == session30a ]]; then
  # benchmarks/std_noise.py: who is closer to exact where the std layers' compile and eager float32 differ
  PYTHONPATH=. timeout -s INT 400 python3 -m benchmarks.std_noise --calls 50 2>&1 | tee "$out/std_noise.txt" | tail -40
elif [[ $what == session30b ]]; then
  # session 29's call 1 (default harness, one process) had SAGEConv mean on ca-AstroPh at 1.77 ms against Inductor's
  # 0.90, isolated 1.03 against 1.46: the default harness's first two graphs in one process, twice, then the
  # interleaved A/B (benchmarks/ab.py) of the small graphs' rows
  for run in 1 2; do
    python3 -m benchmarks.harness --graphs Planetoid-Cora,ca-AstroPh --out "$out/harness$run" 2>"$out/harness$run.err" \
      | grep "^| [cC]" | cut -d'|' -f2-10
  done
  python3 -m benchmarks.ab --layers sage_mean,gin --graphs ca-AstroPh --rounds 100 2>"$out/ab.err" | tee "$out/ab.txt" | tail -6
elif [[ $what == session30c ]]; then
  # GATConv's step on RMAT 2^20 is 10.02-10.11 ms of wall time for 9.13 ms of kernels: any host synchronisation
  # inside a step (the CPU-bound arxiv steps too) leaves the GPU idle while the CPU refills its queue
  timeout -s INT ${SECONDS_LIMIT:-300} python3 -m benchmarks.sync_probe ${CASES:+--cases $CASES} 2>"$out/sync_probe.err" \
    | tee "$out/sync_probe.txt" | tail -60
elif [[ $what == session30d ]]; then
  # session 30's CPU sweep as a CUDA test: one compiled layer across awkward graphs (kernels forced), with the
  # default and with dynamic=True (fixed on CPU in session 30: the attention rewrites were lost there)
  CI=1 timeout -s INT 500 python3 -m pytest -q -rf -p no:cacheprovider tests/models/test_graph_shapes.py -k cuda 2>&1 \
    | tee "$out/gpu_tests.txt" | tail -15
elif [[ $what == session31a ]]; then
  # session30d failed GCN, SAGE mean and GIN on CUDA: cusparseCreateCsr refused 24 entries in a 4 x 4 matrix (20
  # duplicate edges); now the reference path. Then the multi-aggregation case session 30 moved to the float64 rule
  CI=1 timeout -s INT 450 python3 -m pytest -q -rf -p no:cacheprovider tests/kernels/test_ops.py \
    tests/models/test_graph_shapes.py -k cuda 2>&1 | tee "$out/gpu_tests.txt" | tail -6
  CI=1 GNN_IO_STRICT=1 timeout -s INT 100 python3 -m pytest -q -rf -p no:cacheprovider \
    tests/kernels/test_gather_scatter_triton.py -k "share_one_pass" 2>&1 | tee "$out/gpu_tests_share.txt" | tail -4
elif [[ $what == session31b ]]; then
  # the rows an output or gradient needs zeroed before its kernels (no entries; hub rows whose items add) are listed
  # once per graph, not found by a scan of every row per call: GATConv's forward on RMAT 2^20 ran three 2^20-row
  # scans (26 us each, session 28's profile) that wrote nothing (every row has its self loop)
  CI=1 GNN_IO_STRICT=1 timeout -s INT 240 python3 -m pytest -q -rf -p no:cacheprovider tests/kernels/test_spmm_triton.py \
    tests/kernels/test_attention_split_backward.py tests/gpu/test_attention_cuda.py tests/gpu/test_gather_scatter_cuda.py \
    -k "not interpreter" 2>&1 | tee "$out/gpu_tests.txt" | tail -4
  timeout -s INT 200 python3 -m benchmarks.ab --layers gat --graphs rmat-large --modes gnn_io_scan_fill,gnn_io \
    --rounds 60 2>"$out/ab_large.err" | tee "$out/ab_large.txt" | tail -3
  timeout -s INT 150 python3 -m benchmarks.ab --layers transformer,sage_max,gatv2 --graphs rmat-arxiv \
    --modes gnn_io_scan_fill,gnn_io --rounds 60 2>"$out/ab_arxiv.err" | tee "$out/ab_arxiv.txt" | tail -5
elif [[ $what == session31c ]]; then
  CI=1 GNN_IO_STRICT=1 timeout -s INT 120 python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_gather_scatter_cuda.py \
    -k "not interpreter" 2>&1 | tee "$out/gpu_tests_gather_scatter.txt" | tail -2
  harness_table 200 closing --graphs rmat-large --layers gat --modes eager,inductor,gnn_io --reps 10 \
    | grep "^| [a-zR]" | cut -d'|' -f5-16,19-23
  CI=1 timeout -s INT 230 python3 -m pytest -q -rf -p no:cacheprovider tests/models/test_graph_shapes.py -k cuda 2>&1 \
    | tee "$out/gpu_tests_graph_shapes.txt" | tail -2
elif [[ $what == session32a ]]; then
  # session31d: GATConv and GATv2Conv with edge_dim failed on the graph of self loops only (Inductor's launch of a
  # 0-row scatter, ZeroDivisionError in Grid2DWithYZOverflow); gnn_inductor/inductor_fixes.py keeps z >= 1
  CI=1 timeout -s INT 200 python3 -m pytest -q -rf -p no:cacheprovider tests/test_inductor_fixes.py \
    tests/models/test_graph_shapes.py -k "cuda and (test_self_loop_fill or gat_edge_attr or gatv2_edge_attr)" \
    2>&1 | tee "$out/gpu_tests.txt" | tail -4
  timeout -s INT 120 python3 - <<'PY' 2>&1 | tee "$out/default_compile.txt" | tail -4
import torch
from torch_geometric.nn import GATConv
torch._dynamo.config.capture_dynamic_output_shape_ops = True  # as the backend sets it (else a graph break)
model = GATConv(8, 3, heads=2, edge_dim=4).cuda()
compiled = torch.compile(model)
for name, ei in [("random", torch.randint(0, 6, (2, 20))), ("self_loops_only", torch.arange(6).repeat(2, 1))]:
    ei = ei.cuda()
    try:
        out = compiled(torch.randn(6, 8, device="cuda"), ei, torch.randn(ei.shape[1], 4, device="cuda"))
        torch.cuda.synchronize()
        print(f"torch.compile default, GATConv(edge_dim=4), {name}: ran")
    except Exception as exc:  # noqa: BLE001
        print(f"torch.compile default, GATConv(edge_dim=4), {name}: {type(exc).__name__}: {str(exc)[:120]}")
PY
elif [[ $what == session41f ]]; then
  # the last review's change (the identity order's format kept for a dropped order, not rebuilt): the CUDA tests of
  # the attention paths and reordering
  CI=1 GNN_IO_STRICT=1 TORCHINDUCTOR_COMPILE_THREADS=8 timeout 200 python3 -m pytest -q -p no:cacheprovider \
    tests/kernels/test_attention_paths.py tests/test_reorder.py -k 'not interpreter' 2>&1 | tee $out/gpu_tests_6.txt | tail -2
elif [[ $what == session41e ]]; then
  # session 41's final code: the CUDA tests of the projected and packed gradients and CUDA graphs (whose unforced
  # cases run the chooser), as session41b ran them before the chooser's changes
  CI=1 GNN_IO_STRICT=1 TORCHINDUCTOR_COMPILE_THREADS=8 timeout 330 python3 -m pytest -q -p no:cacheprovider \
    tests/test_projected_grads.py tests/test_packed_grads.py tests/gpu/test_cudagraphs_cuda.py -k 'not interpreter' \
    2>&1 | tee $out/gpu_tests_5.txt | tail -2
elif [[ $what == session41d ]]; then
  # the uniform graph's order under session 41's rule (predicted 2% in session 40: now off), bf16 and TF32
  # TransformerConv, reordering forced off against the pick, interleaved, each mode's pick printed
  export TORCHINDUCTOR_COMPILE_THREADS=8
  for prec in "--dtype bfloat16" "--tf32"; do
    timeout 260 python3 -m benchmarks.ab --layers transformer --graphs uniform-large --modes gnn_io_reorder_off,gnn_io \
      $prec --rounds 20 2>>$out/ab_stderr.txt | tee -a $out/ab_uniform_order.txt | grep -- "^-- gnn_io:\|^| uni"
  done
  (cd "$out" && tar czf session41d.tgz ab*.txt && rm -f ab*.txt)
elif [[ $what == session41c ]]; then
  # session 41's two chooser changes (one GPU): a block or hybrid candidate predicted within 15% behind CSR is timed
  # against it (bf16 tu-batch GATConv: predicted 7-10% behind, measured 8% ahead per step in session41a/b), and an
  # order needs a predicted and a measured gain of 5% (the uniform graph's 2% order is off; the block model's rcm
  # stays). The CUDA tests of the paths, block GAT kernels and reordering; then interleaved, each mode's pick printed
  export TORCHINDUCTOR_COMPILE_THREADS=8
  CI=1 GNN_IO_STRICT=1 timeout 250 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_paths.py \
    tests/kernels/test_block_sparse_gat.py tests/test_reorder.py -k 'not interpreter' 2>&1 | tee $out/gpu_tests_4.txt | tail -2
  for b in gnn_io_csr gnn_io_hybrid; do
    timeout 100 python3 -m benchmarks.ab --layers gat --graphs tu-batch --modes $b,gnn_io --dtype bfloat16 \
      --rounds 100 2>>$out/ab_stderr.txt | tee $out/ab_tu_gat_${b}_bf16.txt | grep -- "^-- gnn_io:\|^| tu"
  done
  timeout 120 python3 -m benchmarks.ab --layers transformer --graphs sbm-dense --modes gnn_io_reorder_off,gnn_io \
    --dtype bfloat16 --rounds 30 2>>$out/ab_stderr.txt | tee $out/ab_sbm_reorder_bf16.txt | grep -- "^-- gnn_io:\|^| sbm"
  (cd "$out" && tar czf session41c.tgz ab*.txt gpu_tests_*.txt && rm -f ab*.txt gpu_tests_*.txt)
elif [[ $what == session41a ]]; then
  # session41 on one GPU (session 41 was offered kind nvidia-h200 only), first of two calls, one step after another:
  # the CUDA tests of the attention paths, block GAT kernels, reordering, SpMM paths and block kernels on the final
  # code; then bf16 GATConv on tu-batch, the pick against the hybrid forced, interleaved
  export TORCHINDUCTOR_COMPILE_THREADS=8
  CI=1 GNN_IO_STRICT=1 timeout 260 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_paths.py \
    tests/kernels/test_block_sparse_gat.py tests/test_reorder.py -k 'not interpreter' 2>&1 | tee $out/gpu_tests_1.txt | tail -2
  CI=1 GNN_IO_STRICT=1 timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_spmm_paths.py \
    tests/kernels/test_block_sparse_spmm.py tests/kernels/test_block_sparse.py -k 'not interpreter' 2>&1 \
    | tee $out/gpu_tests_2.txt | tail -2
  timeout 200 python3 -m benchmarks.ab --layers gat --graphs tu-batch --modes gnn_io_hybrid,gnn_io \
    --dtype bfloat16 --rounds 100 2>$out/ab0_stderr.txt | tee $out/ab_tu_gat_hybrid_bf16.txt | tail -4
  (cd "$out" && tar czf session41a.tgz ab*.txt gpu_tests_*.txt && rm -f ab*.txt gpu_tests_*.txt)
elif [[ $what == session41b ]]; then
  # second of the two: the CUDA tests of the projected and packed gradients and CUDA graphs (session 40's call 6
  # cut them at 150 s); bf16 tu-batch GATConv, the pick against the block path forced; bf16 TransformerConv on the
  # uniform graph, reordering (degree order) off against on, interleaved (predicted gain 0.19 ms, first call 0.04)
  export TORCHINDUCTOR_COMPILE_THREADS=8
  CI=1 GNN_IO_STRICT=1 timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_projected_grads.py \
    tests/test_packed_grads.py tests/gpu/test_cudagraphs_cuda.py -k 'not interpreter' 2>&1 \
    | tee $out/gpu_tests_3.txt | tail -2
  timeout 120 python3 -m benchmarks.ab --layers gat --graphs tu-batch --modes gnn_io_block,gnn_io \
    --dtype bfloat16 --rounds 100 2>$out/ab1_stderr.txt | tee $out/ab_tu_gat_block_bf16.txt | tail -4
  timeout 130 python3 -m benchmarks.ab --layers transformer --graphs uniform-large \
    --modes gnn_io_reorder_off,gnn_io --dtype bfloat16 --rounds 50 2>$out/ab2_stderr.txt \
    | tee $out/ab_uniform_reorder_bf16.txt | tail -4
  (cd "$out" && tar czf session41b.tgz ab*.txt gpu_tests_*.txt && rm -f ab*.txt gpu_tests_*.txt)
elif [[ $what == session41 ]]; then
  # session 40's form (kind nvidia-h200-x4, four lanes; session 41 ran it as session41a and session41b): lane 0, bf16 GATConv on tu-batch, the pick (CSR) against
  # the hybrid forced (the harness had the hybrid 10% ahead of CSR forced, inside the spread of the CSR columns) and
  # against the block path forced; lanes 1 and 2, the CUDA tests of the attention paths, block kernels, reordering,
  # SpMM paths, projected and packed gradients and CUDA graphs on the final code; lane 3, bf16 TransformerConv on
  # the uniform graph, reordering on (degree order) against off, interleaved (predicted gain 0.19 ms, first-call
  # timing 0.04)
  four_gpus session41
  lane 0 "timeout 300 python3 -m benchmarks.ab --layers gat --graphs tu-batch --modes gnn_io_hybrid,gnn_io \
      --dtype bfloat16 --rounds 100 2>$out/ab0_stderr.txt | tee $out/ab_tu_gat_hybrid_bf16.txt | tail -4
    timeout 200 python3 -m benchmarks.ab --layers gat --graphs tu-batch --modes gnn_io_block,gnn_io \
      --dtype bfloat16 --rounds 100 2>>$out/ab0_stderr.txt | tee $out/ab_tu_gat_block_bf16.txt | tail -4" &
  lane 1 "CI=1 GNN_IO_STRICT=1 timeout 500 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_paths.py \
    tests/kernels/test_block_sparse_gat.py tests/test_reorder.py -k 'not interpreter' 2>&1 | tee $out/gpu_tests_1.txt | tail -2" &
  lane 2 "CI=1 GNN_IO_STRICT=1 timeout 500 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_spmm_paths.py \
    tests/kernels/test_block_sparse_spmm.py tests/kernels/test_block_sparse.py tests/test_projected_grads.py \
    tests/test_packed_grads.py tests/gpu/test_cudagraphs_cuda.py -k 'not interpreter' 2>&1 \
    | tee $out/gpu_tests_2.txt | tail -2" &
  lane 3 "timeout 300 python3 -m benchmarks.ab --layers transformer --graphs uniform-large \
    --modes gnn_io_reorder_off,gnn_io --dtype bfloat16 --rounds 50 2>$out/ab3_stderr.txt \
    | tee $out/ab_uniform_reorder_bf16.txt | tail -4" &
  wait
  show_lanes
  (cd "$out" && tar czf session41.tgz ab*.txt gpu_tests_*.txt && rm -f ab*.txt gpu_tests_*.txt)
elif [[ $what == session40e ]]; then
  # session 40's two changes checked (four GPU lanes): a packed gradient up to 1 GiB is made whole; lane 0, tu-batch
  # TF32 TransformerConv, the block path forced against the pick (the harness had it 14% ahead of the CSR pick);
  # lane 1, the CSR path against its one-block mode (now the same code: ~1.00x); lane 2, the CUDA tests of the
  # projected and packed gradients and CUDA graphs; lane 3, bf16 tu-batch, the pick against the CSR path forced
  four_gpus session40e
  tu="--layers transformer --graphs tu-batch --rounds 100"
  lane 0 "timeout 150 python3 -m benchmarks.ab $tu --modes gnn_io_block,gnn_io --tf32 2>$out/ab0_stderr.txt \
    | tee $out/ab_tu_pick_tf32.txt | tail -4" &
  lane 1 "timeout 150 python3 -m benchmarks.ab $tu --modes gnn_io_csr,gnn_io_csr_one_chunk --tf32 2>$out/ab1_stderr.txt \
    | tee $out/ab_tu_whole_tf32.txt | tail -4" &
  lane 2 "CI=1 GNN_IO_STRICT=1 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_projected_grads.py \
    tests/test_packed_grads.py tests/gpu/test_cudagraphs_cuda.py -k 'not interpreter' 2>&1 | tee $out/gpu_tests.txt | tail -2" &
  lane 3 "timeout 150 python3 -m benchmarks.ab $tu --modes gnn_io_csr,gnn_io --dtype bfloat16 2>$out/ab3_stderr.txt \
    | tee $out/ab_tu_pick_bf16.txt | tail -4" &
  wait
  show_lanes
  (cd "$out" && tar czf session40e.tgz ab*.txt gpu_tests.txt && rm -f ab*.txt gpu_tests.txt)
elif [[ $what == session40d ]]; then
  # session 40c's profile: on tu-batch in TF32 the CSR path's step is bound by the host, and its projected
  # backward (packed gradient made in blocks of 256 MiB: 3 here) takes 2.6 ms of host time a step against the
  # block path's 0.7. Interleaved (100 rounds, four GPU lanes): lane 0, the CSR path with its packed gradient in
  # one block against the default blocks (TF32); lane 1, against the unprojected backward (TF32); lane 2, bf16
  # TransformerConv under the new 500k-edge threshold, torch.compile against gnn_io (now Inductor's code: ~1.00x);
  # lane 3, lane 0's question in bf16 (2 blocks)
  four_gpus session40d
  tu="--layers transformer --graphs tu-batch --rounds 100"
  lane 0 "timeout 200 python3 -m benchmarks.ab $tu --modes gnn_io_csr,gnn_io_csr_one_chunk --tf32 \
    2>$out/ab0_stderr.txt | tee $out/ab_tu_chunks_tf32.txt | tail -4" &
  lane 1 "timeout 200 python3 -m benchmarks.ab $tu --modes gnn_io_csr,gnn_io_csr_no_projected --tf32 \
    2>$out/ab1_stderr.txt | tee $out/ab_tu_projected_tf32.txt | tail -4" &
  lane 2 "timeout 200 python3 -m benchmarks.ab --layers transformer --graphs SNAP-facebook_combined,MUSAE-wikipedia-squirrel \
    --modes inductor,gnn_io --dtype bfloat16 --rounds 100 2>$out/ab2_stderr.txt | tee $out/ab_real_declined_bf16.txt | tail -5" &
  lane 3 "timeout 200 python3 -m benchmarks.ab $tu --modes gnn_io_csr,gnn_io_csr_one_chunk --dtype bfloat16 \
    2>$out/ab3_stderr.txt | tee $out/ab_tu_chunks_bf16.txt | tail -4" &
  wait
  show_lanes
  (cd "$out" && tar czf session40d.tgz ab*.txt && rm -f ab*.txt)
elif [[ $what == session40c ]]; then
  # session 40b's answers asked further (four GPU lanes): lane 0, why the block path's layer step beats the CSR path's
  # by 0.9 ms on tu-batch in TF32 while the chooser's op timing put CSR 0.17 ms ahead (profiler, both forced);
  # lanes 1 and 2, bf16 TransformerConv against torch.compile on the suite's sparse graphs (a bf16 size threshold
  # for the dot family, as TF32 has); lane 3, TF32 GATConv on tu-batch, the pick against the block path forced
  four_gpus session40c
  lane 0 "for mode in gnn_io_csr gnn_io_block; do timeout 90 python3 -m benchmarks.profile_layer --layer transformer \
    --graph tu-batch --mode \$mode --tf32 --rows 30 >$out/profile_tu_\$mode.txt 2>&1; echo \"== \$mode rc=\$?\"
    grep -E 'Self CUDA time total|^ *(aten::|void|triton|_|sm90|cutlass|ampere|Memcpy|Memset)' $out/profile_tu_\$mode.txt \
      | awk '{\$1=\$1}1' | cut -c1-150 | head -24; done" &
  lane 1 "timeout 200 python3 -m benchmarks.ab --layers transformer --graphs ca-AstroPh,MUSAE-github --modes inductor,gnn_io \
    --dtype bfloat16 --rounds 100 2>$out/ab1_stderr.txt | tee $out/ab_small_transformer_bf16.txt | tail -5" &
  lane 2 "timeout 200 python3 -m benchmarks.ab --layers transformer --graphs rmat-arxiv,road-luxembourg-osm \
    --modes inductor,gnn_io --dtype bfloat16 --rounds 100 2>$out/ab2_stderr.txt \
    | tee $out/ab_mid_transformer_bf16.txt | tail -5" &
  lane 3 "timeout 200 python3 -m benchmarks.ab --layers gat --graphs tu-batch --modes gnn_io_block,gnn_io --tf32 \
    --rounds 100 2>$out/ab3_stderr.txt | tee $out/ab_tu_gat_tf32.txt | tail -4" &
  wait
  show_lanes
  (cd "$out" && tar czf session40c.tgz ab*.txt profile_*.txt && rm -f ab*.txt profile_*.txt)
elif [[ $what == session40b ]]; then
  # session 40's suite rows left three questions, asked interleaved (benchmarks.ab, 100 rounds) in four GPU lanes:
  # lane 0, TF32 TransformerConv on tu-batch: the pick (CSR, from its measured forward+backward) against the block
  # path forced (the harness put block 14% ahead); lane 1, bf16 TransformerConv on SNAP facebook and squirrel:
  # torch.compile against the pick (the harness put Inductor 23-40% ahead); lane 2, bf16 GATConv on both: PyG eager
  # against the pick (Inductor crashes there); lane 3, the rest of the block and attention paths' CUDA tests
  four_gpus session40b
  real=SNAP-facebook_combined,MUSAE-wikipedia-squirrel
  lane 0 "timeout 240 python3 -m benchmarks.ab --layers transformer --graphs tu-batch --modes gnn_io_block,gnn_io \
    --tf32 --rounds 100 2>$out/ab0_stderr.txt | tee $out/ab_tu_tf32.txt | tail -4" &
  lane 1 "timeout 240 python3 -m benchmarks.ab --layers transformer --graphs $real --modes inductor,gnn_io \
    --dtype bfloat16 --rounds 100 2>$out/ab1_stderr.txt | tee $out/ab_real_transformer_bf16.txt | tail -5" &
  lane 2 "timeout 240 python3 -m benchmarks.ab --layers gat --graphs $real --modes eager,gnn_io \
    --dtype bfloat16 --rounds 100 2>$out/ab2_stderr.txt | tee $out/ab_real_gat_bf16.txt | tail -5" &
  lane 3 "CI=1 GNN_IO_STRICT=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_attention_paths.py \
    tests/kernels/test_block_sparse_gat.py tests/test_reorder.py -k 'not interpreter' 2>&1 | tee $out/gpu_tests.txt | tail -2" &
  wait
  show_lanes
  (cd "$out" && tar czf session40b.tgz ab*.txt gpu_tests.txt && rm -f ab*.txt gpu_tests.txt)
elif [[ $what == session40 ]]; then
  # session 39d's owed rows in one call of four lanes, one GPU and 16 CPU cores each (taskset), Inductor's compile
  # threads capped so one lane's compiles do not slow another's host-bound steps. Lane 0: TF32 TransformerConv and
  # GATConv on tu-batch and SNAP facebook, then TF32 GATv2Conv on all three dense real graphs; lane 1: TF32 squirrel,
  # the bf16 squirrel rows PART=1 ran out of time for, the block kernels' CUDA tests; lanes 2 and 3: the uniform graph
  # in bf16 and in TF32 (GATv2Conv without the block path, 1.7-18x slower than CSR on every graph so far). Everything
  # is archived into one file at the end (the device tool brings back 8 files a call)
  four_gpus session40
  dense=tu-batch,SNAP-facebook_combined
  lane 0 "OUT=$out PREC=tf32 LAYERS=transformer,gat GRAPHS=$dense NAME=tf32_dense_real SECONDS_LIMIT=340 bash $0 session38b
    OUT=$out PREC=tf32 LAYERS=gatv2 GRAPHS=$dense,MUSAE-wikipedia-squirrel MODES=eager,inductor,gnn_io,gnn_io_block \
      NAME=tf32_dense_real_gatv2 SECONDS_LIMIT=170 bash $0 session38b" &
  lane 1 "OUT=$out PREC=tf32 LAYERS=transformer,gat GRAPHS=MUSAE-wikipedia-squirrel NAME=tf32_squirrel SECONDS_LIMIT=190 bash $0 session38b
    OUT=$out PREC=bf16 LAYERS=gat GRAPHS=MUSAE-wikipedia-squirrel NAME=bf16_squirrel_gat SECONDS_LIMIT=100 bash $0 session38b
    OUT=$out PREC=bf16 LAYERS=gatv2 GRAPHS=MUSAE-wikipedia-squirrel MODES=eager,inductor,gnn_io,gnn_io_block \
      NAME=bf16_squirrel_gatv2 SECONDS_LIMIT=70 bash $0 session38b
    CI=1 GNN_IO_STRICT=1 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_spmm_paths.py \
      tests/kernels/test_block_sparse_spmm.py tests/kernels/test_block_sparse.py -k 'not interpreter' 2>&1 \
      | tee $out/gpu_tests.txt | tail -2" &
  for n in 2 3; do
    prec=$([[ $n == 2 ]] && echo bf16 || echo tf32)
    lane $n "OUT=$out PREC=$prec LAYERS=transformer,gat GRAPHS=uniform-large NAME=${prec}_uniform SECONDS_LIMIT=360 bash $0 session38b
      OUT=$out PREC=$prec LAYERS=gatv2 GRAPHS=uniform-large MODES=eager,inductor,gnn_io,gnn_io_csr \
        NAME=${prec}_uniform_gatv2 SECONDS_LIMIT=150 bash $0 session38b" &
  done
  wait
  for n in 0 1 2 3; do echo "== lane $n"; grep -v "^NVIDIA\|^torch " "$out/lane$n.log" | cut -c1-260; done
  (cd "$out" && tar czf session40.tgz ./*.tgz lane*.log gpu_tests.txt && rm -f ./*_*.tgz gpu_tests.txt)
elif [[ $what == session39d ]]; then
  # owed by session 39: issue 8's suite rows never measured at the layer level. PART 1 (bf16) and 2 (TF32): the TU
  # data sets batched (tu-batch, 10k+ graphs in batch order), SNAP facebook and MUSAE squirrel, the densest real
  # graphs (the reorder-off column is "before reordering"); PART 3 (bf16) and 4 (TF32): the uniform graph of 2^20
  # nodes. GATv2Conv with fewer modes (its block path lost on every graph so far). .bench_data must hold TUDataset
  # and SNAP-facebook_combined (copied from ../shared/data) besides MUSAE-wikipedia-squirrel
  part=${PART:-1}
  prec=$([[ $part == 1 || $part == 3 ]] && echo bf16 || echo tf32)
  case $part in
    1|2) graphs=tu-batch,SNAP-facebook_combined,MUSAE-wikipedia-squirrel; set_name=dense_real; limit=420 ;;
    3|4) graphs=uniform-large; set_name=uniform; limit=330 ;;
    *) echo "session39d: PART=1, 2, 3 or 4" >&2; exit 2 ;;
  esac
  OUT="$out" PREC=$prec LAYERS=transformer,gat GRAPHS=$graphs NAME=${prec}_${set_name} SECONDS_LIMIT=$limit \
    bash "$0" session38b
  OUT="$out" PREC=$prec LAYERS=gatv2 GRAPHS=$graphs MODES=eager,inductor,gnn_io,gnn_io_block \
    NAME=${prec}_${set_name}_gatv2 SECONDS_LIMIT=130 bash "$0" session38b
elif [[ $what == session39 ]]; then
  # issue 8 after session 39's change (TF32 GATConv under its threshold goes to Inductor): the CUDA tests of the
  # attention paths, the block kernels (attention, GAT, SpMM), the SpMM paths and the reordering; then interleaved
  # A/B on two small graphs: the automatic pick against its own path forced (bf16; session 38's harness put the
  # pick's column up to 20% above same-path modes in bf16, 55% in TF32), and Inductor against the forced CSR path for TF32 GATConv
  kernel_tests 260 tests/kernels/test_attention_paths.py tests/kernels/test_block_sparse.py \
    tests/kernels/test_block_sparse_gat.py tests/kernels/test_block_sparse_spmm.py tests/kernels/test_spmm_paths.py \
    tests/test_reorder.py
  timeout 170 python3 -m benchmarks.ab --layers gat,transformer --graphs ca-AstroPh,MUSAE-github \
    --modes gnn_io_csr,gnn_io --dtype bfloat16 --rounds 100 2>"$out/ab_stderr.txt" | tee "$out/ab_pick_bf16.txt" | tail -6
  timeout 110 python3 -m benchmarks.ab --layers gat --graphs ca-AstroPh,MUSAE-github --modes inductor,gnn_io_csr \
    --tf32 --rounds 100 2>>"$out/ab_stderr.txt" | tee "$out/ab_gat_tf32.txt" | tail -4
elif [[ $what == session39c ]]; then
  # session 39: the block SpMM stores every row of its outputs, which are no longer zero-filled first (0.11 of the
  # 0.76 ms forward on the batched graphs in TF32, session39b): the SpMM paths' CUDA tests, then GCNConv's rows
  # of issue 8 (block model bf16, batched graphs TF32), cuSPARSE and block forced and the automatic pick
  kernel_tests 90 tests/kernels/test_spmm_paths.py tests/kernels/test_block_sparse_spmm.py
  harness_table 110 gcn_bf16 --graphs sbm-dense --layers gcn --dtype bfloat16 \
    --modes gnn_io,gnn_io_spmm_cusparse,gnn_io_spmm_block --reps 10 | grep "^| [a-z]" | cut -d'|' -f2,5-9,19-
  harness_table 110 gcn_tf32 --graphs batch-random --layers gcn --tf32 \
    --modes gnn_io,gnn_io_spmm_cusparse,gnn_io_spmm_block --reps 10 | grep "^| [a-z]" | cut -d'|' -f2,5-9,19-
  rm -f "$out"/gcn_*/speedup.png
  (cd "$out" && tar czf gcn.tgz gcn_bf16* gcn_tf32* && rm -rf gcn_bf16* gcn_tf32*)  # the tool returns 8 files
elif [[ $what == session39b ]]; then
  # issue 8's GCN target (block SpMM 1.5x over cuSPARSE where picked) was missed in bf16 on the block model (1.12x)
  # and in TF32 on the batched graphs (1.29x, session 37): one step's GPU time kernel by kernel, both paths forced
  for run in "sbm-dense --dtype bfloat16" "batch-random --tf32"; do
    read -r graph flags <<<"$run"
    for mode in gnn_io_spmm_cusparse gnn_io_spmm_block; do
      # shellcheck disable=SC2086
      timeout 75 python3 -m benchmarks.profile_layer --layer gcn --graph "$graph" --mode $mode $flags --rows 25 \
        >"$out/profile_gcn_${graph}_${mode}.txt" 2>&1
      echo "== $graph $flags $mode rc=$?"; grep -E "Self CUDA time total|^ *(aten::|void|triton|_|sm90|cutlass|ampere|Memcpy|Memset|cusparse)" \
        "$out/profile_gcn_${graph}_${mode}.txt" | awk '{$1=$1}1' | cut -c1-150 | head -16
    done
  done
elif [[ $what == session38a ]]; then
  # the dot family's attention op (fwd+bwd) per path, order and precision on four graphs: the points of the H200
  # refit (benchmarks/fit_attention.py); then TransformerConv's bf16 rows on the suite's four sparse graphs
  timeout 330 python3 -m benchmarks.probe --parts attention --families dot --orders none,rcm \
    --graphs sbm-dense,batch-random,rmat-arxiv,MUSAE-wikipedia-squirrel \
    --attention-graphs sbm-dense,batch-random,rmat-arxiv,MUSAE-wikipedia-squirrel --out "$out/probe" \
    >"$out/probe.txt" 2>&1; grep "^| attention" "$out/probe.txt" | cut -d'|' -f3,5-9
  harness_table ${SPARSE_SECONDS:-200} bf16_sparse_transformer --graphs rmat-arxiv,ca-AstroPh,MUSAE-github,road-luxembourg-osm \
    --layers transformer --dtype bfloat16 --reps 10 \
    --modes eager,inductor,gnn_io,gnn_io_csr,gnn_io_block,gnn_io_hybrid,gnn_io_reorder_off | grep "^| [a-z]" | cut -d'|' -f2,5-9,19-
  rm -f "$out"/bf16_sparse_*/speedup.png
elif [[ $what == session38c ]]; then
  # the rows session 38 lost (docs/benchmarks/block_sparse/suite_h200.md, "Missing"), one call per PART: 1, TF32
  # GATConv on the four sparse graphs; 2, bf16 GATConv on road-luxembourg-osm (a torch.compile crash and its
  # rerun: about 115 s a graph in session 38) and TF32 GATv2Conv; 3, the dense graphs' hybrid and reorder-off
  # columns in bf16. Each run is archived as it ends (session38b)
  case ${PART:-1} in
    1) OUT="$out" PREC=tf32 LAYERS=gat SECONDS_LIMIT=540 bash "$0" session38b ;;
    2) OUT="$out" PREC=bf16 LAYERS=gat GRAPHS=road-luxembourg-osm SECONDS_LIMIT=200 bash "$0" session38b
       OUT="$out" PREC=tf32 LAYERS=gatv2 MODES=eager,inductor,gnn_io,gnn_io_block SECONDS_LIMIT=300 \
         bash "$0" session38b ;;
    3) OUT="$out" PREC=bf16 LAYERS=transformer,gat GRAPHS=sbm-dense,batch-random \
         MODES=gnn_io,gnn_io_hybrid,gnn_io_reorder_off SECONDS_LIMIT=500 bash "$0" session38b ;;
    *) echo "session38c: PART=1, 2 or 3" >&2; exit 2 ;;
  esac
elif [[ $what == session38b ]]; then
  # issue 8's suite on the four sparse graphs with the H200 calibration: PREC=bf16 (default) or tf32, LAYERS (default
  # transformer,gat,gatv2), GRAPHS, MODES, SECONDS_LIMIT, NAME (the run's folder); the picks' decisions after the table
  prec=${PREC:-bf16}
  [[ $prec == bf16 || $prec == tf32 ]] || { echo "session38b: PREC=bf16 or tf32" >&2; exit 2; }
  flag=$([[ $prec == bf16 ]] && echo "--dtype bfloat16" || echo "--tf32")
  name=${NAME:-${prec}_sparse_${LAYERS:-all}}
  name=${name//,/_}
  # shellcheck disable=SC2086
  harness_table ${SECONDS_LIMIT:-560} "$name" --graphs ${GRAPHS:-rmat-arxiv,ca-AstroPh,MUSAE-github,road-luxembourg-osm} \
    --layers ${LAYERS:-transformer,gat,gatv2} $flag --reps 10 \
    --modes ${MODES:-eager,inductor,gnn_io,gnn_io_csr,gnn_io_block,gnn_io_hybrid,gnn_io_reorder_off} \
    | grep "^| [a-zA-Z]" | cut -d'|' -f2,5-9,19-
  last_decisions graph "$out/$name/results.json" | cut -c1-220
  # the device tool brings back 8 files a call: one archive per run (session 38 lost three results.json to that)
  rm -f "$out/$name/speedup.png"
  tar czf "$out/$name.tgz" -C "$out" "$name" "${name}_stderr.txt" "${name}_stdout.txt" \
    && rm -rf "${out:?}/$name" "$out/${name}_stderr.txt" "$out/${name}_stdout.txt"
elif [[ $what == session37d ]]; then
  # issue 8: GCN's block-sparse SpMM at least 1.5x over cached cuSPARSE where the chooser picks it; the automatic
  # pick and both paths forced, against torch.compile, on the two locally dense graphs in bf16 and in TF32
  harness_table 200 gcn_bf16 --graphs sbm-dense,batch-random --layers gcn --dtype bfloat16 \
    --modes inductor,gnn_io,gnn_io_spmm_cusparse,gnn_io_spmm_block --reps 10 | grep "^| [a-z]" | cut -d'|' -f2,5-9,19-
  harness_table 200 gcn_tf32 --graphs sbm-dense,batch-random --layers gcn --tf32 \
    --modes inductor,gnn_io,gnn_io_spmm_cusparse,gnn_io_spmm_block --reps 10 | grep "^| [a-z]" | cut -d'|' -f2,5-9,19-
  rm -f "$out"/gcn_*/speedup.png
elif [[ $what == session37c ]]; then
  # issue 8's target rows with the final code: TransformerConv, GATConv and GATv2Conv on the two locally dense
  # graphs, PyG eager, torch.compile default, gnn_io's automatic pick and both paths forced; PREC=bf16 (default)
  # or tf32; the picks' decisions after the table
  prec=${PREC:-bf16}
  flag=$([[ $prec == bf16 ]] && echo "--dtype bfloat16" || echo "--tf32")
  # shellcheck disable=SC2086
  harness_table 560 ${prec}_dense3 --graphs sbm-dense,batch-random --layers transformer,gat,gatv2 $flag \
    --modes eager,inductor,gnn_io,gnn_io_csr,gnn_io_block --reps 10 | grep "^| [a-z]" | cut -d'|' -f2,5-9,19-
  last_decisions layer "$out/${prec}_dense3/results.json" | cut -c1-200
  rm -f "$out/${prec}_dense3/speedup.png"
elif [[ $what == session37b ]]; then
  # session37's block-path profiles showed three copies of [N, 128] gradients into the packed gradient per step
  # (1.14 of 9.96 ms on the batched graphs): the block kernels now store there. Their CUDA tests, the profiles
  # again, and the TF32 layer on both dense graphs, CSR and block forced
  kernel_tests 180 tests/kernels/test_block_sparse.py
  for graph in batch-random sbm-dense; do
    timeout 100 python3 -m benchmarks.profile_layer --layer transformer --graph $graph --mode gnn_io_block --tf32 \
      --rows 30 >"$out/profile_${graph}_gnn_io_block.txt" 2>&1
    echo "== $graph gnn_io_block rc=$?"; grep -E "Self CUDA time total|copy_|_dot_" "$out/profile_${graph}_gnn_io_block.txt" \
      | awk '{$1=$1}1' | cut -c1-150
  done
  harness_table 300 tf32_dense --graphs sbm-dense,batch-random --layers transformer --tf32 \
    --modes gnn_io_csr,gnn_io_block --reps 10 | grep "^| [a-z]" | cut -c1-200
  rm -f "$out"/tf32_dense/speedup.png
elif [[ $what == session37 ]]; then
  # issue 8's 2x over CSR: the op-level gain (session 22: 7.95 -> 5.78 ms on the batched graphs) shrinks to 1.06x in
  # the layer; the GPU time of one TF32 TransformerConv step kernel by kernel, CSR and block forced, both dense graphs
  for graph in batch-random sbm-dense; do
    for mode in gnn_io_csr gnn_io_block; do
      timeout 150 python3 -m benchmarks.profile_layer --layer transformer --graph $graph --mode $mode --tf32 --rows 30 \
        >"$out/profile_${graph}_${mode}.txt" 2>&1
      echo "== $graph $mode rc=$?"; grep -E "Self CUDA time total|^ *(aten::|void|triton|_|sm90|cutlass|ampere|Memcpy|Memset)" \
        "$out/profile_${graph}_${mode}.txt" | awk '{$1=$1}1' | cut -c1-150 | head -24
    done
  done
elif [[ $what == session36f ]]; then
  # session36e's row in bf16 (issue 8: at most 28 / 8.5 ms, 4x over torch.compile, 2x over the CSR kernel)
  harness_table 440 bf16_dense --graphs sbm-dense,batch-random --layers transformer --dtype bfloat16 \
    --modes inductor,gnn_io,gnn_io_csr,gnn_io_block --reps 10 | grep "^| [a-z]" | cut -c1-260
  rm -f "$out"/bf16_dense/speedup.png
elif [[ $what == session36e ]]; then
  # issue 8's target left open since session 22: TF32 TransformerConv at least 2x over gnn_io's own CSR kernel on the
  # two locally dense graphs; the paths forced and the automatic pick, against torch.compile, with the final code
  harness_table 440 tf32_dense --graphs sbm-dense,batch-random --layers transformer --tf32 \
    --modes inductor,gnn_io,gnn_io_csr,gnn_io_block --reps 10 | grep "^| [a-z]" | cut -c1-260
  rm -f "$out"/tf32_dense/speedup.png
elif [[ $what == session36d ]]; then
  # issue 8's GPU tests in the final state: the block-sparse attention and SpMM kernels against the references,
  # forward and backward, and the per-graph path choice (CUDA runs them compiled; CI runs them interpreted)
  kernel_tests 500 tests/kernels/test_block_sparse.py tests/kernels/test_block_sparse_gat.py \
    tests/kernels/test_block_sparse_spmm.py tests/kernels/test_attention_paths.py tests/kernels/test_spmm_paths.py
  grep -E "^(FAILED|ERROR)" "$out/gpu_tests.txt" | head -20
elif [[ $what == session36c ]]; then
  # the suite's other two large graphs for issues 4 and 5's layers (the RMAT graphs: session35t/u; the small and
  # mid-size real graphs: session34d/e), each (graph, layer) in its own process
  harness_table 560 grid_uniform --graphs grid-large,uniform-large --layers sage_max,gat,gatv2,transformer \
    --modes eager,inductor,gnn_io --reps 10 | grep "^| [a-z]" | cut -d'|' -f2,5,6,7,8,14,15,16
  rm -f "$out"/grid_uniform/speedup.png
elif [[ $what == session36b ]]; then
  # where the GPU time of the arxiv-size steps goes now (kernel by kernel, 10 steps): issue 5's TransformerConv and
  # issue 4's SAGEConv max, without CUDA graphs and with the GEMM thresholds CUDA graphs use
  for layer in transformer sage_max; do
    for tall in "" 31; do
      GNN_IO_FP32_TALL_LOG2=$tall timeout 150 python3 -m benchmarks.profile_layer --layer $layer --graph rmat-arxiv \
        --mode gnn_io --rows 30 >"$out/profile_${layer}${tall:+_tall$tall}.txt" 2>&1
      grep -E "^==|Self CUDA time total|Self CPU time total" "$out/profile_${layer}${tall:+_tall$tall}.txt"
    done
  done
elif [[ $what == session36 ]]; then
  # the CUDA-graph tests' new cases without GNN_IO_FORCE (the cost model's thresholds off under replay), then float32
  # TransformerConv against torch.compile around its 1M-edge threshold, interleaved, fused path forced
  CI=1 GNN_IO_STRICT=1 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_cudagraphs_cuda.py \
    -k unforced 2>&1 | tee "$out/gpu_tests.txt" | tail -4
  timeout -s INT 360 python3 -m benchmarks.ab --layers transformer \
    --graphs rmat-arxiv,soc-Slashdot0902,rmat-17-1500000,rmat-18-2000000 \
    --modes inductor,gnn_io_force --rounds 30 2>"$out/ab_stderr.txt" | tee "$out/ab_transformer.txt" | grep "^| [a-zA-Z]"
elif [[ $what == session35c ]]; then
  # the cost model's thresholds exist because below them a step is bound by its per-call CPU work, which a CUDA
  # graph replay does not have: under GNN_IO_CUDAGRAPHS=1, the graphs it declines (left to Inductor's kernels,
  # replayed too) against the fused kernels forced (GNN_IO_FORCE=1), interleaved
  timeout -s INT 170 python3 -m benchmarks.ab --layers transformer,gat,sage_max,gcn --graphs ca-AstroPh \
    --modes gnn_io_cg,gnn_io_cg_force --rounds 20 2>"$out/ab_stderr.txt" | tee "$out/ab_cg_astro.txt" | grep "^| [a-zA-Z]"
  timeout -s INT 80 python3 -m benchmarks.ab --layers transformer,sage_max --graphs Planetoid-Cora \
    --modes gnn_io_cg,gnn_io_cg_force --rounds 20 2>>"$out/ab_stderr.txt" | tee "$out/ab_cg_cora.txt" | grep "^| [a-zA-Z]"
elif [[ $what == session35t || $what == session35u ]]; then
  # issues 4 and 5's targets in the final state: SAGEConv max, GATConv, GATv2Conv, TransformerConv, each (graph, layer)
  # in its own process, every mode in that process (the table is written after each case: a timeout keeps the rest)
  if [[ $what == session35t ]]; then
    harness_table 560 rmat_large --graphs rmat-large --layers sage_max,gat,gatv2,transformer \
      --modes eager,inductor,gnn_io --reps 10 | grep "^| [a-z]" | cut -d'|' -f2,5,6,7,8,14,15,16
  else
    harness_table 500 rmat_arxiv --graphs rmat-arxiv --layers sage_max,gat,gatv2,transformer \
      --modes eager,inductor,gnn_io,gnn_io_cg --reps 20 | grep "^| [a-z]" | cut -d'|' -f2,5,6,7,8,14,15,16
  fi
  rm -f "$out"/rmat_*/speedup.png
elif [[ $what == session35b ]]; then
  # the rows kernel now takes the light items by default from 2^19 work items: the reduction kernels' CUDA tests, with
  # the new test at that scale (tests/gpu/test_gather_scatter_cuda.py::test_default_split_at_scale_runs_the_rows_kernel)
  kernel_tests 400 tests/gpu/test_gather_scatter_cuda.py tests/kernels/test_gather_scatter_triton.py
elif [[ $what == session35 ]]; then
  # session 34's owed rows-kernel A/B (as session34k), then GATv2Conv on ca-AstroPh, which the suite read at 0.95x
  # against torch.compile in one process, timed interleaved
  timeout -s INT 200 python3 -m benchmarks.ab --layers sage_max --graphs rmat-large \
    --modes gnn_io,gnn_io_light_rows --rounds 6 2>"$out/ab_stderr.txt" | tee "$out/ab_rows.txt" | tail -3
  timeout -s INT 150 python3 -m benchmarks.ab --layers sage_max --graphs rmat-arxiv \
    --modes gnn_io_cg,gnn_io_cg_light_rows --rounds 20 2>>"$out/ab_stderr.txt" | tee "$out/ab_rows_cg.txt" | tail -3
  timeout -s INT 150 python3 -m benchmarks.ab --layers gatv2 --graphs ca-AstroPh \
    --modes inductor,gnn_io --rounds 20 2>>"$out/ab_stderr.txt" | tee "$out/ab_gatv2_astro.txt" | tail -3
elif [[ $what == session34k ]]; then
  # owed: the rows kernel's step A/B with its measured launch (2 rows on one warp; call 12's A/B ran 8 on 2 warps), at
  # RMAT 2^20 without and RMAT 2^17 with CUDA graphs
  timeout -s INT 200 python3 -m benchmarks.ab --layers sage_max --graphs rmat-large \
    --modes gnn_io,gnn_io_light_rows --rounds 6 2>"$out/ab_stderr.txt" | tee "$out/ab_rows.txt" | tail -3
  timeout -s INT 200 python3 -m benchmarks.ab --layers sage_max --graphs rmat-arxiv \
    --modes gnn_io_cg,gnn_io_cg_light_rows --rounds 20 2>>"$out/ab_stderr.txt" | tee "$out/ab_rows_cg.txt" | tail -3
elif [[ $what == session34j ]]; then
  # the rows kernel for the light items (GNN_IO_GS_LIGHT_ROWS=1: several light rows per program): its CUDA tests, the
  # launch probe with its candidates, then a short A/B of SAGEConv max at RMAT 2^20 (last: the budget may cut it)
  CI=1 timeout -s INT 90 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gather_scatter_triton.py \
    -k "rows or light or apart" 2>&1 | tee "$out/gpu_tests_rows.txt" | tail -2
  timeout -s INT 100 python3 -m benchmarks.gather_launch_probe --graphs rmat-large,rmat-arxiv \
    2>"$out/launch_stderr.txt" | tee "$out/gather_launch.txt" | tail -4
  timeout -s INT 120 python3 -m benchmarks.ab --layers sage_max --graphs rmat-large \
    --modes gnn_io,gnn_io_light_rows --rounds 3 2>"$out/ab_stderr.txt" | tee "$out/ab_rows.txt" | tail -3
elif [[ $what == session34i ]]; then
  # after the light launch: the forward's share of copy bandwidth again (gather_floor, whose forward now splits at RMAT
  # 2^20), and the launch candidates with 1 and 2 edges per tile row added
  timeout -s INT 150 python3 -m benchmarks.gather_floor --graphs rmat-large,rmat-arxiv 2>"$out/floor_stderr.txt" \
    | tee "$out/gather_floor.txt" | tail -9
  timeout -s INT 150 python3 -m benchmarks.gather_launch_probe --graphs rmat-large,rmat-arxiv \
    2>"$out/launch_stderr.txt" | tee "$out/gather_launch.txt" | tail -4
elif [[ $what == session34h ]]; then
  # the suite rows of 34d/34e where gnn_io trailed torch.compile (one process per layer, modes one after the other),
  # interleaved: TransformerConv on soc-Slashdot0902 (rewritten) and ca-AstroPh (declined), GATConv on Cora,
  # soc-Slashdot0902 and RMAT 2^17
  timeout -s INT 260 python3 -m benchmarks.ab --layers transformer --graphs soc-Slashdot0902,ca-AstroPh \
    --rounds 20 2>"$out/ab_stderr.txt" | tee "$out/ab_transformer.txt" | tail -4
  timeout -s INT 280 python3 -m benchmarks.ab --layers gat --graphs Planetoid-Cora,soc-Slashdot0902,rmat-arxiv \
    --rounds 20 2>>"$out/ab_stderr.txt" | tee "$out/ab_gat.txt" | tail -5
elif [[ $what == session34g ]]; then
  # the light launch's rule (auto: the forward from 2^19 items, or under CUDA graphs) at RMAT 2^17, 20 interleaved
  # rounds each: without CUDA graphs (auto = one launch) against the split forced; with CUDA graphs (auto = split)
  # against one launch
  timeout -s INT 200 python3 -m benchmarks.ab --layers sage_max --graphs rmat-arxiv \
    --modes gnn_io,gnn_io_light_forward --rounds 20 2>"$out/ab_stderr.txt" | tee "$out/ab_arxiv.txt" | tail -3
  timeout -s INT 200 python3 -m benchmarks.ab --layers sage_max --graphs rmat-arxiv \
    --modes gnn_io_cg_one_launch,gnn_io_cg --rounds 20 2>>"$out/ab_stderr.txt" | tee "$out/ab_arxiv_cg.txt" | tail -3
elif [[ $what == session34f ]]; then
  # the reduction kernels' light items in a launch of their own (session 34, GNN_IO_GS_LIGHT_LAUNCH): the CUDA tests of
  # the kernels with the default (forward) and with both walks split, then interleaved A/B of SAGEConv max
  for setting in forward both; do
    GNN_IO_GS_LIGHT_LAUNCH=$setting CI=1 timeout -s INT 100 python3 -m pytest -q -x -p no:cacheprovider \
      tests/gpu/test_gather_scatter_cuda.py 2>&1 | tee "$out/gpu_tests_$setting.txt" | tail -2
  done
  timeout -s INT 200 python3 -m benchmarks.ab --layers sage_max --graphs rmat-large,rmat-arxiv \
    --modes gnn_io_one_launch,gnn_io --rounds 6 2>"$out/ab_stderr.txt" | tee "$out/ab_light.txt" | tail -4
  timeout -s INT 200 python3 -m benchmarks.ab --layers sage_max --graphs rmat-large,rmat-arxiv \
    --modes gnn_io,gnn_io_light_both --rounds 6 2>>"$out/ab_stderr.txt" | tee "$out/ab_light_both.txt" | tail -4
elif [[ $what == session34d || $what == session34e ]]; then
  # issue 4's forward bandwidth target against the kernel's floors (benchmarks/gather_floor.py), then issues 4 and 5,
  # "never slower than torch.compile on the suite": the small and mid-size graphs again (last in session 20), one
  # harness run per layer so a timeout costs one layer; 34d: SAGEConv max and GATConv, 34e: GATv2Conv, TransformerConv
  if [[ $what == session34d ]]; then
    timeout -s INT 150 python3 -m benchmarks.gather_floor --graphs rmat-large,rmat-arxiv 2>"$out/floor_stderr.txt" \
      | tee "$out/gather_floor.txt" | tail -9
    layers="sage_max gat"
  else
    # the forward kernel's launch, hub items and light items apart (34d: it is not bound by memory)
    timeout -s INT 120 python3 -m benchmarks.gather_launch_probe --graphs rmat-large,rmat-arxiv \
      2>"$out/launch_stderr.txt" | tee "$out/gather_launch.txt" | tail -4
    layers="gatv2 transformer"
  fi
  for layer in $layers; do
    timeout 170 python3 -m benchmarks.harness --graphs Planetoid-Cora,ca-AstroPh,MUSAE-github,soc-Slashdot0902,road-luxembourg-osm,rmat-arxiv \
      --layers $layer --modes eager,inductor,gnn_io --reps 10 --out "$out/suite_$layer" 2>"$out/suite_${layer}_stderr.txt" \
      | tee "$out/suite_${layer}_stdout.txt" | grep "^| [a-zA-Z]" | grep -v "^| graph" | cut -d'|' -f2,5,6,7,8,10,19,21
    rm -f "$out/suite_$layer/speedup.png"
  done
elif [[ $what == session34c ]]; then
  # a CUDA-graph step's CPU from outside the process (session34b's in-process stack sampler kept the step's tensors
  # alive in its frames, and CUDA graph trees stopped: "graph recording observed an input tensor deallocate during
  # graph recording that did not occur during replay"); py-spy holds no references
  spy="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/py-spy"
  for layer in gcn sage_max; do
    timeout 150 "$spy" record --nonblocking --threads --rate 500 --format raw -o "$out/pyspy_cg_$layer.txt" -- \
      python3 -m benchmarks.cpu_profile --layer $layer --graph rmat-arxiv --mode gnn_io_cg --steps 50 --loop 1000 \
      >"$out/pyspy_cg_${layer}_run.txt" 2>&1
    grep "^==" "$out/pyspy_cg_${layer}_run.txt" || tail -3 "$out/pyspy_cg_${layer}_run.txt"
    python3 -m benchmarks.pyspy_summary "$out/pyspy_cg_$layer.txt" --rows 60 >"$out/pyspy_cg_${layer}_summary.md" 2>&1
    head -6 "$out/pyspy_cg_${layer}_summary.md"
    rm -f "$out/pyspy_cg_$layer.txt"
  done
elif [[ $what == session34b ]]; then
  # a CUDA-graph step's CPU (session 34 call 3: 0.36 ms per forward replay, 0.35 per backward, for GCNConv at RMAT
  # 2^17, about what the forward took without CUDA graphs): cProfile and the stack sampler (both threads)
  for layer in gcn sage_max; do
    timeout -s INT 120 python3 -m benchmarks.cpu_profile --layer $layer --graph rmat-arxiv --mode gnn_io_cg --rows 70 \
      --steps 50 --sampler --all-threads >"$out/cpu_profile_cg_$layer.txt" 2>&1; grep "^==" "$out/cpu_profile_cg_$layer.txt"
  done
elif [[ $what == session34 ]]; then
  # GINConv trailed torch.compile at RMAT 2^17 (0.98x, session 33 call 11) with no rewrite in its graph, only a plan of
  # two structure nodes; GCNConv took longer with CUDA graphs (1.66 ms) than without (1.55). Interleaved A/B first,
  # then each step's GPU busy time, then GCNConv's kernels with and without CUDA graphs
  timeout -s INT 200 python3 -m benchmarks.ab --layers gin,gcn --graphs rmat-arxiv --modes inductor,gnn_io \
    --rounds 30 2>"$out/ab_stderr.txt" | tee "$out/ab_gin_gcn.txt" | tail -4
  timeout -s INT 100 python3 -m benchmarks.ab --layers gin --graphs rmat-arxiv --modes gnn_io_tiles3,gnn_io \
    --rounds 30 2>>"$out/ab_stderr.txt" | tee "$out/ab_gin_tiles.txt" | tail -3
  timeout -s INT 150 python3 -m benchmarks.step_anatomy --layers gcn,gin --graph rmat-arxiv \
    --modes inductor,gnn_io,gnn_io_cg --steps 50 2>"$out/anatomy_stderr.txt" | tee "$out/step_anatomy.txt" | tail -8
  for mode in gnn_io gnn_io_cg; do
    timeout -s INT 60 python3 -m benchmarks.profile_layer --layer gcn --graph rmat-arxiv --mode $mode --rows 20 \
      >"$out/profile_gcn_$mode.txt" 2>&1
  done
elif [[ $what == session33j ]]; then
  # owed: the backward now compiles with the backend's two Inductor tiles (session 33; before, Inductor's own
  # setting): interleaved A/B at RMAT 2^20 without CUDA graphs, then the CUDA-graph rows call 10 did not re-measure
  timeout -s INT 330 python3 -m benchmarks.ab --layers gat,sage_max,transformer --graphs rmat-large \
    --modes gnn_io_tiles3,gnn_io --rounds 4 2>"$out/ab_stderr.txt" | tee "$out/ab_tiles.txt" | tail -5
  harness_table 240 arxiv_cg3 --graphs rmat-arxiv --layers gat,gcn,gin --modes inductor,inductor_cg,gnn_io,gnn_io_cg \
    --reps 20 | grep "^| [a-zR]" | cut -d'|' -f2-9
elif [[ $what == session33i ]]; then
  # owed: the CUDA-graph tests with their new assertion (every graph recorded whole, from the report), and the
  # awkward-graph sweep under CUDA graphs with the tall kernels' threshold
  CI=1 GNN_IO_STRICT=1 timeout -s INT 150 python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_cudagraphs_cuda.py \
    2>&1 | tee "$out/gpu_tests_cudagraphs.txt" | tail -4
  CI=1 timeout -s INT 240 python3 -m pytest -q -rf -p no:cacheprovider tests/models/test_graph_shapes.py \
    -k "test_cuda_graphs_across and not cpu" 2>&1 | tee "$out/gpu_tests_sweep_cg.txt" | tail -3
elif [[ $what == session33h ]]; then
  # final: the tall 3xTF32 kernels from 2^31 multiply-adds under CUDA graphs by default; RMAT 2^17, each layer in its
  # own process, ours and Inductor's with and without CUDA graphs
  harness_table 280 arxiv_final --graphs rmat-arxiv --layers ${LAYERS:-transformer,sage_max,gatv2} \
    --modes eager,inductor,inductor_cg,gnn_io,gnn_io_cg --reps 20 | grep "^| [a-zR]" | cut -d'|' -f2-9
elif [[ $what == session33g ]]; then
  # under CUDA graphs that now replay forward and backward: the tall 3xTF32 kernels from 2^31 multiply-adds (the
  # arxiv-size GEMMs) against cuBLAS's float32 GEMMs, interleaved A/B; then session33e's table
  timeout -s INT 260 python3 -m benchmarks.ab --layers transformer,sage_max --graphs rmat-arxiv \
    --modes gnn_io_cg,gnn_io_cg_tall31 --rounds 10 2>"$out/ab_stderr.txt" | tee "$out/ab_tall31.txt" | tail -5
  harness_table 320 arxiv_cg2 --graphs rmat-arxiv --layers gatv2,gcn,gin --modes eager,inductor,inductor_cg,gnn_io,gnn_io_cg \
    --reps 20 | grep "^| [a-zR]" | cut -d'|' -f2-9
elif [[ $what == session33f ]]; then
  # session 33d's gnn_io steps (without CUDA graphs) at RMAT 2^17 were slower than session 28's: the machine or the
  # code? The trees of session 28 (ec55f98) and session 32 (ea4f123), extracted untracked into abv/, against this
  # one, each layer in its own process, interleaved over two rounds
  root=$(pwd)
  for round in 1 2; do
    for v in abv/s28 abv/s32 .; do
      (cd "$v" && python3 -c "import gnn_inductor, os; print('tree', os.path.relpath(gnn_inductor.__file__, '$root'))" \
        && timeout 200 python3 -m benchmarks.harness --graphs rmat-arxiv --layers ${LAYERS:-sage_max,gat} --modes gnn_io \
          --reps 30 --isolate --data-root "$root/.bench_data" --out "$out/ab_${v//\//_}_$round" 2>/dev/null \
        | grep "^| rmat" | cut -c1-110)
    done
  done
elif [[ $what == session33d || $what == session33e ]]; then
  # RMAT 2^17, each layer in its own process: eager, torch.compile default and mode="reduce-overhead" (its CUDA
  # graphs), gnn_io and gnn_io under GNN_IO_CUDAGRAPHS=1, now that its backward replays too; then (33d) the
  # awkward-graph sweep under CUDA graphs, whose backward graphs are now recorded
  if [[ $what == session33d ]]; then layers=transformer,sage_max,gat; else layers=gatv2,gcn,gin; fi
  harness_table 330 arxiv_cg --graphs rmat-arxiv --layers $layers --modes eager,inductor,inductor_cg,gnn_io,gnn_io_cg \
    --reps 20 | grep "^| [a-zR]" | cut -d'|' -f2-9
  [[ $what == session33d ]] && CI=1 timeout -s INT 230 python3 -m pytest -q -rf -p no:cacheprovider \
    tests/models/test_graph_shapes.py -k "test_cuda_graphs_across and not cpu" 2>&1 | tee "$out/gpu_tests_sweep_cg.txt" | tail -3
elif [[ $what == session33c ]]; then
  # the backward compiled with the backend's options, and Inductor's dynamic-size check off for graphs of fixed sizes:
  # partitions, step anatomy, the CUDA-graph tests
  TORCH_LOGS=+cudagraphs timeout -s INT 200 python3 -m benchmarks.cg_skips --layers transformer,sage_max,gat,gcn \
    --graph rmat-arxiv >"$out/cg_skips.txt" 2>&1; grep "Created\|reason=\|^|" "$out/cg_skips.txt" | cut -c1-250 | head -40
  timeout -s INT 200 python3 -m benchmarks.step_anatomy --layers transformer,sage_max --graph rmat-arxiv \
    --modes gnn_io,gnn_io_cg --steps 50 2>&1 | tee "$out/step_anatomy.txt" | grep "^|"
  CI=1 GNN_IO_STRICT=1 timeout -s INT 150 python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_cudagraphs_cuda.py \
    2>&1 | tee "$out/gpu_tests_cudagraphs.txt" | tail -4
elif [[ $what == session33b ]]; then
  # session33 showed no replay under GNN_IO_CUDAGRAPHS=1 at RMAT 2^17: Inductor's skip reasons, layer by layer
  # (call 3 of session 33: no skips, but 3 partitions for TransformerConv; +cudagraphs logs each partition's reason)
  TORCH_LOGS=perf_hints,+cudagraphs timeout -s INT 300 python3 -m benchmarks.cg_skips --symbols \
    --layers ${LAYERS:-transformer,sage_max,gat,gcn} --graph rmat-arxiv >"$out/cg_skips.txt" 2>&1
  grep -i "skipping\|^==\|^|\|partition\|reason=\|^--\|^   (" "$out/cg_skips.txt" | cut -c1-300 | head -80
elif [[ $what == session33 ]]; then
  # why CUDA-graph steps sit 0.8-1.2 ms above their GPU time at RMAT 2^17 (sessions 24-28): CPU per forward and
  # backward call, GPU busy time, and the GPU's idle gaps in a replayed TransformerConv step
  timeout -s INT 330 python3 -m benchmarks.step_anatomy --layers transformer,sage_max --graph rmat-arxiv \
    --modes gnn_io,gnn_io_cg --steps 50 2>&1 | tee "$out/step_anatomy.txt" | tail -8
  timeout -s INT 150 python3 -m benchmarks.gpu_gaps --layer transformer --graph rmat-arxiv --mode gnn_io_cg \
    --steps 5 2>&1 | tee "$out/gaps_transformer_cg.txt" | tail -30
elif [[ $what == session32e ]]; then
  # plan.select_by_structure_masks: session32d failed GATConv(edge_dim) and GCNConv(edge weights) under CUDA graphs
  CI=1 timeout -s INT 270 python3 -m pytest -q -rf -p no:cacheprovider tests/models/test_graph_shapes.py \
    -k "test_cuda_graphs_across and not cpu" 2>&1 | tee "$out/gpu_tests_cudagraphs.txt" | tail -3
  CI=1 timeout -s INT 240 python3 -m pytest -q -rf -p no:cacheprovider tests/models/test_graph_shapes.py \
    -k "cuda and test_bipartite_and_edge_input and (gat_edge_attr or gcn_weight or graphconv_weight or gatv2_edge_attr)" \
    2>&1 | tee "$out/gpu_tests_edge_inputs.txt" | tail -3
  [[ ${STEPS:-1} == 1 ]] && timeout -s INT 150 python3 -m benchmarks.edge_input_steps --graph rmat-arxiv 2>&1 \
    | tee "$out/edge_input_steps.txt" | tail -12
elif [[ $what == session32d ]]; then
  # test_graph_shapes under CUDA graph trees: nine layers over the nine awkward graphs, one compiled model each
  CI=1 timeout -s INT 540 python3 -m pytest -q -rf -p no:cacheprovider tests/models/test_graph_shapes.py \
    -k "test_cuda_graphs_across" 2>&1 | tee "$out/gpu_tests.txt" | tail -8
elif [[ $what == session32b || $what == session32c ]]; then
  # test_graph_shapes's half-precision sweep: nine layers, the nine awkward graphs, bfloat16 and float16, compiled
  # against eager float32 with eager's own half-precision error as the yardstick
  CI=1 timeout -s INT 540 python3 -m pytest -q -rf -p no:cacheprovider tests/models/test_graph_shapes.py \
    -k "cuda and test_half_precision" 2>&1 | tee "$out/gpu_tests.txt" | tail -8
elif [[ $what == session31d ]]; then
  # session 31's CPU additions to the awkward-graph sweep: bipartite layers, edge weights and edge features, on CUDA
  # (the kernels, every rewrite forced); the homogeneous cases passed in session 31's calls 2, 4 and 5
  # (and the CUDA-graph tests: the item ops' listed rows are kept per plan, built outside any graph pool)
  CI=1 timeout -s INT 500 python3 -m pytest -q -rf -p no:cacheprovider tests/models/test_graph_shapes.py \
    -k "cuda and test_bipartite_and_edge_input" 2>&1 | tee "$out/gpu_tests.txt" | tail -6
  CI=1 GNN_IO_STRICT=1 timeout -s INT 90 python3 -m pytest -q -rf -p no:cacheprovider tests/gpu/test_cudagraphs_cuda.py \
    2>&1 | tee "$out/gpu_tests_cudagraphs.txt" | tail -4
elif [[ $what == session29a || $what == session29b ]]; then
  # session29's tests in two calls (cold, the whole list needs about 600 s): the attention and block-sparse kernel
  # files, then the rest (the multi-aggregation test that failed once in call 5 is in the second)
  if [[ $what == session29a ]]; then
    files="tests/kernels/test_attention_delta.py tests/kernels/test_attention_mass.py tests/kernels/test_attention_paths.py
      tests/kernels/test_attention_split_backward.py tests/kernels/test_attention_triton.py tests/kernels/test_block_sparse.py
      tests/kernels/test_block_sparse_gat.py"
  else
    files="tests/kernels/test_block_sparse_spmm.py tests/kernels/test_dense_triton.py tests/kernels/test_gather_scatter_triton.py
      tests/kernels/test_launch.py tests/kernels/test_ops.py tests/kernels/test_rng.py tests/kernels/test_split_tuning.py
      tests/kernels/test_spmm_paths.py tests/kernels/test_spmm_triton.py tests/test_dense_gemm.py tests/test_head_scores.py
      tests/test_gemm_accumulate.py tests/test_score_fold.py tests/test_projected_grads.py tests/test_packed_grads.py
      tests/test_direct_ops.py tests/test_linear_fusion.py tests/test_gather_linear.py"
  fi
  # shellcheck disable=SC2086
  CI=1 GNN_IO_STRICT=1 timeout -s INT 540 python3 -m pytest -q -rf -p no:cacheprovider $files -k "not interpreter" 2>&1 \
    | tee "$out/gpu_tests.txt" | grep -v "^[.sF]*  *\[" | tail -25
elif [[ $what == session28i ]]; then
  # the arxiv-size steps' CPU time sampled from outside the process (py-spy: its wheel carried in .wheels/), with
  # native frames; without them if that fails (benchmarks/pyspy_summary.py reads the stacks)
  # (session 28's call 10 ran it at --rate 1000 with --native and the process paused per sample: py-spy fell 2.6 s
  # behind during the compile and the call's time ran out before the first layer finished; hence 200 a second and
  # --nonblocking here, not yet run)
  spy="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/py-spy"
  for layer in sage_max transformer; do
    for native in --native ""; do
      timeout 240 "$spy" record $native --nonblocking --threads --rate 200 --format raw -o "$out/pyspy_$layer.txt" -- \
        python3 -m benchmarks.cpu_profile --layer $layer --graph rmat-arxiv --mode gnn_io --steps 50 --loop 500 \
        >"$out/pyspy_${layer}_run.txt" 2>&1
      [[ -s "$out/pyspy_$layer.txt" ]] && break
      echo "py-spy $native failed:"; tail -3 "$out/pyspy_${layer}_run.txt"
    done
    grep "^==" "$out/pyspy_${layer}_run.txt"
    python3 -m benchmarks.pyspy_summary "$out/pyspy_$layer.txt" --rows 45 >"$out/pyspy_${layer}_summary.md" 2>&1
    head -6 "$out/pyspy_${layer}_summary.md"
  done
elif [[ $what == session21e ]]; then
  # edge features of 64 per edge (Inductor makes lin_edge's [E, 128] output there?): fold on and off
  harness_table 300 gat_edge64 --graphs rmat-large --layers gat_edge64 --modes gnn_io_no_score_fold,gnn_io --reps 10
else
  echo "usage: bash benchmarks/pending_gpu.sh checks|tables|tables2|tables3|session14|session14b|session15[bcde]|session16[b]|session17[b-i]|session18[b-l]|session19[p-v]|session20[b-n]|session21[b-q]|session22[b-j]|session23[b-n]|session24[b-z]|session25[b-m]|session26[b-hp-r]|session27[b-h]|session28[b-i]" >&2; exit 2
fi
