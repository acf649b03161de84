"""weights/layer_names.py: a model's linear layers by name, from its safetensors headers."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from weights.layer_names import linear_layer_names


def test_linear_layers_are_the_2d_weights_less_embeddings_and_the_output_head(tmp_path):
    save_file(
        {
            "model.embed_tokens.weight": torch.zeros(8, 4),
            "model.layers.0.self_attn.q_proj.weight": torch.zeros(4, 4),
            "model.layers.0.self_attn.q_proj.bias": torch.zeros(4),
            "model.layers.0.input_layernorm.weight": torch.zeros(4),  # 1-D: a norm, not a linear layer
            "model.layers.0.mlp.experts.gate_up_proj": torch.zeros(2, 4, 8),  # fused experts: not .weight
        },
        str(tmp_path / "model-00001-of-00002.safetensors"),
    )
    save_file(
        {
            "model.layers.1.self_attn.q_proj.weight": torch.zeros(4, 4),
            "model.layers.1.mlp.down_proj.weight": torch.zeros(4, 4),
            "lm_head.weight": torch.zeros(8, 4),
        },
        str(tmp_path / "model-00002-of-00002.safetensors"),
    )
    assert linear_layer_names(tmp_path) == ["down_proj", "q_proj"]


def test_a_directory_without_weights_or_linear_layers_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        linear_layer_names(tmp_path)
    save_file({"model.norm.weight": torch.zeros(4)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="no linear layer"):
        linear_layer_names(tmp_path)
