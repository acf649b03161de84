"""`seal model ...`."""

from __future__ import annotations

import time


def prepare(args) -> int:
    from weights.model_assets import embedded_model_dir, is_prepared, prepare_embedded_model

    if is_prepared() and not args.force:
        print(f"embedded model ready: {embedded_model_dir()}")
        return 0
    print(
        "converting the embedded model (SmolLM2-135M-Instruct GGUF -> fp32 safetensors), about 40 s once ...",
        flush=True,
    )
    t0 = time.perf_counter()
    path = prepare_embedded_model(force=args.force)
    print(f"embedded model ready: {path} ({time.perf_counter() - t0:.0f} s)")
    return 0
