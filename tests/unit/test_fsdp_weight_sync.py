"""Bucketed weight sync (trainer rank 0 -> rollout worker) over a gloo group, two threads, CPU."""

from __future__ import annotations

import socket
import threading

import torch

from trainer.rollout.weight_sync import SyncGroup, WeightSpec, buckets, receive, send


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_buckets_split_by_size_and_dtype():
    f32, bf16 = torch.float32, torch.bfloat16
    plan = [WeightSpec("a", (256, 256), f32),  # 256 KiB
            WeightSpec("b", (256, 256), f32),  # 256 KiB: a+b = 0.5 MiB fits a 0.5 MiB bucket
            WeightSpec("c", (1024,), f32),     # 4 KiB: would overflow -> new bucket
            WeightSpec("d", (10,), bf16),      # dtype change -> new bucket
            WeightSpec("e", (1024, 1024), bf16)]  # 2 MiB > limit: its own bucket
    got = [[s.name for s in b] for b in buckets(plan, 0.5)]
    assert got == [["a", "b"], ["c"], ["d"], ["e"]]


def test_send_receive_round_trip_casts_to_the_receivers_dtype():
    torch.manual_seed(0)
    src = {"w1": torch.randn(64, 32), "w2": torch.randn(7), "w3": torch.randn(32, 16)}
    plan = [WeightSpec("w1", (64, 32), torch.float32), WeightSpec("w2", (7,), torch.float32),
            WeightSpec("w3", (32, 16), torch.bfloat16)]
    port = _port()
    got: dict[str, torch.Tensor] = {}
    sent: dict[str, int] = {}

    def trainer() -> None:
        g = SyncGroup(0, 2, "127.0.0.1", port, device=torch.device("cpu"))
        sent["bytes"] = send(g, plan, iter(src.items()), bucket_mb=0.01)  # 10 KiB buckets: [w1, w2], [w3] (bf16)

    def rollout() -> None:
        g = SyncGroup(1, 2, "127.0.0.1", port, device=torch.device("cpu"))
        for name, t in receive(g, plan, bucket_mb=0.01):
            got[name] = t.clone()

    threads = [threading.Thread(target=trainer), threading.Thread(target=rollout)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert set(got) == set(src)
    assert torch.equal(got["w1"], src["w1"]) and torch.equal(got["w2"], src["w2"])
    assert got["w3"].dtype == torch.bfloat16 and torch.equal(got["w3"], src["w3"].to(torch.bfloat16))
    assert sent["bytes"] == (64 * 32 + 7) * 4 + 32 * 16 * 2


def test_send_rejects_a_name_mismatch():
    plan = [WeightSpec("x", (2,), torch.float32)]
    try:
        send(None, plan, iter([("y", torch.zeros(2))]))
    except RuntimeError as e:
        assert "y" in str(e) and "x" in str(e)
    else:
        raise AssertionError("a mismatched weight name must raise")
