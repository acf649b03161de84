"""The `seal` command and the orchestration that wires the components: commands/, runtime/, run/.
No component imports it."""

from seal.chat_setup import register_resolvers

# Config interpolations that read the model (``${model_tool_format:...}``) resolve wherever a
# config is read: in the driver, every command and a test that composes one.
register_resolvers()
