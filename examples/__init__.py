"""Examples that live outside SEAL's packages and use only their public contracts (docs/custom-environment.md)."""
