"""What the probe's parts share (``benchmarks/probe.py``, ``benchmarks/probe_sweeps.py``): the attention shapes, the
rows every part emits (printed as JSON and kept for the table), the attention families' edge functions and inputs,
a synchronised timer and the relative error."""
from __future__ import annotations

import json
import time

import torch

from gnn_inductor.kernels.runtime import edge_functions
from gnn_inductor.kernels.runtime.roles import ROLE_DENSE, ROLE_DST, ROLE_SRC
from gnn_inductor.plan import state as graph_state

HEADS, CHANNELS, FEATURES = 4, 32, 128
aten = torch.ops.aten
ROWS = []



def emit(**row):
    ROWS.append(row)
    print(json.dumps({"probe": row}), flush=True)


def _dot_score(a0, a1, a2):
    return aten.div.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(a1, a2), [-1]), CHANNELS ** 0.5)


def _dot_message(alpha, a0, a1, a2):
    return aten.mul.Tensor(a0, aten.view.default(alpha, [-1, HEADS, 1]))


def edge_fn(f) -> str:
    return edge_functions.register(torch.fx.symbolic_trace(f))


def sync_ms(fn):
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, (time.perf_counter() - start) * 1e3

def rel_err(a, b):
    return float((a.detach().float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-30))


def _gat_score(a0, a1, a2):
    return aten.leaky_relu.default(aten.add.Tensor(a1, a2), 0.2)


def _gat_message(alpha, a0, a1, a2):
    return aten.mul.Tensor(aten.unsqueeze.default(alpha, -1), a0)


def _gatv2_score(a0, a1, a2):
    return aten.sum.dim_IntList(aten.mul.Tensor(aten.leaky_relu.default(aten.add.Tensor(a1, a0), 0.2), a2), [-1])


def family_inputs(family, num_nodes, device, generator):
    """(score key, message key, roles, float32 inputs) of a GATConv / GATv2Conv / TransformerConv attention."""
    def vec(rows=num_nodes):
        return torch.randn(rows, HEADS, CHANNELS, device=device, generator=generator)
    if family == "dot":
        return edge_fn(_dot_score), edge_fn(_dot_message), [ROLE_SRC, ROLE_DST, ROLE_SRC], [vec(), vec(), vec()]
    if family == "gat":
        scalars = [torch.randn(num_nodes, HEADS, device=device, generator=generator) for _ in range(2)]
        return edge_fn(_gat_score), edge_fn(_gat_message), [ROLE_SRC, ROLE_SRC, ROLE_DST], [vec(), *scalars]
    return (edge_fn(_gatv2_score), edge_fn(_gat_message), [ROLE_SRC, ROLE_DST, ROLE_DENSE],
            [vec(), vec(), vec(1) * 0.2])


def reset_decisions():
    """Forget the path decisions (the orders and block formats of each plan stay cached)."""
    graph_state.forget_decisions()
