"""Two nodes, simulated on this machine with ``ray.cluster_utils.Cluster`` (a head and a second raylet, one CPU
each, two separate Ray nodes): 2 GRPO steps with ``trainer.nnodes=2`` and one worker per node (tiny Qwen2.5). The
workers must land on different nodes, join one gloo group across them, receive ``worker.env_vars``, and train."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

# under `make test-slow` (two Ray nodes' start-up: the suite's time, docs/development.md)
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_two_nodes_one_worker_each_two_grpo_steps(e2e_text_config, tmp_path):
    import ray
    from ray.cluster_utils import Cluster

    from easyrl.trainer.__main__ import build_trainer

    config = e2e_text_config(
        tmp_path,
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
        "trainer.max_steps=2",
        "trainer.save_freq=-1",
        "worker.env_vars={EASYRL_NODE_TEST: two-nodes}",
    )
    ray.shutdown()  # the session's one-node Ray (tests/conftest.py local_ray), if running
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address)
        cluster.wait_for_nodes()
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        trainer = build_trainer(config)
        where = ray.get([w.__ray_call__.remote(lambda worker: (
            ray.get_runtime_context().get_node_id(), __import__("os").environ.get("EASYRL_NODE_TEST")))
            for w in trainer.workers.workers])
        trainer.fit()
        trainer.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
    (node_0, env_0), (node_1, env_1) = where
    assert node_0 != node_1  # one worker per node
    assert env_0 == env_1 == "two-nodes"  # worker.env_vars reached both nodes' workers
    rows = [json.loads(line) for line in (Path(config.trainer.run_dir) / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
    assert rows[1]["rollout/log_prob_diff_max"] < 2e-3  # the cross-node weight sync reached vLLM
