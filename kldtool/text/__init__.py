"""The text-to-windows chain: a corpus read and tokenized (corpus.py, WikiText's own layout in
wikitext.py), cut into each protocol's windows and scored positions (protocols.py), in the order
a run visits them (window_order.py)."""
