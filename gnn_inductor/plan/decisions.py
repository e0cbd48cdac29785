"""Path decisions: which kernel path (CSR, block-sparse or a hybrid of both) runs for one graph, family,
precision and width, and why. A decision is taken once per graph at an op's first call (from the calibrated cost
model and, where it is close, a timing), kept in the graph's state (:mod:`gnn_inductor.plan.state`) and recorded for
the report (:func:`gnn_inductor.plan.state.record_decision`)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gnn_inductor.plan.block_format import BlockFormat


def precision_of(dtype: torch.dtype) -> str:
    """"half" for fp16/bf16 inputs, "tf32" for fp32 where the user allowed TF32, else "ieee"."""
    if dtype in (torch.float16, torch.bfloat16):
        return "half"
    allowed = torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
    return "tf32" if allowed else "ieee"


@dataclass
class PathDecision:
    """What runs for one (graph, family, precision, width) and why (JSON-ready through :meth:`as_dict`)."""
    path: str                       # "csr", "block" or "hybrid"
    reason: str
    family: str
    precision: str
    order: str = "none"
    stats: dict = field(default_factory=dict)
    predicted_ms: dict = field(default_factory=dict)
    order_build_ms: dict = field(default_factory=dict)
    measured_forward_ms: dict = field(default_factory=dict)
    blocks: object = field(default=None, repr=False)       # BlockFormat restricted to the chosen windows
    transposed: object = field(default=None, repr=False)
    csr_items: list = field(default=None, repr=False)      # work items of the rows left to the CSR kernel

    def as_dict(self) -> dict:
        return {"path": self.path, "reason": self.reason, "family": self.family, "precision": self.precision,
                "order": self.order, "stats": dict(self.stats),
                "predicted_ms": {k: round(v, 3) for k, v in self.predicted_ms.items()},
                "order_build_ms": {k: round(v, 1) for k, v in self.order_build_ms.items()},
                "measured_forward_ms": {k: round(v, 3) for k, v in self.measured_forward_ms.items()}}


def sync(device) -> None:
    """Wait for ``device`` (CUDA) before reading a timer."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def format_bytes(blocks: BlockFormat) -> int:
    """The memory of a block format's tensors."""
    return int(sum(t.numel() * t.element_size() for t in blocks[:7]))
