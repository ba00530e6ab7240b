"""vLLM's request-length check and output limit — copied for the tests.

Source: vllm-project/vllm v0.11.0 (the spec's default engine image), Apache-2.0 (SPDX-License-Identifier:
Apache-2.0, Copyright contributors to the vLLM project):
- vllm/entrypoints/openai/protocol.py: the request models' max_tokens defaults (chat None, completion 16);
- vllm/entrypoints/openai/serving_engine.py, OpenAIServing._validate_input: the two length checks (a chat request
  reads `max_completion_tokens or max_tokens`, a completion `max_tokens`);
- vllm/entrypoints/utils.py, get_max_tokens: the tokens a request may generate, where `default_max_tokens` is the
  engine's default sampling params' max_tokens — `--override-generation-config {"max_new_tokens": N}` with
  `--generation-config vllm` makes it N (vllm/config/model.py, ModelConfig.get_diff_sampling_param);
  current_platform.get_max_output_tokens is unbounded on CUDA.
"""

from __future__ import annotations


# vllm/entrypoints/openai/protocol.py: ChatCompletionRequest.max_tokens / max_completion_tokens default None;
# CompletionRequest.max_tokens defaults to 16 (and serving_completion.py asserts it is not None)
COMPLETION_DEFAULT_MAX_TOKENS = 16


def requested_max_tokens(body: dict, chat: bool = True) -> int | None:
    """The max_tokens the engine's request model reads from a JSON body."""
    if chat:
        return body.get("max_completion_tokens") or body.get("max_tokens")
    return body.get("max_tokens", COMPLETION_DEFAULT_MAX_TOKENS)


def validate_input(token_num: int, max_tokens: int | None, max_model_len: int) -> None:
    """Raises ValueError (the engine's 400) as _validate_input does."""
    if token_num >= max_model_len:
        raise ValueError(
            f"This model's maximum context length is {max_model_len} tokens. However, your request has "
            f"{token_num} input tokens. Please reduce the length of the input messages.")
    if max_tokens is not None and token_num + max_tokens > max_model_len:
        raise ValueError(
            "'max_tokens' or 'max_completion_tokens' is too large: "
            f"{max_tokens}. This model's maximum context length is {max_model_len} tokens and your request has "
            f"{token_num} input tokens ({max_tokens} > {max_model_len} - {token_num}).")


def get_max_tokens(max_model_len: int, max_tokens: int | None, input_length: int, default_max_tokens: int | None) -> int:
    return min(v for v in (max_model_len - input_length, max_tokens, default_max_tokens) if v is not None)


def default_max_num_batched_tokens(device_memory_bytes: int, device_name: str) -> int:
    """vllm/engine/arg_utils.py EngineArgs._set_default_args (0.11.0), the OpenAI server's default step budget."""
    GiB_bytes = 1 << 30
    if device_memory_bytes >= 70 * GiB_bytes and "a100" not in device_name.lower():
        return 8192
    return 2048
