"""The trainer's Ray cluster is its own: a plain `ray.init()` joins whatever cluster
/tmp/ray/ray_current_cluster names (another run's, or one that died), so `init_ray` asks for a local one."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_a_dead_cluster_named_in_the_marker_is_not_joined(make_config):
    ray = pytest.importorskip("ray")
    from trainer.distributed.cluster import init_ray

    marker = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    before = marker.read_text() if marker.is_file() else None
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("127.0.0.1:9")  # the discard port: no GCS answers there
    try:
        init_ray(make_config(), num_cpus=1)
        assert ray.is_initialized() and ray.cluster_resources().get("CPU") == 1.0
        assert not ray.get_runtime_context().gcs_address.endswith(":9")
    finally:
        ray.shutdown()
        if before is None:
            marker.unlink(missing_ok=True)
        else:
            marker.write_text(before)
