"""What the learner and the generators both use for weights: the model files, the dtype choice,
weight buckets through Ray's object store, the weight group with its wire types, and the network
interface its collectives leave from. Imports nothing of ours but itself."""
