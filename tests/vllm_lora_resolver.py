"""vLLM's filesystem LoRA resolver, the check it makes before loading an adapter — copied for the tests.

Source: vllm-project/vllm v0.11.0 (the spec's default engine image), vllm/plugins/lora_resolvers/
filesystem_resolver.py, FilesystemResolver.resolve_lora, Apache-2.0 (SPDX-License-Identifier: Apache-2.0,
Copyright contributors to the vLLM project). The engine calls it with base_model_name = the engine's model
(vllm/entrypoints/openai/serving_models.py, OpenAIServingModels.resolve_lora: `self.model_config.model`), which is
the local path `vllm serve` was given. The same code at v0.13.0.
"""

from __future__ import annotations

import json
import os


def resolves(lora_cache_dir: str, base_model_name: str, lora_name: str) -> bool:
    """Whether the resolver returns a LoRARequest for `lora_name` (True) or None (the request gets a 404)."""
    lora_path = os.path.join(lora_cache_dir, lora_name)
    if os.path.exists(lora_path):
        adapter_config_path = os.path.join(lora_cache_dir, lora_name, "adapter_config.json")
        if os.path.exists(adapter_config_path):
            with open(adapter_config_path) as file:
                adapter_config = json.load(file)
            if adapter_config["peft_type"] == "LORA" and adapter_config["base_model_name_or_path"] == base_model_name:
                return True
    return False
