"""Make a compressed-tensors W8A8 (int8 weights per channel, dynamic int8 activations per token)
copy of a transformers model, data-free, with llm-compressor. Runs in the separate environment
made by scripts/quant/setup.sh (llm-compressor needs another compressed-tensors than vLLM pins).

    .venv-quant/bin/python scripts/quant/make_w8a8.py SRC_DIR DST_DIR
"""

import os
import shutil
import sys


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src, dtype="auto")
    tokenizer = AutoTokenizer.from_pretrained(src)
    recipe = QuantizationModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"])
    oneshot(model=model, recipe=recipe)
    tmp = f"{dst}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, save_compressed=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(tmp, dst)
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
