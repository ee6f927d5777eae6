"""Running: the command line every script shares (cli), whether each run's record is
taken or made (taking), the runner that makes it (runner, run_data), a script's scaffold
(script), the reports it writes (report) and a reproducer's runs against the committed
ones (compare)."""
