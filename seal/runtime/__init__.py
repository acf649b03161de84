"""What places and drives the run's actors on Ray: placement and the layout guard (the live cluster
against seal/estimate's plan), storage, the control socket, the actor set, the generator fleet and
its router, the learner group, and the weight publisher. Imports nothing from seal/run or
seal/commands; of seal's wings, only the estimator below it."""
