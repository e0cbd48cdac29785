"""Whether each layer's compiled graphs replay as CUDA graphs under ``GNN_IO_CUDAGRAPHS=1`` at a given graph size,
and if not, Inductor's reason. ``TORCH_LOGS=perf_hints`` prints its "skipping cudagraphs due to ..." lines, and
``TORCH_LOGS=+cudagraphs`` each graph's partitions with the reason for every kernel left out of them; ``--symbols``
prints each compiled graph's symbolic nodes. The report's "CUDA graphs" line gives the outcome per graph.

    TORCH_LOGS=perf_hints,+cudagraphs python -m benchmarks.cg_skips --layers transformer,sage_max --graph rmat-arxiv

Session 33 found TransformerConv's steps at RMAT 2^17 launching their kernels one by one in that mode (the CPU time
of its backward call unchanged), although ``tests/gpu/test_cudagraphs_cuda.py`` sees no skips on a small graph.
"""
import argparse

import torch
import torch._inductor.compile_fx as inductor
from torch._dynamo.utils import counters

from benchmarks.profile_layer import layer_step


def _symbolic(value) -> list:
    """The symbolic sizes, strides and values in an FX node's ``val`` (a tensor, a SymInt, or a tuple of them)."""
    out = []
    for v in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(v, torch.Tensor):
            out += [str(d) for d in list(v.shape) + list(v.stride()) if isinstance(d, torch.SymInt)]
        elif isinstance(v, torch.SymInt):
            out.append(str(v))
    return out


def _spy_symbols():
    """Print, for each graph Inductor compiles, its inputs and nodes whose sizes are symbolic (what makes Inductor
    partition a graph around "dynamic shape ops" under CUDA graphs)."""
    real = inductor.compile_fx_inner

    def spy(gm, example_inputs, **kwargs):
        nodes = [(n.op, n.name, str(n.target)[:60], _symbolic(n.meta.get("val"))) for n in gm.graph.nodes]
        nodes = [n for n in nodes if n[3]]
        print(f"-- compile ({'backward' if kwargs.get('is_backward') else 'forward'}): {len(nodes)} symbolic nodes",
              flush=True)
        for node in nodes[:12]:
            print(f"   {node}", flush=True)
        return real(gm, example_inputs, **kwargs)
    inductor.compile_fx_inner = spy


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default="transformer,sage_max")
    parser.add_argument("--graph", default="rmat-arxiv")
    parser.add_argument("--mode", default="gnn_io_cg")
    parser.add_argument("--symbols", action="store_true", help="print each compiled graph's symbolic nodes")
    args = parser.parse_args()
    if args.symbols:
        _spy_symbols()
    rows = []
    for layer in args.layers.split(","):
        torch._dynamo.reset()
        counters.clear()
        step = layer_step(layer, args.graph, args.mode)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        seen = dict(counters["inductor"])
        rows.append((layer, seen.get("cudagraph_skips", 0), seen.get("cudagraph_recorded_non_static_inputs", 0)))
        print(f"== {layer}: {seen}", flush=True)
    print("\n| layer | cudagraph_skips | recorded non-static inputs |\n| --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")


if __name__ == "__main__":
    main()
