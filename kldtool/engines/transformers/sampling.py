"""``kldtool generate`` through transformers (contract.py's Sampler): the chat side is hf_chat.py's,
and each answer is ``model.generate``'s with every sampling setting given explicitly (a
checkpoint's generation_config.json would otherwise bring its own top_k, temperature or
repetition penalty)."""

from __future__ import annotations

import numpy as np

from kldtool.engines.contract import Sampling
from kldtool.engines.hf_chat import HfChat


class Sampler(HfChat):
    """TransformersEngine's Sampler methods (a base class of it)."""

    samples_per_call = 1

    def stop_ids(self) -> list[int]:
        """The ids that end a turn: the generation config's end-of-sequence ids, else the tokenizer's."""
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return [] if eos is None else [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]

    def sample(self, prompts: list[np.ndarray], s: Sampling, seeds: list[int]) -> list[tuple[np.ndarray, str]]:
        return [self._one(p, s, seed) for p, seed in zip(prompts, seeds)]

    def _one(self, prompt: np.ndarray, s: Sampling, seed: int) -> tuple[np.ndarray, str]:
        import torch
        from transformers import GenerationConfig

        stops = self.stop_ids()
        greedy = s.temperature == 0
        config = GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else s.temperature,
            top_p=None if greedy else s.top_p,
            top_k=None if greedy else s.top_k,
            min_p=None if greedy or not s.min_p else s.min_p,
            repetition_penalty=1.0,
            max_new_tokens=s.max_tokens,
            eos_token_id=stops or None,
            pad_token_id=stops[0] if stops else None,
        )
        ids = torch.as_tensor(np.asarray(prompt, dtype=np.int64), device=self.device)[None]
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
        new = out[0, ids.shape[1] :].cpu().numpy().astype(np.int64)
        return new, "stop" if len(new) and int(new[-1]) in stops else "length"
