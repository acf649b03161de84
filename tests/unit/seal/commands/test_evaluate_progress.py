"""`seal evaluate`'s progress: a line per batch, the time left from the batches played so far."""

from __future__ import annotations

import re

from seal.commands.evaluate import EvalProgress


def test_a_line_per_batch_with_the_time_left_over_every_snapshot(capsys):
    progress = EvalProgress(to_play=4)
    progress.line("A_0", "id", 3, 5, ran=False, count=3)  # cached: free, no rate yet
    progress.batch_starts()
    progress.line("A_0", "id", 5, 5, ran=True, count=2)
    progress.batch_starts()
    progress.line("A_1", "id", 2, 5, ran=True, count=2)
    first, second, last = capsys.readouterr().err.splitlines()
    assert first.startswith("evaluate A_0 id: 3/5 tasks (3 from the cache); played 0 of 4 in ")
    assert first.endswith("; time left known after the first batch")
    assert re.fullmatch(r"evaluate A_0 id: 5/5 tasks \(2 played\); played 2 of 4 in \d+ s; about \d+ s left", second)
    assert last.startswith("evaluate A_1 id: 2/5 tasks (2 played); played 4 of 4 in ") and last.endswith(
        "; none left to play"
    )
