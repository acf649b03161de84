"""The built-in small tool environment (fast learning tests)."""
