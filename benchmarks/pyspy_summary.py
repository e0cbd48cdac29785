"""Where a step's CPU time goes, from py-spy's raw (collapsed) stacks: py-spy samples the process from outside, so
C calls that release the GIL (kernel launches) draw no more samples than they take time, unlike
``benchmarks/stack_sampler.py``; with ``--native`` the stacks go on into C++ (the dispatcher, the CUDA driver).

    py-spy record --native --threads --rate 1000 --format raw -o stacks.txt -- \\
        python -m benchmarks.cpu_profile --layer sage_max --graph rmat-arxiv --loop 400
    python -m benchmarks.pyspy_summary stacks.txt --rows 40

Keeps the samples whose stack holds ``--keep`` (default ``sampled_steps``: the steps, not the compile), plus,
per thread, those of threads that never show it (the autograd engine's device thread runs a CUDA backward), less
compile work (``--drop``). Prints each thread's share and, over the kept samples, inclusive and self shares by
frame.
"""
import argparse
import collections
import re

from benchmarks.stack_sampler import counts_table


def _frame(name: str) -> str:
    """``function (file:line)`` with the file shortened to its last two parts."""
    m = re.match(r"(.*) \((.*?):(\d+)\)$", name)
    if not m:
        return name
    func, path, _ = m.groups()
    return f"{func} ({'/'.join(path.split('/')[-2:])})"


DROP = "compile_fx,codecache,async_compile,convert_frame,triton/compiler"


def _thread_id(label: str) -> str:
    """The thread's id in py-spy's label: one thread is labelled ``thread (1182)`` before it has a name and
    ``thread (1182): MainThread`` after (session 29: the unnamed label's 177 import samples were kept as another
    thread's)."""
    m = re.search(r"\((0x[0-9a-fA-F]+|\d+)\)", label)
    return m.group(1) if m else label


def summarise(lines, keep: str = "sampled_steps", drop: str = DROP, rows: int = 40) -> str:
    """The markdown tables of the module docstring from py-spy's raw lines (``frame;frame;... count``, the first
    frame the thread with ``--threads``)."""
    drops = [d for d in drop.split(",") if d]
    by_thread, labels = collections.defaultdict(list), {}
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit() or any(d in stack for d in drops):
            continue
        frames = stack.split(";")
        thread = _thread_id(frames[0])
        labels[thread] = max(labels.get(thread, ""), frames[0], key=len)
        by_thread[thread].append((frames[1:], int(count)))
    kept = []
    out = ["| thread | samples | under --keep |", "| --- | --- | --- |"]
    for thread, samples in by_thread.items():
        under = [(f, c) for f, c in samples if any(keep in x for x in f)]
        out.append(f"| {labels[thread]} | {sum(c for _, c in samples)} | {sum(c for _, c in under)} |")
        kept += under if under else samples  # a thread without the frame (the autograd device thread): all of it
    total = sum(c for _, c in kept)
    inclusive, own = collections.Counter(), collections.Counter()
    for frames, count in kept:
        names = [_frame(f) for f in frames]
        for name in set(names):
            inclusive[name] += count
        if names:
            own[names[-1]] += count
    return "\n".join(out + ["", counts_table(total, own, inclusive, rows, max(1, total))])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("stacks")
    parser.add_argument("--keep", default="sampled_steps")
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--drop", default=DROP,
                        help="comma-separated: samples whose stack holds any of these are compile work, dropped")
    args = parser.parse_args()
    with open(args.stacks) as f:
        print(summarise(f, args.keep, args.drop, args.rows))


if __name__ == "__main__":
    main()
