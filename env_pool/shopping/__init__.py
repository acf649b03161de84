"""A built-in multi-turn shopping-list tool environment with BFCL's shape, sized for a tiny model."""
