"""Where the time goes: profiler table of one layer's forward+backward in one mode.

    python -m benchmarks.profile_layer --layer gcn --graph rmat-arxiv --mode gnn_io
"""
import argparse
import os

import torch

from benchmarks.harness import build, graph_suite, make_layer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layer", default="gcn")
    parser.add_argument("--graph", default="rmat-arxiv")
    parser.add_argument("--mode", default="gnn_io")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--rows", type=int, default=25)
    args = parser.parse_args()
    device = torch.device("cuda")
    (graph,) = graph_suite([args.graph], os.environ.get("GNN_IO_DATA", "../shared/data"), device)
    torch.manual_seed(0)
    model = build(args.mode, make_layer(args.layer, args.features).to(device))
    x = torch.randn(graph.num_nodes, args.features, device=device, requires_grad=True)
    edge_index = graph.edge_index.to(device)
    grad = torch.randn(graph.num_nodes, args.features, device=device)
    for _ in range(5):
        model(x, edge_index).backward(grad)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            model(x, edge_index).backward(grad)
        torch.cuda.synchronize()
    print(f"== {args.layer} {args.graph} {args.mode}: per 10 steps")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
