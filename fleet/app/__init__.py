"""The application around a run, for the command line (and the demo): the run's history, summary.json,
report.html and metrics, what the terminal shows (the progress line, the report), the signals that cut a run
short, and the process's file limit and garbage collector's pace while it runs. The core it wraps
(`fleet.engine.run.run`) touches none of these."""
