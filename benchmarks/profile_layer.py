"""Where the time goes: profiler table of one layer's forward+backward in one mode.

    python -m benchmarks.profile_layer --layer gcn --graph rmat-arxiv --mode gnn_io
"""
import argparse
import os

import torch

from benchmarks.harness import MODE_ENV, build, graph_suite
from benchmarks.layers import make_layer, with_graph


def layer_step(layer: str, graph_name: str, mode: str, features: int = 128, device=None, graph=None,
               dtype=torch.float32, data_root=None):
    """``step()``: one forward+backward of ``layer`` compiled in ``mode`` (its harness environment applied) on
    ``graph_name`` (read from ``data_root``, by default ``GNN_IO_DATA`` or ``../shared/data``; or the loaded
    ``graph``), on CUDA unless ``device`` says otherwise, with every gradient
    set to None first, as the harness times it. Same seed, same weights and inputs for every mode."""
    os.environ.update(MODE_ENV.get(mode, {}))
    device = torch.device(device or "cuda")
    if graph is None:
        data_root = data_root or os.environ.get("GNN_IO_DATA", os.path.join("..", "shared", "data"))
        (graph,) = graph_suite([graph_name], data_root, device)
    torch.manual_seed(0)
    edge_index = graph.edge_index.to(device)
    model = build(mode, with_graph(make_layer(layer, features).to(device=device, dtype=dtype), edge_index))
    x = torch.randn(graph.num_nodes, features, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(graph.num_nodes, features, device=device, dtype=dtype)

    def forward():
        x.grad = None
        for p in model.parameters():
            p.grad = None
        if "cg" in mode:  # CUDA-graph modes: a new training step, earlier outputs are dead (as the harness marks it)
            torch.compiler.cudagraph_mark_step_begin()
        return model(x, edge_index)

    def step():
        forward().backward(grad)
    step.forward, step.grad = forward, grad
    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer", default="gcn")
    parser.add_argument("--graph", default="rmat-arxiv")
    parser.add_argument("--mode", default="gnn_io")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16, float16")
    parser.add_argument("--tf32", action="store_true", help="allow TF32 matmuls (float32)")
    parser.add_argument("--data-root", default=None, help="the real graphs' folder (default: GNN_IO_DATA or "
                        "../shared/data)")
    args = parser.parse_args()
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.set_float32_matmul_precision("high")
    step = layer_step(args.layer, args.graph, args.mode, args.features, dtype=getattr(torch, args.dtype),
                      data_root=args.data_root)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    print(f"== {args.layer} {args.graph} {args.mode} {args.dtype}{' tf32' if args.tf32 else ''}: per 10 steps")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
