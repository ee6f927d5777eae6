"""Running: the command line every script shares (cli), the runner that decides and makes
each run (runner, run_data), a script's scaffold (script), the reports it writes (report)
and a reproducer's runs against the committed ones (compare)."""
