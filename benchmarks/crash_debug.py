"""Debug aid: one layer's forward+backward under ``gnn_io`` on one graph, each variant in its own process
(a CUDA fault poisons the process), with ``CUDA_LAUNCH_BLOCKING=1`` so the traceback names the launch that
faulted. Prints one line per variant, then the failing tracebacks.

    python -m benchmarks.crash_debug gat Planetoid-Cora [VAR=VALUE,...] [VAR=VALUE,...] ...

Each extra argument is one variant: comma-separated environment settings (``-`` for none).
"""
import os
import subprocess
import sys
import traceback


def child(layer_name: str, graph_name: str) -> None:
    import torch

    from benchmarks.harness import graph_suite, make_layer

    device = torch.device("cuda")
    if os.environ.get("CRASH_DEBUG_TRACE_GRADS"):
        from gnn_inductor.kernels.attention import op as attention_op

        impl = attention_op.attention_backward._init_fn

        def traced(grad_out, args, *rest):
            grads = impl(grad_out, args, *rest)
            for i, (a, g) in enumerate(zip(args, grads)):
                print(f"grad {i}: arg {tuple(a.shape)} {a.stride()} off {a.storage_offset()} ptr%16 {a.data_ptr() % 16}"
                      f" | grad {tuple(g.shape)} {g.stride()} off {g.storage_offset()} ptr%16 {g.data_ptr() % 16}"
                      f" {g.dtype}", flush=True)
            print(f"grad_out {tuple(grad_out.shape)} {grad_out.stride()} ptr%16 {grad_out.data_ptr() % 16}", flush=True)
            return grads
        attention_op.attention_backward.register_kernel("cuda")(traced)
    (graph,) = graph_suite([graph_name], os.environ.get("GNN_IO_DATA", "../shared/data"), device)
    torch.manual_seed(0)
    layer = make_layer(layer_name, 128).to(device)
    model = torch.compile(layer, backend="gnn_io")
    x = torch.randn(graph.num_nodes, 128, device=device, requires_grad=True)
    edge_index = graph.edge_index.to(device)
    reference = layer(x, edge_index)
    reference.sum().backward()
    ref_grad = x.grad
    x.grad = None
    out = model(x, edge_index)
    torch.cuda.synchronize()
    print("forward ok", float((out - reference).abs().max()), flush=True)
    out.sum().backward()
    torch.cuda.synchronize()
    print("backward ok", float((x.grad - ref_grad).abs().max()), flush=True)
    for _ in range(3):
        x.grad = None
        model(x, edge_index).sum().backward()
    torch.cuda.synchronize()
    print("repeat ok", flush=True)


def main():
    if sys.argv[1] == "--child":
        try:
            child(sys.argv[2], sys.argv[3])
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            sys.exit(1)
        return
    layer_name, graph_name, variants = sys.argv[1], sys.argv[2], sys.argv[3:] or ["-"]
    failures = []
    for variant in variants:
        env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
        if variant != "-":
            env.update(kv.split("=", 1) for kv in variant.split(","))
        proc = subprocess.run([sys.executable, "-m", "benchmarks.crash_debug", "--child", layer_name, graph_name],
                              env=env, capture_output=True, text=True, timeout=300)
        status = "ok" if proc.returncode == 0 else "FAILED"
        last = [line for line in proc.stdout.splitlines() if line.strip()][-1:] or [""]
        print(f"{layer_name} {graph_name} [{variant}]: {status} {last[0]}", flush=True)
        if proc.returncode:
            failures.append((variant, proc.stdout[-2000:] + proc.stderr[-6000:]))
    for variant, text in failures:
        print(f"\n===== {variant} =====\n{text}")


if __name__ == "__main__":
    main()
