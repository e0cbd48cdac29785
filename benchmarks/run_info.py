"""What a benchmark run records about itself: the device, the versions, the date and the command that reproduces it."""
from __future__ import annotations

import datetime
import platform
import sys

import torch


def version(module: str) -> str:
    """``module.__version__``, or "not installed"."""
    try:
        return __import__(module).__version__
    except ImportError:
        return "not installed"


def run_metadata(module: str, device: torch.device, argv=None) -> dict:
    """The device's name (the CPU's where it is not CUDA), torch, Triton, PyG, gnn_inductor and Python's versions,
    the date, and ``python -m <module> <arguments>``."""
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "triton": version("triton"), "torch_geometric": version("torch_geometric"),
            "gnn_inductor": version("gnn_inductor"), "python": platform.python_version(),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": f"python -m {module} " + " ".join(sys.argv[1:] if argv is None else argv)}
