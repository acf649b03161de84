"""ZeroMQ transport of trajectories: env actors (PUSH) -> replay server (PULL).

Frames are replay/wire.py messages (msgpack, token arrays as raw bytes). The
server's receiver thread decodes frames into a ReplayQueue; a frame that is
malformed, of another schema version or not a trajectory is rejected, counted
and logged, and the stream goes on.

Back-pressure: when ``max_ready_groups`` complete groups wait for the learner,
the receiver stops reading; ZeroMQ's high-water marks then fill (receiver
and sender side) and the producers' ``send`` blocks, so a slow learner holds
generation back instead of filling memory. A producer blocked longer than
``send_timeout_s`` gets a TransportTimeout naming the address.

Security: with ``curve`` (the default) the server's socket is a CURVE server
that admits only the run's env-actor key (replay/auth.py); senders get their
keys (``ClientKeys``) from the driver through Ray. A peer without them never
completes the handshake, so none of its frames arrive; the refused handshakes
are counted (``unauthorized``) and the stream goes on.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import zmq

from replay.auth import ClientKeys, CurveGuard, RunKeys
from replay.messages import Trajectory
from replay.queue import Group, QueueStats, ReplayQueue
from replay.wire import WireError, decode, encode

log = logging.getLogger(__name__)


class TransportTimeout(RuntimeError):
    """The replay server did not take a frame in time (stalled or gone)."""


@dataclass(frozen=True)
class TransportConfig:
    host: str = "127.0.0.1"  # bind address of the replay server; 0.0.0.0 on a multi-node cluster
    advertise_host: str | None = None  # what producers connect to (default: host, or the node IP for 0.0.0.0)
    port: int = 0  # 0: a free port
    hwm: int = 64  # frames buffered per socket before send blocks
    max_ready_groups: int = 64  # complete groups waiting for the learner before the receiver stops reading
    send_timeout_s: float = 600.0
    curve: bool = True  # CURVE-authenticated, encrypted sockets (replay and control); false only to debug

    def __post_init__(self) -> None:
        if self.hwm < 1 or self.max_ready_groups < 1:
            raise ValueError("transport hwm and max_ready_groups must be >= 1")


class TrajectorySender:
    """One PUSH socket per producer process, on its own ZeroMQ context.

    ``send`` returns once the frame is queued, not delivered; ``close`` is what
    delivers the rest: it waits (up to ``linger_s``) until every queued frame
    has gone out and stops the context's I/O thread. A process that exits or
    is killed with frames still queued loses them (and one that exits while
    the I/O thread still reads a zero-copy frame can crash in the interpreter's
    teardown), so producers close before they go away: env actors do it when
    they retire (seal/runtime/actor_set.py)."""

    def __init__(
        self,
        address: str,
        *,
        hwm: int,  # transport.hwm
        send_timeout_s: float,  # transport.send_timeout_s (configs/transport/default.yaml)
        linger_s: float = 30.0,
        keys: ClientKeys | None = None,
    ) -> None:
        """``keys``: the run's env-actor keys when the server uses CURVE (``ReplayServer.client_keys``)."""
        self.address = address
        self.linger_s = linger_s
        self._context = zmq.Context()  # own context: term() in close() is then this sender's flush, nobody else's
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, hwm)
        self._socket.setsockopt(zmq.SNDTIMEO, int(send_timeout_s * 1000))
        if keys is not None:
            keys.apply(self._socket)
        self.curve = keys is not None
        self._socket.connect(address)
        self.timeout_s = send_timeout_s
        self.sent = 0
        self.bytes = 0

    def send(self, traj: Trajectory) -> None:
        self.send_frame(encode(traj))

    def send_frame(self, frame: bytes) -> None:
        if self._socket.closed:
            raise RuntimeError(f"the trajectory sender to {self.address} is closed")
        try:
            self._socket.send(frame, copy=False)
        except zmq.Again:
            # A refused CURVE handshake looks the same from here: nothing is ever taken.
            raise TransportTimeout(
                f"the replay server at {self.address} took no frame for {self.timeout_s:.0f} s "
                "(learner stalled or gone"
                + (
                    ", or the server refused this sender's CURVE keys)"
                    if self.curve
                    else ", or the server wants CURVE keys and this sender has none)"
                )
            ) from None
        self.sent += 1
        self.bytes += len(frame)

    def close(self) -> None:
        """Deliver what is queued (at most ``linger_s``), then release the socket and context. Idempotent."""
        if self._context.closed:
            return
        self._socket.close(linger=int(self.linger_s * 1000))
        self._context.term()  # returns when the queued frames are out or the linger has passed


@dataclass
class ServerStats:
    frames: int = 0
    bytes: int = 0
    rejected: int = 0
    backpressure_s: float = 0.0  # time the receiver held back because the learner lagged
    unauthorized: int = 0  # refused CURVE handshakes (peers that are not this run's env actors)
    # Frames by the IP they arrived from (libzmq's Peer-Address): which hosts feed the run, and
    # that other nodes' trajectories cross the network, not the loopback.
    frames_by_peer: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ReplayCounters:
    """One reading of the replay server's counters (``ReplayServer.counters``): copies, so the
    driver reads them while the receiver thread counts on."""

    queue: QueueStats  # groups and rollouts: accepted, dropped, filtered, lost tokens (replay/queue.py)
    server: ServerStats  # frames, bytes, refusals, backpressure, by peer


def _peer_address(msg: Any) -> str:  # a zmq.Frame
    try:
        return msg.get("Peer-Address")
    except Exception:  # a transport without it (ipc://, inproc://) or an older libzmq
        return "unknown"


