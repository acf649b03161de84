"""The coordinator: the capability state, the tag weights it derives, the interface policy that
evolves the training interface, and the Ray service that runs them."""
