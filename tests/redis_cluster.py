"""A real Redis Cluster on loopback: N masters (3 by default), no replicas, for tests.

Each node is a redis-server child process (cluster mode on, nothing persisted but its
nodes.conf), joined with `redis-cli --cluster create`. A node killed with
`nodes[i].kill9()` and brought back with `restart_node(i)` rejoins from its nodes.conf.

    with RedisCluster(tmp_path) as cluster:
        client = redis.asyncio.RedisCluster(host="127.0.0.1", port=cluster.ports[0])
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

from fakes.loopback import free_port
from redis_process import RedisProcess

CLUSTER_BUS_OFFSET = 10000  # fixed by Redis: each node also listens on port + 10000


def _cli(port: int, *args: str, timeout: float = 10.0) -> str:
    return subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
        check=True, capture_output=True, text=True, timeout=timeout,
    ).stdout


class RedisCluster:
    def __init__(self, directory: Path, masters: int = 3, node_timeout_ms: int = 2000):
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        self.dir = Path(directory)
        self.nodes = [
            RedisProcess(
                self.dir / f"node{i}", free_port(also_free=CLUSTER_BUS_OFFSET),
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(node_timeout_ms),
            )
            for i in range(masters)
        ]

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", p) for p in self.ports]

    def start(self, timeout: float = 30.0) -> RedisCluster:
        try:
            for node in self.nodes:
                node.start()
            subprocess.run(
                ["redis-cli", "--cluster", "create",
                 *(f"127.0.0.1:{p}" for p in self.ports),
                 "--cluster-replicas", "0", "--cluster-yes"],
                check=True, capture_output=True, text=True, timeout=timeout,
            )
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every node says cluster_state:ok and knows all slots are covered."""
        end = time.monotonic() + timeout
        while True:
            infos = [_cli(p, "cluster", "info") for p in self.ports]
            if all("cluster_state:ok" in i and "cluster_slots_ok:16384" in i for i in infos):
                return
            if time.monotonic() > end:
                raise TimeoutError("cluster did not reach cluster_state:ok:\n" + infos[0])
            time.sleep(0.05)

    def restart_node(self, index: int, timeout: float = 30.0) -> None:
        self.nodes[index].restart()
        self.wait_ok(timeout)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
