"""A run's log folder: its name and place (`folder`: run ids, the default folder, whether a run is still going)
and the per-node JSONL logs written in it (`jsonl`). Below the engine, which writes them, and the history, which
reads them back."""
