"""Debug aid: one layer under GNN_IO_CUDAGRAPHS=1 (forced rewrite) on a graph, full traceback on failure.

    GNN_IO_CUDAGRAPHS=1 GNN_IO_FORCE=1 python -m benchmarks.cg_debug gcn rmat-arxiv
"""
import os
import sys
import traceback

import torch

from benchmarks.harness import graph_suite, make_layer


def main():
    layer_name, graph_name = sys.argv[1], sys.argv[2]
    device = torch.device("cuda")
    (graph,) = graph_suite([graph_name], os.environ.get("GNN_IO_DATA", "../shared/data"), device)
    layer = make_layer(layer_name, 128).to(device)
    model = torch.compile(layer, backend="gnn_io")
    x = torch.randn(graph.num_nodes, 128, device=device, requires_grad=True)
    try:
        with torch.no_grad():
            for _ in range(3):
                torch.compiler.cudagraph_mark_step_begin()
                model(x, graph.edge_index)
        print("no_grad forward ok")
        for _ in range(3):
            x.grad = None
            torch.compiler.cudagraph_mark_step_begin()
            model(x, graph.edge_index).sum().backward()
        torch.cuda.synchronize()
        print(layer_name, graph_name, "ok")
    except Exception:  # noqa: BLE001
        traceback.print_exc()


if __name__ == "__main__":
    main()
