"""Inference with a compiled model: ``model.eval()``, ``torch.no_grad()``, ``backend="gnn_io"``.

    python examples/inference.py                         # CPU: 20k nodes, 200k edges
    python examples/inference.py --device cuda --large   # GPU: 2^20 nodes, 16M edges
    python examples/inference.py --checkpoint model.pt   # your trained weights (a state_dict)

A 2-layer GCN predicts the classes of every node of a synthetic graph (examples/example_data.py); without
``--checkpoint`` its weights are untrained. The first call compiles the inference graph and builds the graph plan
(self loops, GCN's normalisation, the CSR order); later calls on the same ``edge_index`` reuse the plan and run
only the aggregations and the linear layers. The output is compared with the eager model's.

``torch.inference_mode()`` works too; make the graph's tensors outside it, because tensors made inside have no
version counter and a plan for them is never reused (docs/usage.md, "Editing a graph in place").
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv

import gnn_inductor
from example_data import planted_graph


class GCN(torch.nn.Module):
    def __init__(self, in_channels: int, hidden: int, num_classes: int):
        super().__init__()
        self.conv1 = GCNConv(in_channels, hidden)
        self.conv2 = GCNConv(hidden, num_classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.dropout(x, p=0.5, training=self.training)
        x = F.relu(self.conv1(x, edge_index))
        return self.conv2(x, edge_index)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--large", action="store_true", help="2^20 nodes and 16M edges (for a GPU)")
    parser.add_argument("--checkpoint", help="a state_dict saved with torch.save(model.state_dict(), path)")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--cpu-rewrites", action="store_true",
                        help="see the rewrites on CPU (the ops' reference code, slower than Inductor's)")
    args = parser.parse_args()

    torch.manual_seed(0)
    nodes, edges = (1 << 20, 16_000_000) if args.large else (20_000, 200_000)
    data = planted_graph(nodes, edges, features=128).to(args.device)
    model = GCN(data.num_features, 128, int(data.y.max()) + 1).to(args.device)
    if args.checkpoint:
        model.load_state_dict(torch.load(args.checkpoint, map_location=args.device))
    model.eval()  # before compiling: the compiled graph is the inference one (no dropout)
    options = {"cpu_rewrite": True} if args.cpu_rewrites else None
    compiled = torch.compile(model, backend="gnn_io", options=options)

    times = []
    with torch.no_grad():
        for _ in range(args.calls):
            start = time.perf_counter()
            logits = compiled(data.x, data.edge_index)
            pred = logits.argmax(dim=-1).cpu()  # waits for the result
            times.append(time.perf_counter() - start)
        expected = model(data.x, data.edge_index)
    later = sorted(times[1:]) or times
    print(f"calls: first {times[0]:.2f}s (compiles, builds the graph plan), median of the rest "
          f"{later[len(later) // 2] * 1e3:.2f} ms")
    print(f"predicted {len(pred)} nodes; max |compiled - eager| {(logits - expected).abs().max().item():.2e}")
    print()
    gnn_inductor.report(model)


if __name__ == "__main__":
    main()
