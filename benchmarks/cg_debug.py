"""Debug aid: one layer under GNN_IO_CUDAGRAPHS=1 (forced rewrite) on a graph, full traceback on failure.

    GNN_IO_CUDAGRAPHS=1 GNN_IO_FORCE=1 python -m benchmarks.cg_debug gcn rmat-arxiv
"""
import gc
import os
import re
import sys
import traceback

import torch

from benchmarks.harness import graph_suite, make_layer


def holders(pointers: set, depth: int = 3) -> None:
    """Print what keeps the live tensors at ``pointers`` alive: their referrers' types, up to ``depth`` levels,
    with a dict's keys and a function's or module's name where there is one."""
    tensors = [t for t in gc.get_objects() if isinstance(t, torch.Tensor) and t.is_cuda
               and t.untyped_storage().data_ptr() in pointers]
    for t in tensors:
        print(f"live tensor {tuple(t.shape)} {t.dtype} at {t.untyped_storage().data_ptr()}")
        level = [t]
        for d in range(depth):
            nxt = []
            for obj in level:
                for ref in gc.get_referrers(obj):
                    if ref is level or isinstance(ref, list) and ref is tensors:
                        continue
                    what = type(ref).__name__
                    if isinstance(ref, dict):
                        what += " keys " + str(list(ref.keys())[:6])[:200]
                    elif hasattr(ref, "__qualname__"):
                        what += " " + ref.__qualname__
                    print("  " * (d + 1) + "<- " + what)
                    nxt.append(ref)
            level = nxt[:8]


def main():
    torch._inductor.config.triton.cudagraph_trees_history_recording = True
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
        # the harness's plan-build timing: the same graph in a new edge_index tensor (a plan cache miss)
        for _ in range(2):
            torch.compiler.cudagraph_mark_step_begin()
            model(x, graph.edge_index.clone())
        torch.cuda.synchronize()
        print(layer_name, graph_name, "fresh edge_index ok")
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        holders({int(p) for p in re.findall(r"(\d{6,})", str(exc).split("Allocations")[0])})


if __name__ == "__main__":
    main()
