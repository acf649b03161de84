"""Environments the policy acts in: BFCL V3 multi-turn and a small built-in tool env.

Heavy parts (bfcl-eval) load lazily, on first use.
"""
