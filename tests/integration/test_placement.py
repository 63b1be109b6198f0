"""Workers placed node by node on Ray's own multi-node test cluster (two raylets on this machine).

    python3 -m pytest -q tests/integration/test_placement.py

A role of more workers than one node holds spans nodes in whole node-sized STRICT_PACK groups, ranks in node
order; a layout no node can hold is a one-line error naming the nodes' sizes and the field to change.
"""

from __future__ import annotations

import pytest

from trainer.distributed.cluster import place_workers
from trainer.errors import RLBenchError

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def _nodes_of(place) -> list[str]:
    """The node of each worker's bundle, in worker order."""
    nodes = []
    for group in place.groups:
        table = ray.util.placement_group_table(group)
        nodes += [table["bundles_to_node_id"][b] for b in sorted(table["bundles_to_node_id"])]
    return nodes


def test_four_workers_on_two_nodes_of_two(two_nodes):
    place = place_workers(4, False, per_node=2, name="t", wait_s=60)
    try:
        nodes = _nodes_of(place)
        assert nodes[0] == nodes[1] and nodes[2] == nodes[3] and nodes[0] != nodes[2]
        opts = place.options(3, max_concurrency=2)
        assert opts["scheduling_strategy"].placement_group_bundle_index == 1
        assert opts["scheduling_strategy"].placement_group is place.groups[1]
        assert opts["max_concurrency"] == 2 and opts["num_gpus"] == 0
    finally:
        place.remove()


def test_a_group_larger_than_any_node_is_refused(two_nodes):
    with pytest.raises(RLBenchError, match=r"2 group\(s\) of 3 CPU bundle\(s\).*\[2, 2\] CPUs.*trainer.n_gpus_per_node"):
        place_workers(4, False, per_node=3, name="big", wait_s=5)
    place = place_workers(4, False, per_node=2, name="after", wait_s=60)  # the refused groups were given back
    place.remove()
