"""Two "hosts" on one machine for the multi-node tests: two network namespaces joined by
a veth pair, each with its own address, a Ray head in one and a Ray worker in the other
(``ray start --node-ip-address``), with Ray's token authentication on.

Every address lives inside the namespaces made here (a /24 no other interface uses), and
``close`` removes them with every process inside. ``ray stop`` is never called: it would
stop every Ray on the machine, other test sessions' included; the processes of a host are
the PIDs its namespace holds (``ip netns pids``).

The worker host runs in a mount namespace of its own (``ip netns exec`` makes one) with a
private tmpfs at ``private_dir``: a path that exists on both hosts but that only the
worker sees the contents of, as a node-local disk would be.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

RAY_PORT = 6379
DASHBOARD_PORT = 8265


def namespaces_unavailable() -> str | None:
    """Why this machine cannot make the two hosts (None: it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"seal-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass
class Host:
    name: str  # the network namespace
    ip: str
    resources: dict[str, float]
    num_cpus: int

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def kill_all(self) -> int:
        """SIGKILL every process of this host (its raylet, workers, actors); how many."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)


@dataclass
class TwoHosts:
    root: Path  # Ray's temp dir, the token and the private mount point live under it
    venv_bin: Path = Path(sys.executable).parent
    subnet: str = "10.213.7"
    head: Host = field(init=False)
    worker: Host = field(init=False)

    def __post_init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.head = Host(
            f"seal-h{tag}", f"{self.subnet}.1", {"host_head": 1, "learner_slot": 1, "generator_slot": 1}, 4
        )
        self.worker = Host(
            f"seal-w{tag}", f"{self.subnet}.2", {"host_worker": 1, "learner_slot": 1, "generator_slot": 1}, 4
        )
        self.token = secrets.token_hex(32)
        self.temp_dir = self.root / "ray"
        self.private_dir = self.root / "worker-only"
        self._veth = (f"sv{tag}h", f"sv{tag}w")

    # -------------------------------------------------------------- network
    def make_network(self) -> None:
        for host in (self.head, self.worker):
            _ip("netns", "add", host.name)
        _ip("link", "add", self._veth[0], "type", "veth", "peer", "name", self._veth[1])
        for host, veth in zip((self.head, self.worker), self._veth):
            _ip("link", "set", veth, "netns", host.name)
            _ip("-n", host.name, "addr", "add", f"{host.ip}/24", "dev", veth)
            _ip("-n", host.name, "link", "set", veth, "up")
            _ip("-n", host.name, "link", "set", "lo", "up")

    @property
    def address(self) -> str:
        return f"{self.head.ip}:{RAY_PORT}"

    @property
    def dashboard(self) -> str:
        return f"http://{self.head.ip}:{DASHBOARD_PORT}"

    def env(self, token: str | None = None) -> dict[str, str]:
        """The environment of a process on either host: the cluster's token, this venv first on PATH."""
        # Nothing of this process's Ray or collectives: a gloo/NCCL interface picked here (an
        # earlier test in this process) names an interface the namespaces do not have.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "GLOO_", "NCCL_"))}
        env.update(
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN=token or self.token,
            PATH=f"{self.venv_bin}:{env.get('PATH', '')}",
            RAY_USAGE_STATS_ENABLED="0",
            PYTHONUNBUFFERED="1",
        )
        return env

    def run_on(
        self, host: Host, command: list[str], token: str | None = None, timeout_s: float = 600, **kwargs
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ip", "netns", "exec", host.name, *command],
            env=self.env(token),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            **kwargs,
        )

    def popen_on(self, host: Host, command: list[str], log: Path, **kwargs) -> subprocess.Popen:
        out = open(log, "w")
        return subprocess.Popen(
            ["ip", "netns", "exec", host.name, *command],
            env=self.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            **kwargs,
        )

    # ------------------------------------------------------------------ Ray
    def _ray_start(self, host: Host, head: bool, token: str | None = None) -> subprocess.CompletedProcess:
        import json

        args = [
            "ray",
            "start",
            f"--node-ip-address={host.ip}",
            f"--num-cpus={host.num_cpus}",
            f"--resources={json.dumps(host.resources)}",
            "--object-store-memory=800000000",
            "--disable-usage-stats",
        ]
        if head:
            args += [
                "--head",
                f"--port={RAY_PORT}",
                f"--dashboard-host={host.ip}",
                f"--dashboard-port={DASHBOARD_PORT}",
                f"--temp-dir={self.temp_dir}",
            ]
            return self.run_on(host, args, token, timeout_s=120)
        args += [f"--address={self.address}"]
        # The worker's private disk: mounted in the mount namespace `ip netns exec` gives the
        # shell, which the raylet and every worker process it starts inherit.
        self.private_dir.mkdir(parents=True, exist_ok=True)
        script = f"mount -t tmpfs -o size=64m tmpfs {self.private_dir} && exec " + " ".join(f"'{a}'" for a in args)
        return self.run_on(host, ["sh", "-c", script], token, timeout_s=120)

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.make_network()
        for host, head in ((self.head, True), (self.worker, False)):
            done = self._ray_start(host, head)
            if done.returncode != 0:
                raise RuntimeError(
                    f"ray start on {host.name} ({host.ip}) failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
                )
        self.wait_nodes(2)

    def start_worker(self) -> None:
        """(Re)start the worker host's raylet: whatever of it still runs is killed first, so the
        cluster ends with one worker node (the killed one is marked dead by the GCS's health check)."""
        self.worker.kill_all()
        done = self._ray_start(self.worker, head=False)
        if done.returncode != 0:
            raise RuntimeError(f"ray start on the worker failed:\n{done.stderr[-2000:]}")
        self.wait_nodes(2)

    def join_with_token(self, token: str) -> subprocess.CompletedProcess:
        """A raylet on the worker host that presents ``token`` (the test's intruder)."""
        return self._ray_start(Host(self.worker.name, self.worker.ip, {"intruder": 1}, 1), head=False, token=token)

    def alive_nodes(self) -> list[str]:
        code = (
            "import ray, json; ray.init(address=%r, log_to_driver=False, logging_level='error'); "
            "print(json.dumps(sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive'])))"
        ) % self.address
        done = self.run_on(self.head, [str(self.venv_bin / "python"), "-c", code], timeout_s=120)
        if done.returncode != 0:
            raise RuntimeError(f"cannot read the cluster's nodes: {done.stderr[-1500:]}")
        import json

        return json.loads(done.stdout.strip().splitlines()[-1])

    def wait_nodes(self, count: int, timeout_s: float = 180) -> None:
        # A SIGKILLed raylet stays "alive" until the GCS's health check gives up on it (about a minute).
        deadline = time.monotonic() + timeout_s
        while True:
            nodes = self.alive_nodes()
            if len(nodes) == count:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster has {nodes} alive, not {count} nodes, after {timeout_s:g}s")
            time.sleep(2)

    def close(self) -> None:
        for host in (self.worker, self.head):
            host.kill_all()
        time.sleep(0.5)
        for host in (self.worker, self.head):
            host.kill_all()  # what a dying parent started meanwhile
            subprocess.run(["ip", "netns", "del", host.name], capture_output=True)
