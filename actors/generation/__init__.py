"""The generator side: vLLM engines (blocking and async) behind the Generator interface, the
server that shares one among many env actors, and the engine-side end of the weight group."""
