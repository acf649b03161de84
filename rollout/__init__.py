"""What env actors and evaluation both use to play episodes: the generator contract, token-exact
chat, and playing a group (or a batch of episodes) against an environment."""
