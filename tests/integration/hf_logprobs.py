"""Per-token log-probabilities of a sequence under a Hugging Face causal LM: the plain-forward reference
the tests hold vLLM's and the learner's logprobs against."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def sequence_logprobs(model: Any, token_ids: Sequence[int], temperature: float = 1.0) -> list[float]:
    """log p(token_i | tokens_<i) for i >= 1 (position 0 gets 0.0), as a list.

    Matches what vLLM reports for sampled tokens (raw logits / temperature,
    log-softmax over the vocabulary).
    """
    import torch

    ids = torch.tensor([list(token_ids)], dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp = torch.log_softmax(logits[:-1], dim=-1)
    picked = logp.gather(1, ids[0, 1:].unsqueeze(1)).squeeze(1)
    return [0.0] + picked.tolist()
