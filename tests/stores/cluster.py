"""A real Redis Cluster for the tests: 3 masters + 3 replicas, ``redis-server --cluster-enabled
yes`` on free loopback ports, joined with ``redis-cli --cluster create ... --cluster-yes``.

Started once per test session (a few seconds) in a temporary folder; every node is killed at
the end. Each test uses its own key prefix, so tests never see each other's records.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["RedisClusterProcs", "cluster_binaries"]


def cluster_binaries() -> tuple[str, str] | None:
    """(redis-server, redis-cli) from PATH, or ``None`` when either is missing."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    return (server, cli) if server and cli else None


def _port_pair() -> int:
    """A port P free on 127.0.0.1 whose cluster bus port P + 10000 is free too."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


class RedisClusterProcs:
    """The node processes of one test cluster.

    Args:
        workdir: where node configs and logs go.
        masters: number of masters (each gets ``replicas`` replicas).
        replicas: replicas per master.
        extra: more ``redis-server`` arguments for every node (``--requirepass``...).
    """

    def __init__(
        self, workdir: Path, *, masters: int = 3, replicas: int = 1, extra: tuple[str, ...] = ()
    ) -> None:
        binaries = cluster_binaries()
        assert binaries is not None
        self.server, self.cli = binaries
        self.workdir = workdir
        self.count = masters * (1 + replicas)
        self.masters = masters
        self.replicas = replicas
        self.extra = extra
        self.password: str | None = None
        if "--requirepass" in extra:
            self.password = extra[extra.index("--requirepass") + 1]
        self.ports: list[int] = []
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def seeds(self) -> str:
        """``host:port,host:port`` of every node (for a ``redis+cluster://`` URL)."""
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def cli_args(self, port: int) -> list[str]:
        """``redis-cli`` talking to the node on ``port``."""
        args = [self.cli, "-h", "127.0.0.1", "-p", str(port)]
        if self.password:
            args += ["-a", self.password, "--no-auth-warning"]
        return args

    def call(self, port: int, *command: str) -> str:
        """Run one command on one node; return its output."""
        done = subprocess.run(
            [*self.cli_args(port), *command], capture_output=True, text=True, timeout=30
        )
        return done.stdout.strip()

    def start(self) -> RedisClusterProcs:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ports = [_port_pair() for _ in range(self.count)]
        if len(set(self.ports)) != self.count:
            raise RuntimeError("port clash while picking cluster ports")
        for port in self.ports:
            self._spawn(port)
        for port in self.ports:
            self._wait_ping(port)
        create = subprocess.run(
            [
                *self.cli_args(self.ports[0]),
                "--cluster",
                "create",
                *(f"127.0.0.1:{port}" for port in self.ports),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if create.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {create.stdout}{create.stderr}")
        self.wait_ok()
        return self

    def _spawn(self, port: int) -> None:
        log = open(self.workdir / f"node-{port}.log", "ab")  # noqa: SIM115
        self.procs[port] = subprocess.Popen(
            [
                self.server,
                *("--port", str(port), "--bind", "127.0.0.1", "--save", ""),
                *("--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"),
                # A 2 s node timeout makes a failed master's replica take over in seconds.
                *("--cluster-node-timeout", "2000", "--dir", str(self.workdir)),
                *("--appendonly", "no", "--protected-mode", "no"),
                # Replicas sync at once (the default waits 5 s for more replicas to share one
                # diskless transfer): a failover before a replica has synced loses data.
                *("--repl-diskless-sync-delay", "0"),
                *(("--masterauth", self.password) if self.password else ()),
                *self.extra,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def _wait_ping(self, port: int) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.call(port, "ping") == "PONG":
                return
            time.sleep(0.05)
        raise RuntimeError(f"cluster node {port} did not start")

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every node says ``cluster_state:ok`` and sees every slot assigned, and
        every master has its replicas, each with its replication link up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            infos = [self.call(port, "cluster", "info") for port in self.ports]
            roles = self.masters_and_replicas()
            if (
                all(
                    "cluster_state:ok" in info and "cluster_slots_ok:16384" in info
                    for info in infos
                )
                and len(roles) == self.masters
                and all(len(replicas) == self.replicas for replicas in roles.values())
                and all(
                    "master_link_status:up" in self.call(replica, "info", "replication")
                    for replicas in roles.values()
                    for replica in replicas
                )
            ):
                return
            time.sleep(0.1)
        raise RuntimeError("the test cluster did not become ok")

    def masters_and_replicas(self) -> dict[int, list[int]]:
        """Master port (of masters serving slots) -> its replicas' ports, as the first node
        sees the cluster now."""
        lines = self.call(self.ports[0], "cluster", "nodes").splitlines()
        by_id: dict[str, int] = {}
        rows = []
        for line in lines:
            fields = line.split()
            port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
            by_id[fields[0]] = port
            rows.append((fields, port))
        result: dict[int, list[int]] = {}
        for fields, port in rows:
            if "master" in fields[2] and "fail" not in fields[2] and len(fields) > 8:
                result.setdefault(port, [])
        for fields, port in rows:
            master = by_id.get(fields[3])
            if "slave" in fields[2] and "fail" not in fields[2] and master in result:
                result[master].append(port)
        return result

    def restart(self, port: int) -> None:
        """Start the node on ``port`` again (after a kill), with its saved cluster config: it
        rejoins, as a replica of whoever took its slots."""
        self._spawn(port)
        self._wait_ping(port)

    def cut_off(self, replica: int) -> None:
        """Cut ``replica`` off its master, as a partition would, while it stays in the cluster
        (the cluster bus is untouched, so it can still be elected): its replication link is
        killed and cannot come back (it authenticates with a user the master does not have)."""
        self.call(replica, "config", "set", "masteruser", "retrysafe-cut-off")
        self.call(replica, "config", "set", "masterauth", "retrysafe-cut-off")
        self.call(replica, "client", "kill", "type", "master")
        deadline = time.monotonic() + 5
        while "master_link_status:up" in self.call(replica, "info", "replication"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica {replica} is still linked to its master")
            time.sleep(0.02)

    def reconnect(self, replica: int) -> None:
        """Undo :meth:`cut_off` (the node replicates again from whichever master it has)."""
        self.call(replica, "config", "set", "masteruser", "")
        self.call(replica, "config", "set", "masterauth", self.password or "")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            proc.wait(timeout=10)
