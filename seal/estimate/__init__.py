"""What a configuration asks before anything starts (`seal plan`, preflight, rehearse): memory per
device, where the actors go on the nodes, how long checkpoints and snapshots may take, and whether
the collective groups can form. Pure estimates from the config and the model's config.json: it
imports no other wing of seal/, and seal/runtime calls it to check the live cluster against them."""
