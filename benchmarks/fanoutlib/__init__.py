"""The pieces of benchmarks/fanout.py: the testbed (simulated nodes behind real OpenSSH sshd), the process
bookkeeping and the `_measure` wrapper, the raw asyncssh floor, the replay of fleet's logged commands for
the other tools, the tool runs themselves (class Bench) and the summary. fanout.py is the entry point;
run it, not these modules."""
