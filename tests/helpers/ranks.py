"""Run a test's worker on several gloo processes.

    spawn_ranks(_worker, 2, out)     # _worker(rank, world, port, out) in 2 processes

Each process gets one thread (OMP_NUM_THREADS=1 unless set), and all share a free local port for their
process group; it returns when every rank has finished, and a rank's exception fails the test with its
traceback.

The ranks are forked from a forkserver that imported torch, transformers, megatron-core and the trainer's
backends once per test process (`_PRELOAD`), instead of each being a fresh interpreter that imports them
again (most of the ~20 s of CPU a rank took on 2 cores; the default tier starts ~30 of them). A forked rank would inherit the
server's environment of when it started, so each rank is given the caller's environment of the call.

A worker ends with `leave_group()`: the ranks leave together, since a rank that exits while another still
talks to it (rank 0 also hosts the store) aborts that other rank with SIGABRT.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.platform.env import free_port

# Imported once in the forkserver; a module that is not installed is skipped there (multiprocessing's rule).
_PRELOAD = ["torch", "torch.distributed", "transformers", "megatron.core", "trainer.models.loading",
            "trainer.backends.fsdp", "trainer.backends.megatron"]


def spawn_ranks(worker: Callable[..., None], world: int, *args: Any) -> None:
    """`worker(rank, world, port, *args)` on `world` processes forked from the preloaded server (module docstring)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.set_forkserver_preload(_PRELOAD)
    mp.start_processes(_with_env, args=(dict(os.environ), worker, world, free_port(), *args), nprocs=world,
                       join=True, start_method="forkserver")


def _with_env(rank: int, env: dict[str, str], worker: Callable[..., None], *args: Any) -> None:
    """In the rank: the caller's environment and thread count, then the worker."""
    import torch

    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    worker(rank, *args)


def leave_group() -> None:
    """Barrier, then destroy the process group: every rank is done with its peers before any exits."""
    dist.barrier()
    dist.destroy_process_group()
