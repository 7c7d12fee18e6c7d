"""General-agent environments (DESIGN §9).

Family-neutral, here: the protocol (protocol.py) and its HTTP shape (http.py), the tool-call
episode every family builds on (episode.py), the sandbox (sandbox/), the pool (pool.py), rollouts
(rollout.py, records.py, server.py), scripted policies (policies.py) and the families by name
(registry.py). One subpackage per family: toolcall/, terminal/, swe/, web/.
"""
