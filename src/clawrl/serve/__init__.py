"""Loop 1: the OpenAI-compatible server."""
