"""What is alive on the GPU at the peak of one training step, and where each block was allocated.

    python -m benchmarks.memory_anatomy --layers gat,transformer --graph rmat-large --modes gnn_io,inductor

Per (layer, mode): one forward+backward step (as :func:`benchmarks.profile_layer.layer_step` builds it) is
run under ``torch.cuda.memory._record_memory_history``; the allocator's trace is replayed to find the peak of
the step, and the blocks alive at that moment (allocated before the step or during it) are listed, largest
first (and the blocks resident before the step, recorded from the layer's build on), each with the innermost
Python frame outside torch's own sources and, for Inductor's generated code, that source line. A short table
last: resident GB before the step, peak GB, and the step's share.
"""
import argparse
import linecache
import os

import torch

from benchmarks.profile_layer import layer_step

MB = 2**20
_TORCH_DIR = os.path.dirname(torch.__file__)


def _where(frames) -> str:
    """The innermost frame that is not torch's own machinery, with its source line when readable."""
    for frame in frames:
        name = frame.get("filename", "")
        if name.startswith(_TORCH_DIR) and "torchinductor" not in name:
            continue
        if name.startswith("<") or not name.endswith(".py") and "torchinductor" not in name:
            continue
        line = linecache.getline(name, frame.get("line", 0)).strip()
        return f"{os.path.basename(name)}:{frame.get('line')} {frame.get('name')}: {line[:110]}"
    return "(torch internals)"


def live_at_peak(trace) -> tuple:
    """Replay one device's trace: (peak bytes of the traced blocks, [(size, where)] alive at the peak)."""
    live, current, peak, at_peak = {}, 0, 0, {}
    for event in trace:
        action, addr, size = event["action"], event["addr"], event["size"]
        if action == "alloc":
            live[addr] = (size, _where(event.get("frames", [])))
            current += size
            if current > peak:
                peak, at_peak = current, dict(live)
        elif action == "free_requested" and addr in live:
            current -= live.pop(addr)[0]
    return peak, sorted(at_peak.values(), key=lambda b: -b[0])


def resident_blocks(snapshot) -> list:
    """[(size, where)] of the blocks allocated (and traced) at the time of ``snapshot``, largest first."""
    blocks = [(b["size"], _where(b.get("frames", []))) for segment in snapshot["segments"]
              for b in segment["blocks"] if b["state"] == "active_allocated"]
    return sorted(blocks, key=lambda b: -b[0])


def anatomy(layer: str, graph: str, mode: str, rows: int) -> dict:
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    try:
        step = layer_step(layer, graph, mode)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        resident = torch.cuda.memory_allocated()
        before = torch.cuda.memory._snapshot()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    peak = torch.cuda.max_memory_allocated()
    trace = snapshot["device_traces"][0]
    traced_peak, blocks = live_at_peak(trace[len(before["device_traces"][0]):])
    print(f"== {layer} {graph} {mode}: resident {resident / 2**30:.2f} GB, peak {peak / 2**30:.2f} GB, "
          f"step {(peak - resident) / 2**30:.2f} GB (traced blocks at the peak {traced_peak / 2**30:.2f} GB)")
    print("  resident before the step:")
    for size, where in resident_blocks(before)[:rows]:
        if size >= MB:
            print(f"  {size / MB:9.1f} MB  {where}")
    print("  allocated in the step, alive at its peak:")
    for size, where in blocks[:rows]:
        if size >= MB:
            print(f"  {size / MB:9.1f} MB  {where}")
    return {"layer": layer, "mode": mode, "resident": resident / 2**30, "peak": peak / 2**30,
            "step": (peak - resident) / 2**30}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default="gat,gatv2,transformer")
    parser.add_argument("--graph", default="rmat-large")
    parser.add_argument("--modes", default="gnn_io")
    parser.add_argument("--rows", type=int, default=14)
    args = parser.parse_args()
    rows = []
    for layer in args.layers.split(","):
        for mode in args.modes.split(","):
            try:
                rows.append(anatomy(layer, args.graph, mode, args.rows))
            except Exception as exc:  # a crash of one mode (Inductor's GAT at 16M edges) is a result
                print(f"== {layer} {mode}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            torch._dynamo.reset()
            torch.cuda.empty_cache()
    print(f"\n| layer | mode | resident GB | peak GB | step GB |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layer']} | {r['mode']} | {r['resident']:.2f} | {r['peak']:.2f} | {r['step']:.2f} |")


if __name__ == "__main__":
    main()
