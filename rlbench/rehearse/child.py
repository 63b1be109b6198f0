"""The rehearsal's child process: `python -m trainer CONFIG`, on a Ray multi-node test cluster when --nodes > 1.

    python -m rlbench.rehearse.child runs/rehearsal/<suite>/<profile>/<mode>.rehearsal.yaml --nodes 4

With --nodes N > 1, Ray's own testing cluster (`ray.cluster_utils.Cluster`: a head and N-1 more raylets on
this machine, each with the node's share of the CPU workers as its CPU resource) is started and joined
through RAY_ADDRESS, so the trainer's placement meets N nodes, as on the cluster the profile names.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import yaml


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--nodes", type=int, default=1)
    args = ap.parse_args(argv)
    cluster = None
    if args.nodes > 1:
        from ray.cluster_utils import Cluster

        cfg = yaml.safe_load(open(args.config))
        per_node = int(cfg.get("trainer", {}).get("n_gpus_per_node", 1))
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": per_node})
        for _ in range(args.nodes - 1):
            cluster.add_node(num_cpus=per_node)
        cluster.wait_for_nodes()
        os.environ["RAY_ADDRESS"] = cluster.address
        print(f"[rehearsal] Ray test cluster: {args.nodes} nodes x {per_node} CPU workers at {cluster.address}",
              file=sys.stderr, flush=True)
    from trainer.__main__ import main as trainer_main

    try:
        return trainer_main([args.config])
    finally:
        if cluster is not None:
            import ray

            address = cluster.address
            ray.shutdown()  # the driver leaves first: Ray refuses to remove the node a connected driver is on
            cluster.shutdown()
            # the test cluster's head writes its address where a later plain ray.init() looks for a running
            # cluster (/tmp/ray/ray_current_cluster); the next local run would try to join the dead one
            marker = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
            if marker.is_file() and marker.read_text().strip() == address:
                marker.unlink()


if __name__ == "__main__":
    raise SystemExit(main())
