"""The python engine: a user's factory of a model and a tokenizer (engine.py), the smallest
complete engine and the one docs/design.md's "Adding an engine" copies."""
