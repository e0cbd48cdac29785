"""Message passing a frontend left to the framework's own code while Dynamo traced, for the rewrite report.

Both DGL modules (gnn_inductor/frontends/dgl.py, its reduce functions in dgl_udf.py) note a decline here, and
``gnn_inductor.report()`` lists them; nothing here imports DGL.
"""
from __future__ import annotations

import torch

DECLINES: list = []  # (where, why) of message passing left to the framework's own code while Dynamo traced, once each


def remember(where: str, why: str) -> None:
    """Remember that message passing at ``where`` runs the framework's own code (behind a graph break) and why."""
    if (where, why) not in DECLINES:
        DECLINES.append((where, why))


@torch._dynamo.assume_constant_result
def note(where: str, why: str) -> bool:
    """:func:`remember` from traced code (run outside Dynamo's trace: a constant of the captured graph)."""
    remember(where, why)
    return True


def declines() -> list:
    """``(where, why)`` of every decline noted in this process, oldest first."""
    return list(DECLINES)


def clear() -> None:
    DECLINES.clear()
