"""Run a test's worker on several gloo processes.

    spawn_ranks(_worker, 2, out)     # _worker(rank, world, port, out) in 2 spawned processes

Each process gets one thread (OMP_NUM_THREADS=1 unless set), and all share a free local port for their
process group; it returns when every rank has finished, and a rank's exception fails the test with its
traceback. A worker ends with `leave_group()`: the ranks leave together, since a rank that exits while
another still talks to it (rank 0 also hosts the store) aborts that other rank with SIGABRT.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.platform.env import free_port


def spawn_ranks(worker: Callable[..., None], world: int, *args: Any) -> None:
    """`worker(rank, world, port, *args)` on `world` spawned processes (module docstring)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(worker, args=(world, free_port(), *args), nprocs=world, join=True, start_method="spawn")


def leave_group() -> None:
    """Barrier, then destroy the process group: every rank is done with its peers before any exits."""
    dist.barrier()
    dist.destroy_process_group()
