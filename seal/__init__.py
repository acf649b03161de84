"""The `seal` command and the orchestration that wires the components: commands/, runtime/, run/.
No component imports it."""
