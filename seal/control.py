"""The running pipeline's control socket (ZeroMQ REP), and its client.

The driver binds it next to the replay stream and writes the address to
RUN_DIR/control.json; `seal scale RUN_DIR env=N` sends a Control message
(replay/wire.py framing) and prints the reply. The driver answers between
loop iterations, so a command takes effect within about 0.1 s.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from replay.messages import Control
from replay.wire import WireError, decode, encode

CONTROL_FILE = "control.json"


class ControlServer:
    def __init__(self, run_dir: Path, host: str = "127.0.0.1") -> None:
        import zmq

        self._socket = zmq.Context.instance().socket(zmq.REP)
        self._socket.setsockopt(zmq.LINGER, 0)
        port = self._socket.bind_to_random_port(f"tcp://{host}")
        connect_host = "127.0.0.1" if host in ("0.0.0.0", "*") else host
        self.address = f"tcp://{connect_host}:{port}"
        self.path = run_dir / CONTROL_FILE
        self.path.write_text(json.dumps({"address": self.address, "pid": os.getpid()}))

    def poll(self, handler: Callable[[str, dict[str, Any]], dict[str, Any]]) -> None:
        """Answer every waiting request; a bad one gets {"ok": false, "error": ...}."""
        import msgpack
        import zmq

        while self._socket.poll(0, zmq.POLLIN):
            frame = self._socket.recv()
            try:
                message = decode(frame)
                if not isinstance(message, Control):
                    raise WireError(f"expected a control message, got {type(message).__name__}")
                reply = {"ok": True, **handler(message.command, dict(message.args))}
            except (WireError, ValueError) as exc:
                reply = {"ok": False, "error": str(exc)}
            self._socket.send(msgpack.packb(reply, use_bin_type=True))

    def close(self) -> None:
        self._socket.close()
        self.path.unlink(missing_ok=True)


def send_control(run_dir: Path, command: str, args: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
    import msgpack
    import zmq

    path = Path(run_dir) / CONTROL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no running pipeline for {run_dir} (no {CONTROL_FILE}; is `seal train run_dir={run_dir}` running?)")
    address = json.loads(path.read_text())["address"]
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
    sock.connect(address)
    try:
        sock.send(encode(Control(command, args)))
        return msgpack.unpackb(sock.recv(), raw=False)
    except zmq.Again:
        raise RuntimeError(f"the pipeline at {address} did not answer within {timeout_s:.0f} s") from None
    finally:
        sock.close()
