"""``kldtool attribute BASE QUANT``: which parts of a quant cause its divergence.

``units.py`` pairs the two models' parameters into units (decoder layers, or each linear tensor
in them) where the quant differs; ``layer_errors.py`` runs the base model once over the first
windows of a base file and measures, for each unit, the quant's version of it on the base
model's own inputs (relative RMS, cosine, SQNR of its output); ``kld.py`` measures the mean KLD
with one unit swapped in (leave-one-in) or restored (leave-one-out) through the engine's forward
and the reducers; ``run.py`` is one run of all that; ``keep.py`` turns the top units into the
lists llama-quantize and llm-compressor read.
"""