def routable_ip() -> str:
    """The address other nodes reach this one by: its IP in the Ray cluster when this process
    has joined one; else the address of its default route (a UDP connect sends nothing, it
    only picks the route); 127.0.0.1 only on a host with no route out."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


class ReplayServer:
    """A PULL socket and a receiver thread in front of a ReplayQueue.

    Every queue operation goes through this object (one lock), so the
    orchestrator can take batches, abandon groups and move the policy version
    while frames arrive.

    ``keys``: the run's keys (the driver makes them, seal/run/pipeline.py); with
    ``cfg.curve`` and none given the server makes its own, so a CURVE server
    is never open to everyone. ``client_keys`` is what its senders need."""

    def __init__(
        self, queue: ReplayQueue, cfg: TransportConfig = TransportConfig(), keys: RunKeys | None = None
    ) -> None:
        if keys is not None and not cfg.curve:
            raise ValueError("CURVE keys given to a replay server with transport.curve=false")
        self.queue = queue
        self.cfg = cfg
        self.stats = ServerStats()
        self.keys = (keys or RunKeys.generate()) if cfg.curve else None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # A context of its own: the ZAP handler that admits the env actors' key is per context.
        self._guard = CurveGuard(self.keys.server, [self.keys.actors.public], "replay") if self.keys else None
        self._context = self._guard.context if self._guard else zmq.Context()
        self._socket = self._context.socket(zmq.PULL)
        if self._guard:
            self._guard.secure(self._socket)
        # libzmq 4.3.5 with a ZAP handler and a receive HWM of 1 can leave a frame that poll
        # reports and recv never returns (tests/unit/test_transport_auth.py): 2 at least.
        self._socket.setsockopt(zmq.RCVHWM, max(cfg.hwm, 2) if self._guard else cfg.hwm)
        self._socket.setsockopt(zmq.LINGER, 0)
        try:
            if cfg.port:
                self._socket.bind(f"tcp://{cfg.host}:{cfg.port}")
                port = cfg.port
            else:
                port = self._socket.bind_to_random_port(f"tcp://{cfg.host}")
        except zmq.ZMQError:  # a port in use: no ZAP or monitor thread outlives the failed start
            self._socket.close()
            if self._guard:
                self._guard.close()
            self._context.term()
            raise
        self.address = f"tcp://{self._advertised_host()}:{port}"
        self._thread = threading.Thread(target=self._receive, name="replay-receiver", daemon=True)
        self._thread.start()

    @property
    def client_keys(self) -> ClientKeys | None:
        """The env actors' keys for this server (None without CURVE)."""
        return self.keys.client("actors") if self.keys else None

    def _advertised_host(self) -> str:
        if self.cfg.advertise_host:
            return self.cfg.advertise_host
        if self.cfg.host in ("0.0.0.0", "*"):
            # Not gethostbyname(gethostname()): on many hosts (and in the two-host test's network
            # namespaces) the hostname resolves to 127.0.0.1, which no other node can reach. The
            # address other nodes route to this one by is the one the default route leaves from.
            return routable_ip()
        return self.cfg.host

    def _receive(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            if self.queue.ready() >= self.cfg.max_ready_groups:
                t0 = time.perf_counter()
                time.sleep(0.01)
                self.stats.backpressure_s += time.perf_counter() - t0
                continue
            if not poller.poll(100):
                continue
            try:  # never block: a receiver stuck in recv could not be stopped, and close() would race it
                msg = self._socket.recv(copy=False, flags=zmq.NOBLOCK)
            except zmq.Again:
                continue
            frame = msg.bytes
            self.stats.frames += 1
            self.stats.bytes += len(frame)
            peer = _peer_address(msg)
            self.stats.frames_by_peer[peer] = self.stats.frames_by_peer.get(peer, 0) + 1
            try:
                message = decode(frame)
                if not isinstance(message, Trajectory):
                    raise WireError(f"a {type(message).__name__} on the trajectory stream")
                with self._lock:
                    self.queue.add(message)
            except (WireError, ValueError) as exc:
                self.stats.rejected += 1
                if self.stats.rejected <= 10 or self.stats.rejected % 1000 == 0:
                    log.warning(
                        "replay server rejected frame %d (%d rejected so far): %s",
                        self.stats.frames,
                        self.stats.rejected,
                        exc,
                    )

    # ------------------------------------------------ queue access (locked)
    def take_batch(self, partial: bool = False) -> list[Group] | None:
        with self._lock:
            return self.queue.take_batch(partial)

    def drain_filtered(self) -> list[Group]:
        with self._lock:
            return self.queue.drain_filtered()

    def abandon(self, group_id: str) -> bool:
        with self._lock:
            return self.queue.abandon(group_id)

    def drain_dropped(self) -> list[Group]:
        with self._lock:
            return self.queue.drain_dropped()

    def drain_faulted(self) -> list[Group]:
        with self._lock:
            return self.queue.drain_faulted()

    def undecided_tokens(self) -> dict[str, int]:
        with self._lock:
            return self.queue.undecided_tokens()

    def expired(self) -> list[tuple[str, str]]:
        with self._lock:
            return self.queue.expired()

    def set_policy_version(self, version: int) -> None:
        with self._lock:
            self.queue.set_policy_version(version)

    def ready(self) -> int:
        with self._lock:
            return self.queue.ready()

    def counters(self) -> ReplayCounters:
        with self._lock:
            if self._guard:
                self.stats.unauthorized = self._guard.unauthorized
            return ReplayCounters(
                replace(self.queue.stats), replace(self.stats, frames_by_peer=dict(self.stats.frames_by_peer))
            )

    def close(self) -> None:
        """Idempotent."""
        if self._context.closed:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close()
        if self._guard:
            self._guard.close()
        self._context.term()
