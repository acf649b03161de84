"""One `seal train` invocation of the soak: the real command (seal/commands/cli.py), with the groups
each learner step is handed recorded, so the soak can prove across driver deaths and resumes that no
group was lost or trained twice. The record is taken in this process (the driver), outside production
code: the learner group's ``train`` wrapped, one JSON line per step appended to ``$SEAL_CHAOS_TRAINED``
(written before the step is submitted: a step recorded may still die with its learner, which the
soak's lineage accounts for, benchmarks/chaos/ledger.py).

    python -m benchmarks.chaos.child train OVERRIDES...
"""

from __future__ import annotations

import json
import os
import signal
import sys

from seal.commands.cli import main as seal_main
from seal.run.learner_steps import LearnerSteps


def install_recorder(path: str, invocation: int) -> None:
    """Each learner step's groups, under the run's step number (the step being trained: one past the
    driver's count when the batch is handed over, seal/run/learner_steps.py)."""
    init = LearnerSteps.__init__
    out = open(path, "a", buffering=1)  # line-buffered: a line is whole or absent after a SIGKILL

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        learners = self.actors.learners
        train = learners.train

        def recorded(trajectories, *a, **kw):
            groups = sorted({t.group_id for t in trajectories})
            out.write(json.dumps({"invocation": invocation, "step": self.state.step + 1, "groups": groups}) + "\n")
            return train(trajectories, *a, **kw)

        learners.train = recorded

    LearnerSteps.__init__ = recording_init


def main(argv: list[str]) -> int:
    # A soak started in the background inherits SIGINT ignored; the soak ends an invocation with
    # SIGINT (the driver then closes its actors and Ray), so take it as Python does by default.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    path = os.environ.get("SEAL_CHAOS_TRAINED")
    if path:
        install_recorder(path, int(os.environ.get("SEAL_CHAOS_INVOCATION", "0")))

    return seal_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
