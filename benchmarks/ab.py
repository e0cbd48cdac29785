"""Interleaved A/B timing of ``torch.compile`` default against ``gnn_io`` on graphs whose steps are bound by the
CPU that issues them (mid-size and small graphs), where the harness's one-mode-after-the-other medians move by
tens of percent from run to run.

    python -m benchmarks.ab --layers gcn,gin,sage_mean --graphs Planetoid-Cora,ca-AstroPh --rounds 200

Both models are built as the profiler builds them (``profile_layer.layer_step``: same seed, same weights and
inputs) and compiled once (Dynamo guards on the backend, so the two compiled callables live side by side), warmed up, then timed step by step in alternation
(A B B A A B ...), each step synchronised before and after as the harness times it, with Python's garbage
collector off while timing. Per case it prints both medians, the median of the per-round ratios and the share
of rounds gnn_io won, and a table last. The attention path each mode's first call chose is printed (``--``
lines) as it is taken.
"""
import argparse
import gc
import os
import statistics
import time

import torch

from benchmarks.harness import graph_suite, mode_env
from benchmarks.profile_layer import layer_step

MODES = ("inductor", "gnn_io")


def _time(step, device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    step()
    sync()
    return (time.perf_counter() - t) * 1e3


def _built(layer_name, graph, modes, features, device, dtype=torch.float32) -> dict:
    """Each mode's step, built first (each build resets Dynamo), then compiled and warmed up under its own
    environment (read when the backend compiles, at the first calls)."""
    from gnn_inductor.plan import state as graph_state

    steps = {}
    for mode in modes:
        with mode_env(mode):
            steps[mode] = layer_step(layer_name, graph.name, mode, features, device, graph, dtype)
    for mode, step in steps.items():
        with mode_env(mode):
            taken = len(graph_state.decisions())
            for _ in range(10):
                step()
            for d in graph_state.decisions()[taken:]:  # the attention path this mode's first call chose
                print(f"-- {mode}: {d['family']} path {d['path']}, order {d['order']}: {d['reason']}; predicted "
                      f"{d['predicted_ms']}; measured {d['measured_forward_ms']}", flush=True)
    return steps


def ab_case(layer_name: str, graph, features: int, rounds: int, device, modes=MODES, dtype=torch.float32) -> dict:
    """``modes`` (A, B): the baseline first; the record names them ``inductor_ms`` and ``gnn_io_ms`` (A and B)."""
    steps = _built(layer_name, graph, modes, features, device, dtype)
    times = {mode: [] for mode in modes}
    gc.collect()
    gc.disable()
    try:
        for r in range(rounds):
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                with mode_env(mode):  # some switches are read at each call (GNN_IO_ATTENTION_BACKWARD)
                    times[mode].append(_time(steps[mode], device))
    finally:
        gc.enable()
    a, b = modes
    ratios = [x / y for x, y in zip(times[a], times[b])]
    record = {"graph": graph.name, "layer": layer_name, "edges": graph.num_edges, "modes": f"{a} / {b}",
              "inductor_ms": statistics.median(times[a]), "gnn_io_ms": statistics.median(times[b]),
              "ratio": statistics.median(ratios), "won": sum(r > 1 for r in ratios) / len(ratios)}
    print(f"== {record}", flush=True)
    del steps
    torch._dynamo.reset()
    return record


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", default="gcn,gin,sage_mean")
    parser.add_argument("--graphs", default="Planetoid-Cora,ca-AstroPh,MUSAE-github,soc-Slashdot0902,"
                                            "road-luxembourg-osm,rmat-arxiv")
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--modes", default=",".join(MODES), help="A,B: the baseline mode and the one measured against "
                        "it (harness modes, e.g. gnn_io_no_gemm_acc,gnn_io)")
    parser.add_argument("--data-root", default=os.environ.get("GNN_IO_DATA", "../shared/data"))
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16, float16")
    parser.add_argument("--tf32", action="store_true", help="allow TF32 for float32 matmuls (both modes)")
    args = parser.parse_args()
    if args.tf32:
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    rows = []
    for graph in graph_suite(args.graphs.split(","), args.data_root, device):
        for layer in args.layers.split(","):
            rows.append(ab_case(layer, graph, args.features, args.rounds, device, tuple(args.modes.split(",")), dtype))
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    precision = args.dtype + (" (TF32 allowed)" if args.tf32 else "")
    print(f"\ntorch {torch.__version__}, {name}, {precision}, {args.features} features, "
          f"forward+backward, {args.rounds} interleaved rounds, ms (median)\n")
    a, b = args.modes.split(",")
    print(f"| graph | edges | layer | {a} | {b} | median ratio ({a} / {b}) | rounds {b} won |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['graph']} | {r['edges']} | {r['layer']} | {r['inductor_ms']:.2f} | {r['gnn_io_ms']:.2f} | "
              f"{r['ratio']:.2f}x | {100 * r['won']:.0f}% |")


if __name__ == "__main__":
    main()
