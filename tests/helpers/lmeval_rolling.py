"""The outside reference of ``--protocol rolling``: lm-evaluation-harness itself, run in its own
environment (.venv-lmeval, scripts/lmeval/setup.sh).

    .venv-lmeval/bin/python tests/helpers/lmeval_rolling.py MODEL_DIR MAX_LENGTH DTYPE RUNS.json OUT.json

RUNS.json holds named runs, each a list of pages and whether to detokenize them. For each run,
as lm-eval's ``wikitext`` task does: each page (after the task's detokenizer, if asked) is
scored by the Hugging Face model class's ``loglikelihood_rolling``, the task's
``process_results`` counts words and bytes, and lm-eval's aggregations give word perplexity,
byte perplexity and bits per byte. Also written: the prefix token, the max length, each text's
token ids, and the (context, continuation) windows of ``get_rolling_token_windows`` made
disjoint, for documents of 0-29 tokens (ids 100, 101, ...) and a max length of 8.
"""

from __future__ import annotations

import json
import sys


def main(model_dir: str, max_length: str, dtype: str, runs_path: str, out_path: str) -> None:
    from lm_eval.api.instance import Instance
    from lm_eval.api.metrics import bits_per_byte, weighted_perplexity
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks.wikitext.preprocess_wikitext import process_results, wikitext_detokenizer
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    def layout(n: int, length: int, prefix: int) -> list:
        return [
            [a, b]
            for a, b in map(
                make_disjoint_window,
                get_rolling_token_windows(
                    token_list=list(range(100, 100 + n)), prefix_token=prefix, max_seq_len=length, context_len=1
                ),
            )
        ]

    runs = json.load(open(runs_path))
    lm = HFLM(pretrained=model_dir, max_length=int(max_length), batch_size=1, device="cpu", dtype=dtype)
    out = {
        "prefix_token_id": lm.prefix_token_id,
        "max_length": lm.max_length,
        "synthetic_layouts": {str(n): layout(n, 8, lm.prefix_token_id) for n in range(0, 30)},
        "runs": {},
    }
    for name, run in runs.items():
        counted = run["pages"]
        texts = [wikitext_detokenizer({"page": p}) for p in counted] if run["detokenize"] else counted
        reqs = [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)]
        lls = [float(x) for x in lm.loglikelihood_rolling(reqs, disable_tqdm=True)]
        per = [process_results({"page": c}, (ll,)) for ll, c in zip(lls, counted)]
        out["runs"][name] = {
            "loglikelihoods": lls,
            "ids": [lm.tok_encode(t) for t in texts],
            "texts": texts,
            "word_perplexity": weighted_perplexity([p["word_perplexity"] for p in per]),
            "byte_perplexity": weighted_perplexity([p["byte_perplexity"] for p in per]),
            "bits_per_byte": bits_per_byte([p["bits_per_byte"] for p in per]),
        }
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
