"""The model's output head, for one forward, scores the tokens the loss needs instead of
returning logits.

``logits_to_keep`` already narrows the head to the kept positions [R, K, D]; from those the
head takes the (row, position, target) triples the micro-batch scores and returns [N, 2]:
log p(target) and the entropy per triple (learner/token_logprobs.py). The computation runs
inside the head module's own forward so DeepSpeed ZeRO-3's hooks gather (and, for the
backward, re-gather) its weight exactly as for the ordinary ``lm_head`` call; nothing else in
the model changes. Models whose causal-LM forward does more to the head's output than return it
(logit soft-capping, scaling) or whose head has a bias are refused by ``check_plain_head``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from learner.token_logprobs import chunked_token_logprobs, full_token_logprobs

HEAD_MODES = ("chunked", "full")  # chunked: learner/token_logprobs.py; full: whole-vocabulary logits (reference)
_TRANSFORMED_LOGITS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def check_plain_head(model: Any) -> None:
    """Raise unless ``model``'s logits are its head's plain, bias-free linear map of the hidden states."""
    import torch

    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        raise ValueError(
            f"the learner scores tokens from the output head's weight; {type(model).__name__}'s head is "
            f"{type(head).__name__}{' with a bias' if getattr(head, 'bias', None) is not None else ''}, not a bias-free Linear"
        )
    config = getattr(model, "config", None)
    for key in _TRANSFORMED_LOGITS:
        value = getattr(config, key, None)
        if value not in (None, 0, 0.0, 1, 1.0):
            raise ValueError(
                f"{type(model).__name__} transforms its logits ({key}={value}) after the head; the learner's "
                "scoring head does not apply that: not supported"
            )


@contextlib.contextmanager
def scoring_head(
    model: Any,
    rows: Any,
    positions: Any,
    targets: Any,
    mode: str = "chunked",
    phase: Callable[[str], Any] | None = None,
    phase_name: str = "logprobs",
    with_entropy: bool = True,
    entropy_grad: bool = True,
) -> Iterator[None]:
    """Within the block, ``model``'s head maps hidden states [R, K, D] to [N, 2] = (log p, entropy)
    of ``targets`` [N] at (``rows`` [N], ``positions`` [N]) (indices into R and K)."""
    if mode not in HEAD_MODES:
        raise ValueError(f"logprob head mode must be one of {', '.join(HEAD_MODES)}, got {mode!r}")
    import torch

    head = model.get_output_embeddings()
    score = chunked_token_logprobs if mode == "chunked" else full_token_logprobs
    timed = phase or (lambda name: contextlib.nullcontext())

    def forward(hidden):
        with timed(phase_name):
            logp, entropy = score(
                hidden[rows, positions], head.weight, targets, with_entropy=with_entropy, entropy_grad=entropy_grad
            )
            return torch.stack([logp, entropy], dim=-1)

    head.forward = forward  # an instance attribute: the module's hooks still run around it
    try:
        yield
    finally:
        del head.forward
