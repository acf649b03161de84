"""The Ray actors that act: env actors (play GRPO groups, stream trajectories), the generators
(generation/) and the coordinator (coordinator/). Imports weights/, rollout/, replay/ and env_pool/."""
