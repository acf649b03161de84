"""The learner: GRPO updates with DeepSpeed ZeRO (stage 2 or 3) or plain torch.

One ``train_batch`` call takes complete groups, computes advantages and A-Patch
scales, splits the batch into mini-batches (one optimizer step each) and
mini-batches into micro-batches (gradient accumulation). The loss is the token
mean over the whole mini-batch, whatever the micro-batch split, so every
backend and split computes the same update. A frozen copy of the initial
weights is the KL reference (none when the KL coefficient is 0; with LoRA the policy, its adapter off). Checkpoints hold model, optimizer, step and RNG
states plus any extra state the caller passes (capability and interface). The objective of a
micro-batch is learner/objective.py's; the weights leave through ``weights_out`` (learner/weights_out.py).
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from learner.batch import Sample, build_samples
from learner.checkpoints import load_learner, save_learner
from learner.config import LearnerConfig
from learner.ds_config import deepspeed_config
from learner.lora import add_adapter, lora_on, trainable_parameters
from learner.micro_batches import MicroBatch, collate, packs, plan_mini_batches
from learner.objective import MicroForwards, MiniBatchShare, micro_objective
from learner.onednn_caches import bound_caches
from learner.optimizer import StepBox, make_optimizer
from learner.packing import pack_shared_prefix, use_shared_prefix_attention
from learner.process_group import init_distributed, release_distributed
from learner.rank_shards import (
    agree_on_mini_batches,
    agree_on_reference,
    assigned_mini_batches,
    is_padding,
    recompute_choices,
)
from learner.reference import build_reference
from learner.scoring_head import check_plain_head, scoring_head
from learner.step_result import LearnerStepResult
from learner.step_stats import StepStats
from learner.weights_out import WeightsOut
from replay.messages import Trajectory
from weights.model_assets import resolve_model
from weights.precision import choose_dtype


class Learner:
    """``world_size`` ranks train together (learner/rank_shards.py forms their group before this is built);
    ``timeout_s`` bounds every collective and every call the driver makes to a rank."""

    def __init__(
        self,
        model_path: str,
        cfg: LearnerConfig,
        group_size: int,
        world_size: int,
        timeout_s: float,
        step_timeout_s: float,
    ) -> None:
        bound_caches()  # before the first bf16 op: a learner's new shapes each step would fill them (learner/onednn_caches.py)
        import torch
        from transformers import AutoModelForCausalLM

        model_path = str(resolve_model(model_path))
        self._hf_ds_config: Any = None  # transformers' HfDeepSpeedConfig under ZeRO-3 (_init_deepspeed)
        self._owns_group = False  # shares the process group init_distributed formed here: close releases it
        self.cfg = cfg
        # The resolved compute dtype; "bfloat16" runs the forwards under autocast (``_autocast``).
        self.dtype = choose_dtype(cfg.dtype, cfg.device, "learner")
        self.group_size = group_size
        if world_size < 1 or timeout_s <= 0 or step_timeout_s <= 0:
            raise ValueError(
                f"world_size must be >= 1 and timeouts > 0, got {world_size}, {timeout_s}, {step_timeout_s}"
            )
        if world_size > 1 and cfg.backend != "deepspeed":
            raise ValueError(
                f"world_size={world_size} needs backend=deepspeed (learner=zero2 or zero3); the torch backend is one process"
            )
        self.world_size, self.rank = world_size, 0
        self.timeout_s, self.step_timeout_s = timeout_s, step_timeout_s
        self.model_path = model_path
        self.step = 0  # optimizer steps taken
        # Seconds per phase of a step when a bench sets a PhaseClock (learner/phases.py), and the hold
        # of a step whose gradient norm is not finite: what the optimizer's step reads (learner/optimizer.py).
        self._phase_box = StepBox()
        self.device = torch.device(cfg.device)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        per_mini = cfg.mini_batch_groups * group_size
        if per_mini % cfg.micro_batch_size:
            raise ValueError(
                f"a mini-batch of {per_mini} trajectories does not split into micro-batches of {cfg.micro_batch_size}"
            )
        self.grad_accum = per_mini // cfg.micro_batch_size
        # A ZeRO-3 config left active by an earlier learner in this process
        # would make from_pretrained partition the reference model too.
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()
        if cfg.backend == "deepspeed":
            self._init_deepspeed(model_path)
        else:
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
            model = model.to(self.device).train()  # type: ignore[arg-type]  # transformers types .to oddly
            self.model = self._prepare_policy_model(model)
            self.optimizer = make_optimizer(cfg, trainable_parameters(self.model), self._phase_box)
            self.engine: Any = None  # DeepSpeed's engine (_init_deepspeed); None: plain torch
        # The KL reference: none when the KL term is off; under LoRA the policy with its adapter disabled.
        self.ref = (
            build_reference(model_path, self.cfg, self.dtype, self.device, self._hf_ds_config, self.model)
            if cfg.loss.kl_coef
            else None
        )
        # Weights out (gathers, snapshots, the broadcast), reading the policy this learner trains.
        zero3 = self.engine is not None and cfg.zero_stage == 3
        self.weights_out = WeightsOut(self.model, cfg, model_path, self.rank, zero3)

    @property
    def phases(self) -> Any:
        return self._phase_box.clock

    @phases.setter
    def phases(self, clock: Any) -> None:
        self._phase_box.clock = clock

    def _init_deepspeed(self, model_path: str) -> None:
        import deepspeed
        import torch
        import torch.distributed as dist
        from transformers import AutoModelForCausalLM

        self._owns_group = init_distributed(self.cfg.device)
        if dist.get_world_size() != self.world_size:
            raise ValueError(
                f"learner world_size={self.world_size} but the process group has {dist.get_world_size()} ranks"
            )
        self.rank = dist.get_rank()
        # In bf16 with the torch_autocast section the reference's engine gets too (learner/ds_config.py).
        ds_config = deepspeed_config(self.cfg, self.grad_accum, self.dtype, self.world_size)
        if self.cfg.zero_stage == 3:
            # Must exist (and stay alive) before the model is built, so
            # from_pretrained partitions parameters as it loads them.
            from transformers.integrations import HfDeepSpeedConfig

            self._hf_ds_config = HfDeepSpeedConfig(ds_config)
        model = self._prepare_policy_model(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32))
        optimizer = make_optimizer(self.cfg, trainable_parameters(model), self._phase_box)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        # Stage 0 (one rank: learner/ds_config.py) clips without keeping the norm: the learner measures it.
        self._norm_before_step = ds_config["zero_optimization"]["stage"] == 0
        self._grad_norm = 0.0
        self.model = self.engine.module
        self.model.train()

    def _prepare_policy_model(self, model) -> Any:
        """``model`` made the policy: checked, packed attention, checkpointing; wrapped in a LoRA adapter
        when ``cfg.lora`` sets a rank (learner/lora.py), which is what it returns then."""
        check_plain_head(model)
        if self.cfg.shared_prefix:  # the reference model gets the same in __init__
            use_shared_prefix_attention(model)
        self._checkpointing = False
        if self.cfg.gradient_checkpointing:
            model.config.use_cache = False
        if self.cfg.lora is not None and lora_on(self.cfg):
            model = add_adapter(model, self.cfg.lora)
        if self.cfg.gradient_checkpointing:
            self._set_checkpointing(model, True)
        return model

    def _set_checkpointing(self, model, on: bool) -> None:
        if on != self._checkpointing:
            if on:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_disable()
            self._checkpointing = on

    # --------------------------------------------------------------- training
    def _autocast(self):
        """bf16 autocast for a forward when the learner runs in bf16: matmuls in bf16, the
        fp32 weights cast per op (their gradients arrive fp32), reductions kept fp32 by autocast."""
        import torch

        if self.dtype != "bfloat16":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def canary_logprobs(self, token_ids) -> list[float]:
        """log p of each token after the first under the current weights, as the generator
        reports prompt logprobs (the weight-sync canary); every rank runs it under ZeRO-3."""
        import torch

        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        with torch.no_grad(), self._autocast():
            logits = self.model(input_ids=ids).logits[0].float()
        logp = torch.log_softmax(logits[:-1], dim=-1).gather(1, ids[0, 1:].unsqueeze(1)).squeeze(1)
        return logp.tolist()

    def _entropy_mode(self, model) -> str:
        """none (reference model) | grad (in the loss) | metric (logged only: no graph kept)."""
        if model is not self.model:
            return "none"
        return "grad" if self.cfg.loss.entropy_coef else "metric"

    def _logprobs(self, model, micro: Sequence[Sample], batch: MicroBatch, recompute: bool | None = None):
        """(log p, entropy, tokens forwarded) of one micro-batch: [B, T] each (0 where not scored;
        entropy None for the reference). Packed when its samples share a group (learner/packing.py).
        ``recompute``: the group's choice of gradient checkpointing for it (learner/rank_shards.py recompute_choices);
        None, on one learner, chooses from this micro-batch's own length.

        Only the scored tokens meet the output head: the forward keeps the hidden states of the
        positions some scored token needs (``logits_to_keep``), and the head turns those into log p
        and entropy of exactly the scored (sample, position, target) triples (learner/scoring_head.py),
        never holding the whole vocabulary's logits for the backward."""
        import torch

        policy = model is self.model
        with self.phases.phase("collate"):
            packed = batch.packed
            where = batch.mask.bool()
            sample, column = where.nonzero(as_tuple=True)
            targets = batch.ids[sample, column + 1]
            if packed is None:
                keep = where.any(dim=0).nonzero().squeeze(1)  # hidden column j predicts token j + 1
                rows, needed = sample, column
                inputs = {"input_ids": batch.ids, "attention_mask": batch.attention}
                forwarded = sum(len(s.token_ids) for s in micro)
            else:
                needed = packed.logit_index[sample, column]
                keep = torch.unique(needed)
                rows = torch.tensor(packed.sample_row, dtype=torch.long, device=batch.ids.device)[sample]
                inputs, forwarded = packed.forward_kwargs(), packed.packed_tokens
            positions = torch.searchsorted(keep, needed)
        logp = torch.zeros(batch.mask.shape, dtype=torch.float32, device=batch.ids.device)
        if keep.numel() == 0:
            return logp, None, forwarded
        if policy and self.cfg.gradient_checkpointing:
            own = forwarded >= self.cfg.gradient_checkpointing_min_tokens
            self._set_checkpointing(model, own if recompute is None else recompute)
        forward = self.engine if (policy and self.engine is not None) else model
        phase = "policy_forward" if policy else "reference_forward"
        head = scoring_head(
            getattr(model, "module", model),
            rows,
            positions,
            targets,
            self.cfg.logprob_head,
            self.phases.phase,
            "logprobs" if policy else phase,
            with_entropy=policy,  # the reference's entropy is never read
            entropy_grad=self._entropy_mode(model) == "grad",  # a metric's: no backward passes
        )
        with self.phases.phase(phase), self._autocast(), head:
            scored = forward(**inputs, logits_to_keep=keep).logits  # [N, 2]: log p, entropy
        logp = logp.index_put((sample, column), scored[:, 0])
        mode = self._entropy_mode(model)
        if mode == "none":
            return logp, None, forwarded
        entropy = torch.zeros_like(logp).index_put(
            (sample, column), scored[:, 1] if mode == "grad" else scored[:, 1].detach()
        )
        return logp, entropy, forwarded

    def _pack(self, samples: Sequence[Sample]):
        """Packed rows for a micro-batch, or None when no two of its samples share a group."""
        if not packs(samples, self.cfg.shared_prefix):
            return None
        return pack_shared_prefix([s.token_ids for s in samples], [s.group_id for s in samples], self.device)

    def _collate(self, samples: Sequence[Sample]) -> MicroBatch:
        """The micro-batch's tensors and, once for the policy's and the reference's forwards, its packing."""
        return collate(samples, self.device)._replace(packed=self._pack(samples))

    def _mini_batch_plan(self, samples: Sequence[Sample], allow_partial: bool) -> list[list[list[Sample]]]:
        return plan_mini_batches(
            samples, self.cfg.mini_batch_groups, self.group_size, self.cfg.micro_batch_size, allow_partial
        )

    def _proximal_logprobs(self, plan, recompute: list[list[bool]] | None = None) -> dict[int, Any]:
        """pi_old for ``old_logprobs=recompute``: the policy's logprobs before this batch's first
        optimizer step, per sample (by id). The first mini-batch needs no extra forward: its
        training forward runs at exactly these weights, so its detached logprobs are pi_old."""
        import torch

        out: dict[int, Any] = {}
        if self.cfg.old_logprobs != "recompute":
            return out
        with torch.no_grad():
            for m, mini in enumerate(plan[1:], start=1):
                for k, micro in enumerate(mini):
                    with self.phases.phase("collate"):
                        batch = self._collate(micro)
                    logp, _, _ = self._logprobs(self.model, micro, batch, recompute[m][k] if recompute else None)
                    for row, s in enumerate(micro):
                        out[id(s)] = logp[row].detach()
        return out

    def _micro_step(
        self,
        micro,
        mini_tokens: int,
        mini_sequences: int,
        proximal,
        stats,
        is_last: bool,
        loss_scale: float = 1.0,
        recompute: bool | None = None,
        carried_reference: bool = False,
    ) -> int:
        """Forward, loss and backward of one micro-batch; returns the tokens forwarded. ``loss_scale``:
        the world size (DeepSpeed averages gradients over ranks), 0 for a padding micro-batch.
        ``carried_reference``: the KL reference comes with the samples (learner/rank_shards.py
        agree_on_reference), and the reference model is not forwarded."""
        import torch

        with self.phases.phase("collate"):
            batch = self._collate(micro)
        logp, entropy, forwarded = self._logprobs(self.model, micro, batch, recompute)
        ref_logp = None
        if self.cfg.loss.kl_coef and carried_reference:
            ref_logp = batch.reference if batch.reference is not None else torch.zeros_like(batch.mask)
        elif self.cfg.loss.kl_coef:
            with torch.no_grad():
                ref_logp = self._logprobs(self.ref, micro, batch)[0]
        with self.phases.phase("loss"):
            proximal_old = None
            if id(micro[0]) in proximal:  # pi_old from before the step's first optimizer step
                proximal_old = torch.stack([proximal[id(s)][: batch.mask.shape[1]] for s in micro])
            out = micro_objective(
                MicroForwards(logp, entropy, ref_logp, proximal_old),
                batch,
                MiniBatchShare(mini_tokens, mini_sequences, loss_scale),
                self.cfg,
            )
            if loss_scale:  # a padding micro-batch adds nothing to the step's statistics
                stats.add_micro(
                    out.metrics, micro, batch.behaviour, out.learner_old, batch.mask, out.is_weights, out.cut
                )
            loss = out.loss
        with self.phases.phase("backward"):
            if self.engine is not None:
                # The caller owns the boundary: the last micro-batch of a mini-batch, however many it holds.
                self.engine.set_gradient_accumulation_boundary(is_last)
                self.engine.backward(loss, scale_wrt_gas=False)
            else:
                loss.backward()
        if self.engine is not None:
            with self.phases.phase("zero_bookkeeping"):  # the optimizer's own step inside counts as "optimizer"
                if is_last and self._norm_before_step:
                    grads = [q.grad for q in self.model.parameters() if q.grad is not None]
                    self._grad_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
                    self._phase_box.hold = not math.isfinite(self._grad_norm)  # nothing applied (learner/optimizer.py)
                try:
                    self.engine.step()
                finally:
                    self._phase_box.hold = False
        return forwarded if loss_scale else 0

    def train_batch(
        self,
        trajectories: Sequence[Trajectory],
        tag_weights: Mapping[str, float],
        group_weights: Mapping[str, float] | None = None,
        policy_version: int | None = None,
        allow_partial: bool = False,
        mini_groups: Sequence[Sequence[str]] | None = None,
    ) -> LearnerStepResult:
        """One batch of complete groups: one optimizer step per ``mini_batch_groups`` groups.
        ``group_weights`` scales stale groups' advantages (replay queue); ``policy_version``
        is the version the learner's weights are now (the logprob-mismatch metrics compare
        only trajectories generated at it); ``allow_partial`` accepts a last, smaller mini-batch.
        In a group (world_size > 1) ``mini_groups`` is this rank's share of each mini-batch (learner/rank_shards.py)."""
        import torch

        t0 = time.perf_counter()
        samples, stats = build_samples(trajectories, tag_weights, self.cfg.apatch, group_weights)
        if any(len(s.token_ids) < 2 for s in samples):
            raise ValueError("every trajectory needs at least 2 tokens")

        if mini_groups is None:
            if self.world_size > 1:
                raise ValueError(
                    "a learner group rank trains on its shard: pass mini_groups (learner/rank_shards.py shard_batch)"
                )
            plan = self._mini_batch_plan(samples, allow_partial)
        else:
            plan = assigned_mini_batches(samples, mini_groups, self.cfg.micro_batch_size)
        # Global scored-token and sequence counts per mini-batch; padding so every rank makes the same calls.
        plan, mini_token_counts, mini_seq_counts = agree_on_mini_batches(plan, self.world_size)
        recompute = recompute_choices(plan, self.cfg, self.world_size)  # the same choice on every rank
        # Where the trajectories carry the KL reference (trainer.reference_logprobs=generator), on every rank alike.
        carried = agree_on_reference(plan, self.world_size) if self.cfg.loss.kl_coef else None
        carried_tokens = 0
        proximal = self._proximal_logprobs(plan, recompute)
        step_stats = StepStats(policy_version)
        tokens = forward_tokens = 0
        for m, (mini, mini_tokens, mini_sequences) in enumerate(zip(plan, mini_token_counts, mini_seq_counts)):
            mini_tokens = max(1, mini_tokens)
            step_stats.start_mini()
            for k, micro in enumerate(mini):
                scale = 0.0 if is_padding(micro) else float(self.world_size)
                forward_tokens += self._micro_step(
                    micro,
                    mini_tokens,
                    mini_sequences,
                    proximal,
                    step_stats,
                    is_last=k == len(mini) - 1,
                    loss_scale=scale,
                    recompute=recompute[m][k] if recompute else None,
                    carried_reference=bool(carried and carried[m][k]),
                )
                if carried and carried[m][k] and scale:
                    carried_tokens += sum(s.num_tokens for s in micro)
            if self.engine is None:
                with self.phases.phase("zero_bookkeeping"):
                    grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
                    if torch.isfinite(grad_norm):  # else nothing applied (learner/optimizer.py)
                        self.optimizer.step()
                    self.optimizer.zero_grad(set_to_none=True)
                step_stats.grad_norm(float(grad_norm))
            else:
                norm = self._grad_norm if self._norm_before_step else self.engine.get_global_grad_norm()
                step_stats.grad_norm(float(norm or 0.0))
            self.step += 1
            tokens += sum(s.num_tokens for micro in mini for s in micro if not is_padding(micro))
        seconds = time.perf_counter() - t0
        return LearnerStepResult(
            step=self.step,
            seconds=seconds,
            learner_world_size=self.world_size,
            samples_per_s=len(samples) / seconds,
            tokens_per_s=tokens / seconds,
            sequence_tokens=sum(len(s.token_ids) for s in samples),
            forward_tokens=forward_tokens,
            scored_tokens=tokens,
            groups=stats.groups,
            zero_variance_groups=stats.zero_variance_groups,
            mean_scale=stats.mean_scale,
            reward_mean=stats.reward_mean,
            mini_batches=len(plan),
            reference_carried_tokens=carried_tokens,
            **step_stats.result(),
        )

    def close(self) -> None:
        """Free DeepSpeed's engines and release the process group (the last learner on a group it
        formed destroys it: learner/process_group.py). The learner is not used after; again: nothing."""
        for engine in (self.engine, self.ref):
            if engine is not None and hasattr(engine, "destroy"):  # DeepSpeed's (the reference's too under ZeRO-3)
                engine.destroy()
        self.engine = self.ref = self._hf_ds_config = None  # later from_pretrained calls load whole models
        if self._owns_group:
            self._owns_group = False
            release_distributed()

    # ----------------------------------------------------------- checkpoints
    def save_checkpoint(self, ckpt_dir: str | Path, extra: Mapping[str, Any] | None = None, keep: int = 0) -> Path:
        """Model, optimizer, step, RNG and the caller's ``extra`` (learner/checkpoints.py); every rank calls it."""
        return save_learner(self, Path(ckpt_dir), extra, keep)

    def load_checkpoint(self, ckpt_dir: str | Path) -> dict[str, Any]:
        """Restore model, optimizer, step and RNG; returns the caller's extra state."""
        return load_learner(self, Path(ckpt_dir))
