"""Forwards that start at one decoder layer: a leave-one-in run of a tensor in layer L changes
nothing below L, so its windows' inputs to L are the base run's, stored once. The base run
records every layer's input per forward call; a later run with ``starting_at(L)`` has the
embedding's output replaced by the stored input to L and the model's layer list cut to L and
above, for calls made in the same order (the same windows in the same groups).

A model whose layers differ by kind (sliding and full attention: ``config.layer_types``) has
that list cut with them, as its forward indexes it by position."""

from __future__ import annotations

from contextlib import contextmanager

from kldtool.attribute.units import decoder_layer_owner


class LayerInputs:
    def __init__(self, model):
        self.model = model
        self.owner, self.attr = decoder_layer_owner(model)
        self.layers = list(getattr(self.owner, self.attr))
        self.calls: list[list] = []  # per forward call, per layer: its input hidden states

    @contextmanager
    def recording(self):
        def keep(i):
            def hook(module, args, kwargs):
                hidden = args[0] if args else kwargs["hidden_states"]
                if i == 0:
                    self.calls.append([])
                self.calls[-1].append(hidden.detach())

            return hook

        self.calls = []
        handles = [layer.register_forward_pre_hook(keep(i), with_kwargs=True) for i, layer in enumerate(self.layers)]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    @contextmanager
    def starting_at(self, layer: int):
        """Forwards from ``layer`` up on the stored inputs (layer 0: the plain model)."""
        import torch

        if layer == 0:
            yield
            return
        call = iter(range(len(self.calls)))
        config = self.model.config
        kinds = getattr(config, "layer_types", None)

        def replace(module, args, output):
            return self.calls[next(call)][layer]

        hook = self.model.get_input_embeddings().register_forward_hook(replace)
        setattr(self.owner, self.attr, torch.nn.ModuleList(self.layers[layer:]))
        if kinds is not None:
            config.layer_types = list(kinds)[layer:]
        try:
            yield
        finally:
            hook.remove()
            setattr(self.owner, self.attr, torch.nn.ModuleList(self.layers))
            if kinds is not None:
                config.layer_types = kinds

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for call in self.calls for t in call)
