"""Structure fingerprints (gnn_inductor/plan/fingerprint.py): what the plan cache compares at each reuse of a graph plan.

The CPU fingerprint (XXH3-128 of the bytes) on every machine; the Triton kernel against a NumPy reference of its
definition on CUDA when there is a GPU, and on CPU tensors under Triton's interpreter in the interpreter tier (``-m triton`` under ``TRITON_INTERPRET=1``, tests/run.py).
"""

import numpy as np
import pytest
import torch

from gnn_inductor.plan import fingerprint as fp
from gnn_inductor.kernels.runtime.launch import INTERPRETED

DEVICE = torch.device("cpu" if INTERPRETED else "cuda")
runs_kernel = pytest.mark.triton  # Triton kernels: the GPU, or the interpreter tier


def tensors() -> list:
    generator = torch.Generator().manual_seed(0)
    return [
        torch.randint(0, 1000, (2, 5000), generator=generator),            # int64 edge_index
        torch.randint(0, 1000, (2, 777), generator=generator).int(),        # int32, odd length
        torch.rand(4097, generator=generator),                              # float32 edge weights, a block + 1
        torch.rand(33, generator=generator, dtype=torch.float64),
        torch.rand(10, generator=generator) > 0.5,                          # bool mask
        torch.randn(9, generator=generator).half(),
        torch.randn(9, generator=generator).bfloat16(),                     # no NumPy dtype
        torch.zeros(0, dtype=torch.long),
        torch.randint(0, 50, (3000, 2), generator=generator).t(),          # non-contiguous [2, E]
        torch.randint(0, 50, (2, 400), generator=generator)[0, ::3],        # a strided 1-D view
    ]


def reference(t: torch.Tensor) -> list:
    """The kernel's definition (module docstring of gnn_inductor/plan/fingerprint.py) in NumPy, as two signed int64."""
    words = fp.words(t).numpy().view(np.uint32).astype(np.uint64)
    position = np.arange(words.size, dtype=np.uint64) & np.uint64(0xFFFFFFFF)
    sums = []
    for key in fp.KEYS:
        x = (words ^ ((position * np.uint64(key)) & np.uint64(0xFFFFFFFF)))
        x = (x * np.uint64(0x85EBCA6B)) & np.uint64(0xFFFFFFFF)
        x ^= x >> np.uint64(13)
        x = (x * np.uint64(0xC2B2AE35)) & np.uint64(0xFFFFFFFF)
        x ^= x >> np.uint64(16)
        sums.append(int(x.sum(dtype=np.uint64)))
    return np.array(sums, dtype=np.uint64).view(np.int64).tolist()


@pytest.mark.parametrize("index", range(len(tensors())))
def test_cpu_fingerprint_sees_every_single_change_and_a_swap(index):
    t = tensors()[index]
    base = fp.fingerprint(t, use_kernel=False)
    assert base.dtype == torch.int64 and base.shape == (2,)
    assert torch.equal(base, fp.fingerprint(t.clone(), use_kernel=False)), "same bytes, same fingerprint"
    if t.numel() < 2:
        return
    flat = t.reshape(-1).clone()
    changed = flat.clone()
    changed[-1] = ~flat[-1] if t.dtype == torch.bool else flat[-1] + 1
    assert not torch.equal(base, fp.fingerprint(changed.view(t.shape), use_kernel=False))
    swapped = flat.clone()
    first = int(torch.nonzero(flat != flat[0])[0]) if (flat != flat[0]).any() else None
    if first is not None:
        swapped[0], swapped[first] = flat[first], flat[0]
        assert not torch.equal(base, fp.fingerprint(swapped.view(t.shape), use_kernel=False))


def test_fingerprint_ignores_requires_grad():
    weight = torch.rand(20, requires_grad=True)
    assert torch.equal(fp.fingerprint(weight, use_kernel=False), fp.fingerprint(weight.detach(), use_kernel=False))


@runs_kernel
@pytest.mark.parametrize("index", range(len(tensors())))
def test_kernel_matches_its_definition(index):
    t = tensors()[index].to(DEVICE)
    got = fp.fingerprint(t, use_kernel=True)
    assert got.device == t.device
    assert got.cpu().tolist() == reference(t.cpu())


@runs_kernel
def test_kernel_sees_a_one_word_change_and_an_edge_swap():
    edge_index = tensors()[0].to(DEVICE)
    base = fp.fingerprint(edge_index, use_kernel=True)
    edited = edge_index.clone()
    edited[0, 4999] += 1
    assert not torch.equal(base, fp.fingerprint(edited, use_kernel=True))
    swapped = edge_index.clone()
    swapped[:, [3, 4]] = edge_index[:, [4, 3]]
    if not torch.equal(swapped, edge_index):
        assert not torch.equal(base, fp.fingerprint(swapped, use_kernel=True))

