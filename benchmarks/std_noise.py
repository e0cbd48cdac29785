"""Where a standard-deviation layer's compiled gradients differ from eager float32, who is closer to exact?

``tests/kernels/test_gather_scatter_triton.py::test_compiled_layers_share_one_pass[multi_aggregation]`` failed on
CUDA in sessions 29 and 30 (``lin.weight``'s gradient, 5e-5 relative against 1e-5 allowed), once in several runs.
This builds that test's layers and graph, compiles each with ``gnn_io`` and, over many calls, measures every output
and gradient against an eager float64 copy for three runs: the compile, eager float32, and eager float32 again
(eager's CUDA scatters use atomics, so two eager runs differ). Usage, on the GPU machine:

    python -m benchmarks.std_noise [--calls 20]

The last table gives, per tensor, the largest relative error (norm) over the calls of each run against float64, the
largest element error over the largest element (peak) of the compile and of eager, and how many calls the plain float32 check (the compile against eager float32, rtol 1e-5) failed.
"""
from __future__ import annotations

import argparse
import copy
import os

import torch

from gnn_inductor.testing import TOLERANCES, _step


def _relative(a: torch.Tensor, exact: torch.Tensor) -> float:
    return float((a.double() - exact).norm() / exact.norm().clamp_min(1e-30))


def _peak(a: torch.Tensor, exact: torch.Tensor) -> float:
    """The largest element error over the largest element: what the plain check's atol scales with."""
    return float((a.double() - exact).abs().max() / exact.abs().max().clamp_min(1e-30))


def _plain_check_fails(a: torch.Tensor, e: torch.Tensor) -> bool:
    rtol, atol_scale = TOLERANCES[torch.float32]
    atol = atol_scale * max(1.0, float(e.abs().max()) if e.numel() else 1.0)
    return not torch.allclose(a, e, rtol=rtol, atol=atol)


def _tensors(step) -> dict:
    outputs, params, inputs = step
    named = {f"output {i}": o for i, o in enumerate(outputs)}
    named.update({f"grad {n.removeprefix('_orig_mod.')}": g for n, g in params if g is not None})
    named.update({f"grad input {i}": g for i, g in enumerate(inputs) if g is not None})
    return named


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    os.environ.update(GNN_IO_STRICT="1", GNN_IO_FORCE="1", GNN_IO_GS_MAX_EDGES="8")
    from gnn_inductor.testing import random_graph
    from tests.kernels import test_gather_scatter_triton as t

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for name, make in t.COMPILED_MULTI.items():
        torch.manual_seed(0)
        edge_index = random_graph(t.NUM_NODES, 50, seed=3, hub_degree=t.HUB_DEGREE, num_isolated=3).to(device)
        model = make(edge_index.cpu()).to(device)
        x = torch.randn(t.NUM_NODES, 4, device=device)
        exact_model, eager = copy.deepcopy(model).double(), copy.deepcopy(model)
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="gnn_io")

        def leaves(dtype=None):
            return [x.detach().to(dtype or x.dtype, copy=True).requires_grad_(True), edge_index]

        worst: dict = {}
        for call in range(args.calls):
            exact = _tensors(_step(exact_model, leaves(torch.float64), True, call, {}))
            runs = {"compiled": _tensors(_step(compiled, leaves(), True, call, {})),
                    "eager": _tensors(_step(eager, leaves(), True, call, {})),
                    "eager again": _tensors(_step(eager, leaves(), True, call, {}))}
            for key, e in exact.items():
                w = worst.setdefault(key, dict.fromkeys(["compiled", "eager", "eager again", "compiled peak", "eager peak",
                                                          "fails"], 0.0))
                for run, named in runs.items():
                    w[run] = max(w[run], _relative(named[key], e))
                for run in ("compiled", "eager"):
                    w[f"{run} peak"] = max(w[f"{run} peak"], _peak(runs[run][key], e))
                w["fails"] += _plain_check_fails(runs["compiled"][key], runs["eager"][key])
        rows += [(name, key, w) for key, w in worst.items()]
    print(f"\n{args.calls} calls each on {device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}),"
          f" torch {torch.__version__}; relative error (norm) against eager float64, the largest over the calls")
    print(f"{'layer':<18} {'tensor':<28} {'compiled':>10} {'eager':>10} {'eager again':>12} {'compiled peak':>14} {'eager peak':>11} {'plain fails':>12}")
    for name, key, w in rows:
        print(f"{name:<18} {key:<28} {w['compiled']:>10.2e} {w['eager']:>10.2e} {w['eager again']:>12.2e} "
              f"{w['compiled peak']:>14.2e} {w['eager peak']:>11.2e} {int(w['fails']):>12}")


if __name__ == "__main__":
    main()
