"""The tool-call family (DESIGN §9): generated math problems with exactly checked answers
(problems.py), solved with a sandboxed `python` tool (env.py)."""
