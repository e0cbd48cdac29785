"""CPU cost of one gnn_io op call on a tiny graph (GPU work negligible), taken apart: through the dispatcher
(``torch.ops``), its direct twin (what compiled graphs call, gnn_inductor/passes/direct_ops.py), the op's Python alone (its implementation called directly), the same with its kernel launches
skipped, and one bare launch of its kernel; each row with Triton's JIT launching the kernels
(``GNN_IO_FAST_LAUNCH=0``) and with kernels/runtime/launch.py's fast path (the default).

    python -m benchmarks.op_overhead

Microseconds per call, median of 5 rounds of 2000 calls, CPU issue time only (the GPU queue is drained
between rounds).
"""
import os
import statistics
import time

import torch

import gnn_inductor.kernels  # noqa: F401  (registers the ops)
from gnn_inductor.passes import direct_ops
from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor.kernels.gather_scatter import op as gather_scatter, fused as gather_scatter_triton
from gnn_inductor.kernels.gather_scatter import launches as gs_launches
from gnn_inductor.kernels.gather_scatter.template import KernelSpec
from gnn_inductor.kernels.runtime import fill
from gnn_inductor.testing import random_graph


def per_call_us(fn, calls: int = 2000, rounds: int = 5) -> float:
    for _ in range(50):
        fn()
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def main():
    table = {}
    for fast in ("0", "1"):
        os.environ["GNN_IO_FAST_LAUNCH"] = fast
        for name, us in rows_of_one_setting():
            table.setdefault(name, {})[fast] = us
    print("| what | us per call, Triton's JIT launch | fast launch |\n|---|---|---|")
    for name, cells in table.items():
        print(f"| {name} | {cells['0']:.1f} | {cells['1']:.1f} |")


def rows_of_one_setting() -> list:
    device = torch.device("cuda")
    num_nodes = 256
    src, dst = random_graph(num_nodes, 2048, seed=0).to(device)
    rowptr, col, row, perm, *t_plan = torch.ops.gnn_io.csr_plan(dst, src, num_nodes, num_nodes)
    items = list(torch.ops.gnn_io.gather_scatter_items(rowptr, col))
    t_items = list(torch.ops.gnn_io.gather_scatter_items(t_plan[0], t_plan[1]))
    key = edge_functions.register(torch.fx.symbolic_trace(lambda x_j: x_j))
    x = torch.randn(num_nodes, 128, device=device)
    rows = []
    for reduce in ("sum", "max"):
        call = (([x], [0], rowptr, col, row, perm, key, reduce, False, t_plan, items, t_items))
        rows.append((f"forward {reduce}: torch.ops", per_call_us(
            lambda: torch.ops.gnn_io.gather_scatter_forward(*call))))
        twin = direct_ops.twin(torch.ops.gnn_io.gather_scatter_forward.default)
        rows.append((f"forward {reduce}: direct twin (compiled graphs)", per_call_us(lambda: twin(*call))))
        impl = gather_scatter.gather_scatter_forward._init_fn
        rows.append((f"forward {reduce}: implementation", per_call_us(lambda: impl(*call))))
        launches = []
        real_launch = gs_launches.launch
        gs_launches.launch = lambda *a, **k: launches.append(1)
        try:
            rows.append((f"forward {reduce}: implementation, no launch", per_call_us(lambda: impl(*call))))
        finally:
            gs_launches.launch = real_launch
        grad = torch.randn(num_nodes, 128, device=device)
        bwd = (grad, [x], [0], rowptr, col, row, perm, key, reduce, [True], None, None, t_plan, items, t_items)
        rows.append((f"backward {reduce}: torch.ops", per_call_us(
            lambda: torch.ops.gnn_io.gather_scatter_backward(*bwd))))
    plan = gather_scatter_triton.make_plan(rowptr, col, row, perm, num_nodes, *t_plan, items, t_items)
    lowered = gs_launches.lowering(key, gs_launches.argument_specs([x], [0]))
    spec = KernelSpec("forward", "dst", "sum", members=(("sum", 0),))
    kernel = gs_launches.kernel((lowered,), spec)
    out = torch.zeros(num_nodes, 128, device=device)
    tensors = [x, out, out, plan.rowptr, plan.col, plan.col, plan.perm, *plan.items]
    launch = gs_launches.LAUNCH
    rows.append(("one launch of the forward kernel", per_call_us(
        lambda: gs_launches.launch(kernel, plan.items[0].shape[0], tensors, 128, launch))))
    rows.append(("one launch of the rows-without-entries kernel", per_call_us(
        lambda: fill.zero_rows_without_entries(out, plan.rowptr))))
    rows.append(("torch.zeros([256, 128])", per_call_us(lambda: torch.zeros(num_nodes, 128, device=device))))
    rows.append(("x.add(1) (one ATen kernel)", per_call_us(lambda: x.add(1))))
    return rows


if __name__ == "__main__":
    main()
