"""Full-graph training in bfloat16 autocast: a 2-layer graph transformer (TransformerConv) compiled with
``backend="gnn_io"``.

    python examples/bf16_large.py                         # CPU: 4,096 nodes, 64k edges
    python examples/bf16_large.py --device cuda --large   # GPU: 262,144 nodes, 8M edges
    python examples/bf16_large.py --epochs 1              # the shortest run

The graph is synthetic and locally dense (examples/example_data.py): communities of 32 consecutive nodes that
hold 90% of the edges, as in a batch of small graphs or a community graph in a good node order. Under
``torch.autocast`` the linear layers run in bfloat16, so each layer's attention op gets bfloat16 inputs (it
accumulates in float32). On such graphs and a GPU, the backend times its block-sparse Tensor-Core attention
against its CSR kernel at the first call and keeps the faster (docs/kernel_selection.md); the report names the
path taken. On the CPU the cost model leaves the attention to Inductor (``--cpu-rewrites`` takes the rewrites, to
see them: the ops' reference code, slower than Inductor's).
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch_geometric.nn import TransformerConv

import gnn_inductor
from example_data import planted_graph


class GraphTransformer(torch.nn.Module):
    def __init__(self, in_channels: int, hidden: int, heads: int, num_classes: int):
        super().__init__()
        self.conv1 = TransformerConv(in_channels, hidden, heads=heads)
        self.conv2 = TransformerConv(hidden * heads, num_classes, heads=1)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--large", action="store_true", help="262,144 nodes and 8M edges (for a GPU)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--cpu-rewrites", action="store_true",
                        help="see the rewrites on CPU (the ops' reference code, slower than Inductor's)")
    args = parser.parse_args()

    torch.manual_seed(0)
    nodes, edges = (1 << 18, 8_000_000) if args.large else (4096, 64_000)
    data = planted_graph(nodes, edges, features=128, community=32, inside=0.9).to(args.device)
    print(f"graph: {data.num_nodes} nodes, {data.num_edges} edges")
    model = GraphTransformer(data.num_features, 32, 4, int(data.y.max()) + 1).to(args.device)
    options = {"cpu_rewrite": True} if args.cpu_rewrites else None
    compiled = torch.compile(model, backend="gnn_io", options=options)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.005)

    device_type = torch.device(args.device).type
    epoch_times = []
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        model.train()
        optimizer.zero_grad()
        with torch.autocast(device_type, dtype=torch.bfloat16):
            logits = compiled(data.x, data.edge_index)
            loss = F.cross_entropy(logits[data.train_mask].float(), data.y[data.train_mask])
        loss.backward()  # parameters and their gradients stay float32
        optimizer.step()
        loss = loss.item()  # waits for the step
        epoch_times.append(time.perf_counter() - start)
        print(f"epoch {epoch:3d}  loss {loss:.4f}  {epoch_times[-1] * 1e3:.1f} ms")

    later = sorted(epoch_times[1:]) or epoch_times
    print(f"epochs: first {epoch_times[0]:.2f}s (compiles, builds the graph plan), median of the rest "
          f"{later[len(later) // 2] * 1e3:.1f} ms")
    model.eval()
    with torch.no_grad(), torch.autocast(device_type, dtype=torch.bfloat16):
        pred = compiled(data.x, data.edge_index).argmax(dim=-1)
    print(f"test accuracy: {(pred[data.test_mask] == data.y[data.test_mask]).float().mean():.3f}")
    print()
    gnn_inductor.report(model)


if __name__ == "__main__":
    main()
