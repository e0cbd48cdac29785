"""Does a compiled training step wait for the GPU anywhere inside it?

A host synchronisation inside a step (``.item()``, ``nonzero``, a device-to-host copy, a stream sync) drains the
GPU's queue: the GPU then idles while the CPU issues what follows. This runs each layer's harness step
(``profile_layer.layer_step``) after its warm-up with ``torch.cuda.set_sync_debug_mode("warn")`` and prints every
synchronising call with the frames of this repository and PyG that led to it. Usage, on the GPU machine:

    python -m benchmarks.sync_probe --cases gat:rmat-large,transformer:rmat-arxiv [--mode gnn_io] [--steps 2]

The last table gives the synchronising calls per step of each case (0 is what a step should have).
"""
from __future__ import annotations

import argparse
import traceback
import warnings

import torch

from benchmarks.profile_layer import layer_step

_KEEP = ("gnn_inductor", "kernels/", "torch_geometric", "benchmarks/", "_dynamo/eval_frame", "output_code.py",
         "runtime_wrappers.py")


def _frames(limit: int = 8) -> list:
    """The innermost ``limit`` frames of the calling stack from this repository, PyG and the compiled wrappers."""
    frames = [f for f in traceback.extract_stack()[:-3] if any(k in f.filename for k in _KEEP)]
    return [f"{f.filename.rsplit('/', 2)[-2]}/{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}"
            for f in frames[-limit:]]


def probe(step, steps: int) -> list:
    """The synchronising calls of ``steps`` calls of ``step`` (warmed up), each with the frames that made it.
    ``probe(control, 1)`` is the positive control: one ``.item()`` must be found."""
    found = []

    def record(message, category, filename, lineno, file=None, line=None):
        if "called a synchronizing" in str(message):  # not the mode's own notice that it is a prototype
            found.append((str(message).splitlines()[0][:120], _frames()))

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    with warnings.catch_warnings():  # restores showwarning and the filters after
        warnings.simplefilter("always")
        warnings.showwarning = record
        if cuda:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                step()
                if not cuda:  # the CPU run checks the capture itself: one made-up sync per step
                    warnings.warn("called a synchronizing CUDA operation (self-check)")
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
    sync()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="gat:rmat-large,transformer:rmat-arxiv,sage_max:rmat-arxiv,"
                                           "gatv2:rmat-arxiv,gcn:rmat-arxiv")
    parser.add_argument("--mode", default="gnn_io")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--device", default="cuda", help="cpu: the script's own check (one made-up sync per step)")
    args = parser.parse_args()
    rows = []
    if args.device == "cuda":
        found = probe(lambda: torch.ones(1, device="cuda").item(), 1)
        print(f"control: one .item() gave {len(found)} synchronising call(s)")
        rows.append(("control: .item()", "-", len(found)))
    for case in args.cases.split(","):
        layer, graph = case.split(":")
        step = layer_step(layer, graph, args.mode, device=args.device)
        for _ in range(3):  # compile, plan, tuning: what a warmed-up step no longer does
            step()
        found = probe(step, args.steps)
        print(f"== {layer} on {graph} ({args.mode}): {len(found)} synchronising calls in {args.steps} steps")
        for message, frames in found:
            print(f"  {message}")
            for frame in frames:
                print(f"      {frame}")
        rows.append((layer, graph, len(found) / args.steps))
        torch._dynamo.reset()
    print(f"\n| layer | graph | mode | synchronising calls per step |\n|---|---|---|---|")
    for layer, graph, per_step in rows:
        print(f"| {layer} | {graph} | {args.mode} | {per_step:g} |")


if __name__ == "__main__":
    main()
