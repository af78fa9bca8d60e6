"""Nemotron-Labs-Diffusion's model (``dare.models.nemotron_diffusion``): the official key names and shapes, and the
same logits as transformers' own Ministral-3 on the same weights, left to right and bidirectionally."""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModel, Ministral3Config, Ministral3ForCausalLM

from dare.models import NemotronDiffusionConfig, NemotronLabsDiffusionModel
from dare.models.nemotron_diffusion import tiny_config

# the released checkpoints' config.json fields known here (nvidia/Nemotron-Labs-Diffusion-3B: not its MLP width)
RELEASED = {
    "3B": {"hidden_size": 3072, "num_hidden_layers": 26, "num_attention_heads": 32, "num_key_value_heads": 8,
           "head_dim": 128, "vocab_size": 131072, "max_position_embeddings": 262144, "block_size": 32,
           "dlm_paradigm": "bidirectional", "mask_token_id": 100},
    "8B": {"hidden_size": 4096, "num_hidden_layers": 34, "num_attention_heads": 32, "num_key_value_heads": 8,
           "vocab_size": 131072, "intermediate_size": 14336, "max_position_embeddings": 262144, "block_size": 32,
           "dlm_paradigm": "bidirectional", "mask_token_id": 100, "attn_implementation": "sdpa", "use_cache": False,
           "auto_map": {"AutoConfig": "configuration_nemotron_labs_diffusion.NemotronLabsDiffusionConfig",
                        "AutoModel": "modeling_nemotron_labs_diffusion.NemotronLabsDiffusionModel"}},
}


def pair(seed: int = 0):
    """A tiny model and transformers' Ministral-3 causal LM holding the same weights (``encoder.`` -> ``model.``,
    ``diffusion_head`` -> ``lm_head``). The tiny config's llama-4 scaling starts at position 16, inside the inputs."""
    torch.manual_seed(seed)
    config = tiny_config(300, mask_token_id=299)
    model = NemotronLabsDiffusionModel(config).eval()
    fields = {k: v for k, v in config.to_dict().items() if k in Ministral3Config.__dataclass_fields__}
    reference = Ministral3ForCausalLM(Ministral3Config(**fields)).eval()
    renamed = {k.replace("encoder.", "model.").replace("diffusion_head", "lm_head"): v
               for k, v in model.state_dict().items()}
    reference.load_state_dict(renamed, strict=True)
    return model, reference


@pytest.mark.parametrize("size", sorted(RELEASED))
def test_the_released_configs_build_the_official_key_names_and_shapes(size):
    with torch.device("meta"):
        model = NemotronLabsDiffusionModel(NemotronDiffusionConfig(**RELEASED[size]))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    config = model.config
    assert config.head_dim == 128 and config.mask_token_id == 100 and config.block_size == 32
    per_layer = {"input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
                 "mlp.up_proj.weight", "mlp.down_proj.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                 "self_attn.v_proj.weight", "self_attn.o_proj.weight"}
    expected = {"encoder.embed_tokens.weight", "encoder.norm.weight", "diffusion_head.weight"} | {
        f"encoder.layers.{i}.{key}" for i in range(config.num_hidden_layers) for key in per_layer}
    assert set(shapes) == expected  # untied head, no lm_head
    assert shapes["encoder.layers.0.self_attn.k_proj.weight"] == (8 * 128, config.hidden_size)
    assert shapes["diffusion_head.weight"] == (131072, config.hidden_size)
    if size == "8B":
        total = sum(v.numel() for v in model.state_dict().values())
        print(f"8B: {total / 1e9:.2f}B parameters")
        assert 8.0e9 < total < 9.0e9


def test_left_to_right_and_bidirectional_logits_equal_ministral3_on_the_same_weights():
    model, reference = pair()
    ids = torch.randint(0, 299, (2, 40))
    with torch.no_grad():
        causal = model(input_ids=ids, causal=True).logits
        bidirectional = model(input_ids=ids).logits
        expected_causal = reference(input_ids=ids).logits
        everything = torch.zeros(2, 1, 40, 40)  # a 4-D additive mask that hides nothing
        expected_bidirectional = reference.lm_head(reference.model(input_ids=ids, attention_mask=everything)[0])
    # two mask paths (DARE's, transformers' own): 0.0 apart here; another CPU's kernels need not round them alike
    gaps = (causal - expected_causal).abs().max(), (bidirectional - expected_bidirectional).abs().max()
    print(f"causal {gaps[0]:.1e}, bidirectional {gaps[1]:.1e} from Ministral3")
    assert max(gaps) <= 1e-6
    assert (causal - bidirectional).abs().max() > 0.1  # the two readings differ (a mode switch that did nothing fails)


def test_the_llama4_query_scaling_is_applied_from_each_tokens_position():
    """Past ``original_max_position_embeddings`` (16 here) queries are scaled by 1 + beta log(1 + floor(p / 16)):
    a reference without it agrees up to position 15 and differs after."""
    model, reference = pair()
    reference.config.rope_parameters["llama_4_scaling_beta"] = 0.0
    ids = torch.randint(0, 299, (1, 40))
    with torch.no_grad():
        ours, unscaled = model(input_ids=ids, causal=True).logits, reference(input_ids=ids).logits
    gap = (ours - unscaled).abs().amax(-1)[0]
    print(f"gap before position 16 {gap[:16].max():.1e}, from 16 on at least {gap[16:].min():.1e}")
    assert gap[:16].max() <= 1e-6 and gap[16:].min() > 1e-5  # rounding is ~1e-7


def test_padding_changes_no_real_tokens_logits_either_way():
    model, _ = pair(1)
    ids = torch.randint(0, 299, (1, 24))
    padded = torch.cat([torch.zeros(1, 5, dtype=torch.long), ids], 1)
    mask = torch.cat([torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 24, dtype=torch.long)], 1)
    with torch.no_grad():
        for causal in (False, True):
            alone = model(input_ids=ids, causal=causal).logits
            inside = model(input_ids=padded, attention_mask=mask, causal=causal).logits[:, 5:]
            torch.testing.assert_close(inside, alone, atol=1e-5, rtol=1e-5)


def test_an_official_config_json_loads_through_the_auto_classes_and_the_weights_round_trip(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "nemotron_labs_diffusion",
                                                      "architectures": ["NemotronLabsDiffusionModel"],
                                                      **RELEASED["8B"]}))
    config = AutoConfig.from_pretrained(tmp_path)
    assert type(config) is NemotronDiffusionConfig and config.num_hidden_layers == 34
    assert config.rope_parameters["rope_type"] == "yarn" and config.rope_parameters["factor"] == 16.0
    model, _ = pair(2)
    model.save_pretrained(tmp_path / "tiny")
    again = AutoModel.from_pretrained(tmp_path / "tiny").eval()
    ids = torch.randint(0, 299, (1, 20))
    with torch.no_grad():
        assert type(again) is NemotronLabsDiffusionModel
        assert torch.equal(again(input_ids=ids).logits, model(input_ids=ids).logits)
