"""``kldtool recipe``: the per-tensor types that meet a size or KLD target, chosen from measured
costs, built with llama.cpp's own quantize parameters and checked.

``candidates.py`` builds the source at every asked type (``--pure``) and reads what llama.cpp
wrote for each tensor and its bytes; ``layer_reuse.py`` lets a forward start at one decoder
layer from the base run's stored inputs; ``costs.py`` measures each tensor's leave-one-in KLD
at each written type, kept by ``cost_cache.py`` so a killed run resumes; ``knapsack.py`` picks
one type a tensor at the least predicted KLD for every size (the frontier); ``rounds.py`` builds
the chosen recipe, measures it and corrects the prediction; ``outputs.py`` writes the files.
"""
