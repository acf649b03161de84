"""`seal chaos`: a soak of the real `seal train` pipeline under a seeded random schedule of faults
(docs/reliability.md)."""
