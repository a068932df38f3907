"""The endpoint engine: any OpenAI-compatible server that returns prompt log-probs, with
nothing of kldtool's on it (engine.py), through a client that behaves on a shared server
(client.py). Its KLD is a lower bound; docs/endpoint.md says what is exact and why."""
