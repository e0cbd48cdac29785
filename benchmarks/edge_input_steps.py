"""Layers whose edge inputs need a gradient: host waits per step, and the step time, by mode.

PyG's self-loop code indexes the edge weights or edge features by a mask. Where those need a gradient (edge
features made by an encoder) the indexing is not structure, and until session 32 it stayed in the compiled graph:
a ``nonzero`` and a host wait at every call, and a failed compile under ``GNN_IO_CUDAGRAPHS=1``
(``plan.select_by_structure_masks``). Usage, on the GPU machine:

    python -m benchmarks.edge_input_steps --graph rmat-arxiv [--layers gat_edge,gcn_weight] [--reps 30]

The last table gives, per layer and mode, the synchronising calls of one warmed-up step and its median time.
"""
from __future__ import annotations

import argparse
import os

import torch

from benchmarks.harness import graph_suite, median_ms
from benchmarks.sync_probe import probe

EDGE_DIM = 16
MODES = ("eager", "inductor", "gnn_io", "gnn_io_cg")


def make(layer: str, features: int) -> torch.nn.Module:
    from torch_geometric import nn as pyg

    if layer == "gat_edge":
        return pyg.GATConv(features, features // 4, heads=4, edge_dim=EDGE_DIM)
    if layer == "gcn_weight":
        return pyg.GCNConv(features, features)
    raise ValueError(f"unknown layer {layer!r}: gat_edge or gcn_weight")


def layer_step(layer: str, mode: str, graph, features: int, device):
    """One forward+backward of ``layer`` in ``mode``, the edge input a leaf that needs a gradient."""
    torch._dynamo.reset()
    os.environ["GNN_IO_CUDAGRAPHS"] = "1" if mode == "gnn_io_cg" else "0"
    torch._dynamo.config.capture_dynamic_output_shape_ops = True  # as the backend sets it: one graph per layer
    torch.manual_seed(0)
    model = make(layer, features).to(device)
    if mode != "eager":
        model = torch.compile(model, backend="inductor" if mode == "inductor" else "gnn_io")
    edge_index = graph.edge_index.to(device)
    num_edges = edge_index.shape[1]
    x = torch.randn(graph.num_nodes, features, device=device, requires_grad=True)
    edge_input = (torch.randn(num_edges, EDGE_DIM, device=device) if layer == "gat_edge"
                  else torch.rand(num_edges, device=device) + 0.1).requires_grad_()
    grad = torch.randn(graph.num_nodes, features, device=device)

    def step():
        x.grad = edge_input.grad = None
        for p in model.parameters():
            p.grad = None
        if mode == "gnn_io_cg":
            torch.compiler.cudagraph_mark_step_begin()
        model(x, edge_index, edge_input).backward(grad)
    return step


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--graph", default="rmat-arxiv")
    parser.add_argument("--layers", default="gat_edge,gcn_weight")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    import gnn_inductor  # noqa: F401  (registers the backend)

    device = torch.device(args.device)
    (graph,) = graph_suite([args.graph], os.environ.get("GNN_IO_DATA", "../shared/data"), device)
    rows = []
    for layer in args.layers.split(","):
        for mode in args.modes.split(","):
            try:
                step = layer_step(layer, mode, graph, args.features, device)
                for _ in range(3):
                    step()
                syncs = len(probe(step, 1))
                ms = median_ms(step, args.reps)
                rows.append((layer, mode, str(syncs), f"{ms:.3f}"))
            except Exception as exc:  # noqa: BLE001  (a mode that fails is a result)
                rows.append((layer, mode, "-", f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:90]}"))
            print(" | ".join(rows[-1]), flush=True)
    print(f"\n{args.graph}: {graph.num_nodes} nodes, {graph.edge_index.shape[1]} edges, {args.features} features, "
          f"edge inputs needing a gradient; {torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}, "
          f"torch {torch.__version__}\n")
    print("| layer | mode | synchronising calls per step | ms per step |\n| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
