"""The learner: GRPO advantages and A-Patch, the loss, packing, the DeepSpeed engine, its ranks and
group, checkpoints and weights out. Imports weights/, replay/ and env_pool/'s tag vocabulary."""
