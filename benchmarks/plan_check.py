"""What the plan cache's structure fingerprint costs at each reuse of a graph plan (gnn_inductor/plan/cache.py).

    python -m benchmarks.plan_check --edges 10556,1166243,16000000,62000000

For ``[2, E]`` int64 edge indices on the device: the host time of one cache hit (the Python lookup, the
fingerprint's two launches and the one sync that compares it; the GPU idle before each call, as in a host-bound
step) with the check on and with ``GNN_IO_PLAN_CHECK=version``, and the GPU time of the fingerprint alone (CUDA
events). Medians of ``--calls`` calls; a table last.
"""
import argparse
import statistics
import time

import torch

from gnn_inductor.plan.fingerprint import fingerprint
from gnn_inductor.plan.cache import PlanCache


def host_us(cache: PlanCache, inputs: list, calls: int) -> float:
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        cache(inputs)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def gpu_ms(edge_index: torch.Tensor, calls: int) -> float:
    times = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fingerprint(edge_index)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--edges", default="10556,1166243,16000000,62000000")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    rows = []
    for edges in (int(e) for e in args.edges.split(",")):
        edge_index = torch.randint(0, max(2, edges // 16), (2, edges), device="cuda")
        row = {"edges": edges}
        for name in ("fingerprint", "version"):
            cache = PlanCache(lambda e: (e.sum(),), check=name)
            cache([edge_index])
            host_us(cache, [edge_index], 10)
            row[f"{name}_host_us"] = host_us(cache, [edge_index], args.calls)
            assert cache.builds == 1, "every call after the first must reuse the plan"
        gpu_ms(edge_index, 10)
        row["fingerprint_gpu_ms"] = gpu_ms(edge_index, args.calls)
        print(row, flush=True)
        rows.append(row)
        del edge_index
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| edges | host us per reuse, fingerprint | host us per reuse, version only | fingerprint GPU ms |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['edges']:,} | {r['fingerprint_host_us']:.1f} | {r['version_host_us']:.1f} | "
              f"{r['fingerprint_gpu_ms']:.3f} |")


if __name__ == "__main__":
    main()
