"""The engine: a run from targeted hosts to its report. `run` (one run, end to end), `graph` (every host's task
within the run's bounds: options, deadline, gate), `walk` (one host's steps, its progress `HostRun` and the `Mode`),
`waves`, `interrupts`, `schedulers` (the scheduler plugs' registry) and `run_folder` (the run's log folder and its
liveness lock)."""
