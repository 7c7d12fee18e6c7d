"""The terminal family (DESIGN §9): task folders in terminal-bench / Harbor's layout, verified by
their `tests/test.sh`, solved in a persistent sandboxed shell (env.py); tasks.py writes the
built-in tasks."""
