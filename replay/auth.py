"""CURVE security for the driver's ZeroMQ sockets (replay stream, control).

On a cluster the driver binds to a routable address: without this, anyone who
reaches the port could push trajectories (poison the training data) or
rescale the run. The driver makes one key set per run (``RunKeys``): a server
key pair for its sockets and one client key pair per role,

    actors   the env actors, on the replay stream (handed to them through Ray, in memory)
    control  `seal scale`, on the control socket (a 0600 file outside the run dir: seal/runtime/control.py)

and each server admits only its own role's key: an env actor (which runs
tools on other nodes) cannot rescale the run, and `seal scale` cannot push
trajectories. CURVE encrypts and authenticates every connection; the ZAP
handler (pyzmq's ThreadAuthenticator, on the server's own context) admits the
known client keys. A peer whose handshake fails (no CURVE at all, a key not
admitted, the wrong server key) never gets a frame through; the server's
socket monitor counts those handshakes (``unauthorized``) and the server goes
on. The monitor, not the ZAP callback, counts: ZAP only sees peers that got
as far as presenting a client key, and a plain or wrong-server-key peer fails
earlier, in the handshake.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

log = logging.getLogger(__name__)

Z85_KEY_LEN = 40  # a 32-byte Curve25519 key in Z85, as zmq.curve_keypair() returns it


def _z85(key: bytes | str, what: str) -> bytes:
    key = key.encode("ascii") if isinstance(key, str) else bytes(key)
    if len(key) != Z85_KEY_LEN:
        raise ValueError(f"{what} must be a {Z85_KEY_LEN}-character Z85 CURVE key, got {len(key)} bytes")
    return key


@dataclass(frozen=True)
class KeyPair:
    public: bytes
    secret: bytes = field(repr=False)  # never in a log line or a traceback's repr

    def __post_init__(self) -> None:
        object.__setattr__(self, "public", _z85(self.public, "a public key"))
        object.__setattr__(self, "secret", _z85(self.secret, "a secret key"))

    @classmethod
    def generate(cls) -> KeyPair:
        if not zmq.has("curve"):
            raise RuntimeError("this libzmq has no CURVE support: set transport.curve=false to run without it")
        public, secret = zmq.curve_keypair()
        return cls(public, secret)


@dataclass(frozen=True)
class ClientKeys:
    """What one client needs: the server's public key and its own pair."""

    server_public: bytes
    client: KeyPair

    def __post_init__(self) -> None:
        object.__setattr__(self, "server_public", _z85(self.server_public, "the server's public key"))

    def apply(self, socket: Any) -> None:
        """Make ``socket`` a CURVE client (before connect)."""
        socket.curve_serverkey = self.server_public
        socket.curve_publickey = self.client.public
        socket.curve_secretkey = self.client.secret


@dataclass(frozen=True)
class RunKeys:
    """One run's keys, made by the driver at start and kept in memory only."""

    server: KeyPair
    actors: KeyPair
    control: KeyPair

    @classmethod
    def generate(cls) -> RunKeys:
        return cls(KeyPair.generate(), KeyPair.generate(), KeyPair.generate())

    def client(self, role: str) -> ClientKeys:
        if role not in ("actors", "control"):
            raise ValueError(f"no client role {role!r} (actors, control)")
        return ClientKeys(self.server.public, getattr(self, role))


class _AllowList:
    """pyzmq's credentials-provider protocol: ``callback(domain, z85 key) -> bool``."""

    def __init__(self, domain: str, allowed: Iterable[bytes]) -> None:
        self.domain = domain
        self.allowed = frozenset(_z85(k, "an admitted client key") for k in allowed)

    def callback(self, domain: str, key: bytes) -> bool:
        return domain == self.domain and key in self.allowed


class CurveGuard:
    """The server side of one CURVE socket: a context of its own whose ZAP
    handler admits only ``allowed`` client keys (a ZAP handler belongs to a
    context, so each server has its own), and a thread that counts refused
    handshakes on the socket's monitor.

    Usage: ``guard.context.socket(...)``, ``guard.secure(socket)`` before bind,
    ``guard.close()`` after the socket is closed; the caller terms the context.
    A refused peer reconnects (ZeroMQ's reconnect interval), and every refused
    handshake counts, so ``unauthorized`` counts attempts, not peers."""

    def __init__(self, server: KeyPair, allowed: Iterable[bytes], domain: str) -> None:
        self.server, self.domain = server, domain
        self.unauthorized = 0
        self.context = zmq.Context()
        self._auth = ThreadAuthenticator(self.context, log=logging.getLogger(f"{__name__}.zap"))
        self._auth.start()  # before any bind: without a ZAP handler CURVE would admit every client key
        self._auth.configure_curve_callback(domain, _AllowList(domain, allowed))
        self._monitor: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def secure(self, socket: Any) -> None:
        socket.curve_server = True
        socket.curve_secretkey = self.server.secret
        socket.curve_publickey = self.server.public
        socket.zap_domain = self.domain.encode()
        refused = (
            zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        )
        self._monitor = socket.get_monitor_socket(events=refused)
        self._thread = threading.Thread(target=self._count, name=f"curve-monitor-{self.domain}", daemon=True)
        self._thread.start()

    def _count(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._monitor.poll(100):
                    continue
                event = recv_monitor_message(self._monitor, flags=zmq.NOBLOCK)
            except zmq.Again:
                continue
            except zmq.ZMQError:  # the context is going away
                break
            if event["event"] == zmq.EVENT_MONITOR_STOPPED:
                break
            self.unauthorized += 1
            if self.unauthorized <= 10 or self.unauthorized % 1000 == 0:
                log.warning(
                    "%s socket refused a peer (%s, %d refused so far): not one of this run's CURVE clients",
                    self.domain,
                    zmq.Event(event["event"]).name,
                    self.unauthorized,
                )
        self._monitor.close(linger=0)

    def close(self) -> None:
        """Stop counting and the ZAP handler (after the secured socket is closed). Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._auth.stop()
