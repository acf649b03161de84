"""Transport: trajectory messages/s and MB/s through the ZeroMQ + msgpack path vs queues.

Paths, for trajectories of each size (tokens; half prompt, the rest in
generated segments, as the rollouts produce them):
  zmq       TrajectorySender in a spawned process -> ReplayServer here
            (encode, send, receive, decode, validate, into the replay queue,
            groups taken out as the learner would), the pipeline's path;
  mp_queue  multiprocessing.Queue between the same two processes (pickle),
            the baseline for crossing a process boundary without us;
  queue     queue.Queue between two threads of one process (no copy, no
            serialization): the floor any in-process design pays.
MB/s counts the encoded frame size for every path, so the three compare the
same payload. Paths alternate within each repeat.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import queue
import random
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._common import figure, log, save_figure, summary, table
from replay.messages import Segment, Trajectory
from replay.queue import ReplayQueue
from replay.transport import ReplayServer, TrajectorySender, TransportConfig
from replay.wire import decode, encode

NAME = "transport"
PATHS = ("zmq", "mp_queue", "queue")
GROUP = 8  # rollouts per group (the paper's n)


def add_arguments(parser) -> None:
    parser.add_argument("--tokens", default="2048,8192,32768", help="trajectory sizes in tokens, comma-separated")
    parser.add_argument(
        "--mb", type=float, default=64.0, help="payload per measurement (sets the message count per size)"
    )
    parser.add_argument("--max-messages", type=int, default=5000)


def make_trajectories(tokens: int, count: int, seed: int = 0) -> list:
    """Realistic trajectories: random token ids, a prompt, then generated spans
    alternating with tool-result spans, behaviour logprobs on generated tokens."""
    rng = random.Random(seed)
    prompt = tokens // 2
    ids = [rng.randrange(0, 49152) for _ in range(tokens)]
    mask, logprobs, segments = [0] * prompt, [0.0] * prompt, []
    pos, gen = prompt, True
    while pos < tokens:
        span = min(tokens - pos, max(1, (tokens - prompt) // 8))
        if gen:
            segments.append(Segment(pos, pos + span, 0))
        mask += [int(gen)] * span
        logprobs += [-rng.uniform(0.01, 5.0) if gen else 0.0 for _ in range(span)]
        pos, gen = pos + span, not gen
    out = []
    for i in range(count):
        out.append(
            Trajectory(
                task_id="multi_turn_base_0",
                category="base",
                env="bfcl",
                group_id=f"g{seed}-{i // GROUP}",
                rollout_index=i % GROUP,
                interface_version=3,
                token_ids=ids,
                loss_mask=mask,
                logprobs=logprobs,
                prompt_length=prompt,
                segments=segments,
                reward=float(i % 2),
                success=bool(i % 2),
                progress=0.5,
                tags=["pass", "state_mismatch", "pass"],
                labels=["pass", "state_mismatch", "pass"],
                error_type=None,
                outcome="completed",
                num_tool_calls=6,
                num_steps=9,
                timings={"generate_s": 1.0, "env_s": 0.01, "judge_s": 0.002, "total_s": 1.1},
            )
        )
    return out


def _zmq_producer(address: str, keys, tokens: int, count: int, seed: int, ready, start) -> None:
    trajs = make_trajectories(tokens, count, seed)
    sender = TrajectorySender(address, hwm=64, send_timeout_s=120, keys=keys)
    ready.set()
    start.wait()
    for t in trajs:
        sender.send(t)
    sender.close()  # linger: queued frames still go out


def _mp_producer(q, tokens: int, count: int, seed: int, ready, start) -> None:
    trajs = make_trajectories(tokens, count, seed)
    ready.set()
    start.wait()
    for t in trajs:
        q.put(t)


def _wait_ready(proc, ready) -> None:
    """The clock starts once the producer has built its trajectories and connected."""
    while not ready.wait(0.1):
        if proc.exitcode is not None:
            raise RuntimeError(f"the producer process exited early (code {proc.exitcode})")


def _zmq(tokens: int, count: int, seed: int) -> float:
    ctx = mp.get_context("spawn")
    server = ReplayServer(
        ReplayQueue(GROUP, 1, max_staleness=10**6, reissue_after_s=900.0), TransportConfig(hwm=64, max_ready_groups=64)
    )
    ready, start = ctx.Event(), ctx.Event()
    # With CURVE, as a run streams (the default transport.curve): the timing includes the encryption.
    proc = ctx.Process(
        target=_zmq_producer, args=(server.address, server.client_keys, tokens, count, seed, ready, start), daemon=True
    )
    proc.start()
    try:
        _wait_ready(proc, ready)
        t0 = time.perf_counter()
        start.set()
        taken = 0
        deadline = time.monotonic() + 600
        while taken < count // GROUP:
            groups = server.take_batch()
            if groups is None:
                if time.monotonic() > deadline or (proc.exitcode not in (None, 0)):
                    raise RuntimeError(f"zmq path stalled: {taken} of {count // GROUP} groups")
                time.sleep(0.0005)
                continue
            taken += len(groups)
        seconds = time.perf_counter() - t0
        if server.counters().server.rejected:
            raise RuntimeError("the replay server rejected frames of a valid trajectory")
    finally:
        proc.join(timeout=30)
        server.close()
    return seconds


def _mp_queue(tokens: int, count: int, seed: int) -> float:
    ctx = mp.get_context("spawn")
    q, ready, start = ctx.Queue(maxsize=64), ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_mp_producer, args=(q, tokens, count, seed, ready, start), daemon=True)
    proc.start()
    _wait_ready(proc, ready)
    t0 = time.perf_counter()
    start.set()
    for _ in range(count):
        q.get(timeout=600)
    seconds = time.perf_counter() - t0
    proc.join(timeout=30)
    return seconds


def _thread_queue(tokens: int, count: int, seed: int) -> float:
    trajs = make_trajectories(tokens, count, seed)
    q: queue.Queue = queue.Queue(maxsize=64)
    producer = threading.Thread(target=lambda: [q.put(t) for t in trajs], daemon=True)
    t0 = time.perf_counter()
    producer.start()
    for _ in range(count):
        q.get()
    seconds = time.perf_counter() - t0
    producer.join()
    return seconds


def _codec_ms(tokens: int, rounds: int = 20) -> dict[str, float]:
    """Where the per-message time goes, one thread, no transport: our msgpack
    encode and decode (with validation) against pickle of the same object."""
    traj = make_trajectories(tokens, 1)[0]
    frame = encode(traj)
    out = {}
    for name, fn in (
        ("encode", lambda: encode(traj)),
        ("decode", lambda: decode(frame)),
        ("pickle", lambda: pickle.dumps(traj)),
        ("unpickle", lambda: pickle.loads(pickle.dumps(traj))),
    ):
        t0 = time.perf_counter()
        for _ in range(rounds):
            fn()
        out[name] = (time.perf_counter() - t0) / rounds * 1e3
    out["unpickle"] -= out["pickle"]
    return out


def run(args) -> dict[str, Any]:
    sizes = [int(x) for x in args.tokens.split(",") if x.strip()]
    measure = {"zmq": _zmq, "mp_queue": _mp_queue, "queue": _thread_queue}
    results: dict[str, dict[int, list[dict[str, float]]]] = {p: {s: [] for s in sizes} for p in PATHS}
    frame_bytes, counts = {}, {}
    for size in sizes:
        frame_bytes[size] = len(encode(make_trajectories(size, 1)[0]))
        # Whole groups, enough payload to time, capped for the smallest sizes.
        counts[size] = max(GROUP, min(args.max_messages, int(args.mb * 2**20 / frame_bytes[size])) // GROUP * GROUP)
    for r in range(args.repeats):
        for size in sizes:
            for path in PATHS if r % 2 == 0 else PATHS[::-1]:
                log(f"[{NAME}] repeat {r + 1}/{args.repeats}: {path}, {size} tokens x {counts[size]} messages")
                seconds = measure[path](size, counts[size], seed=r)
                results[path][size].append(
                    {
                        "msgs_per_s": counts[size] / seconds,
                        "mb_per_s": counts[size] * frame_bytes[size] / 2**20 / seconds,
                    }
                )
    report: dict[str, Any] = {
        "sizes_tokens": sizes,
        "frame_bytes": [frame_bytes[s] for s in sizes],
        "messages": [counts[s] for s in sizes],
        "per_message_ms": [_codec_ms(s) for s in sizes],
    }
    for path in PATHS:
        report[path] = {
            "msgs_per_s": [summary([m["msgs_per_s"] for m in results[path][s]])["median"] for s in sizes],
            "mb_per_s": [summary([m["mb_per_s"] for m in results[path][s]])["median"] for s in sizes],
            "msgs_per_s_spread": [summary([m["msgs_per_s"] for m in results[path][s]]) for s in sizes],
        }
    for base in ("mp_queue", "queue"):
        # Ratio per repeat (same load), then the median over repeats.
        report[f"zmq_over_{base}"] = [
            summary([z["msgs_per_s"] / b["msgs_per_s"] for z, b in zip(results["zmq"][s], results[base][s])])
            for s in sizes
        ]
    report["notes"] = [
        "zmq: encode + PUSH in a spawned process, PULL + decode + validate + replay queue + take_batch here",
        "mp_queue: pickled Trajectory objects through multiprocessing.Queue between the same two processes",
        "queue: object references between two threads (no serialization): a floor, not an alternative across processes",
        "MB/s = messages x encoded frame size / seconds for every path",
        "per_message_ms: single-threaded codec cost per message (encode, decode + validate) against pickle",
    ]
    return report


def render(report: dict[str, Any]) -> str:
    rows = []
    for i, size in enumerate(report["sizes_tokens"]):
        for path in PATHS:
            ratio = report["zmq_over_mp_queue"][i]["median"] if path == "zmq" else None
            rows.append((f"{size} tok / {path}", report[path]["msgs_per_s"][i], report[path]["mb_per_s"][i], ratio))
    codec = [
        (f"{s} tok", b / 1024, c["encode"], c["decode"], c["pickle"], c["unpickle"])
        for s, b, c in zip(report["sizes_tokens"], report["frame_bytes"], report["per_message_ms"])
    ]
    return "\n\n".join(
        [
            table(rows, ["size / path", "msgs/s", "MB/s", "zmq / mp_queue"]),
            table(codec, ["codec, one thread", "frame KiB", "encode ms", "decode ms", "pickle ms", "unpickle ms"]),
        ]
    )


def plot(report: dict[str, Any], out_dir: Path) -> Path:
    fig, (ax, ax2) = figure(2)
    sizes = report["sizes_tokens"]
    width = 0.8 / len(PATHS)
    for k, path in enumerate(PATHS):
        xs = [i + k * width for i in range(len(sizes))]
        ax.bar(xs, report[path]["msgs_per_s"], width, label=path)
        ax2.bar(xs, report[path]["mb_per_s"], width, label=path)
    for a, label in ((ax, "messages/s"), (ax2, "MB/s")):
        a.set_xticks([i + width for i in range(len(sizes))], [f"{s // 1024}K tok" for s in sizes])
        a.set_yscale("log")
        a.set_ylabel(label)
        a.legend(fontsize=8)
    return save_figure(fig, out_dir, NAME, "trajectory transport: ZeroMQ + msgpack vs queues")
