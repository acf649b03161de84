"""The trajectory stream: wire types, their msgpack codec, the ZeroMQ transport with CURVE auth,
the replay queue and the exactly-once slot ledger. Imports nothing of ours."""
