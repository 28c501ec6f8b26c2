# Issue 32 in Python: the lineup presets and config readers (MLA, DSA indexer, recurrent
# states, shared-KV and cache-less layers), kv_cache_dtype, and bad options raising.
import json
import pathlib

import pytest

import kvmm

DATA = pathlib.Path(__file__).resolve().parents[1] / "data"


def test_mla_and_indexer_presets():
    lay = kvmm.presets.by_name("deepseek-v3.2", tokens_per_page=64, kv_cache_dtype="fp8_ds_mla",
                               max_large_page_bytes=128 << 20)
    mla, idx = lay.group(0), lay.group(1)
    assert mla.storage == kvmm.KvStorage.LATENT and mla.rope_dim == 64
    assert idx.storage == kvmm.KvStorage.KEY_ONLY and idx.tied_to == "mla"
    assert mla.bytes_per_token() == 61 * 656  # 512 e4m3 + 4 fp32 scales + 64 bf16
    assert idx.bytes_per_token() == 61 * 132
    assert lay.v_offset(0, 3) == lay.k_offset(0, 3)
    assert not lay.padded
    assert "fp8_e4m3+fp32/128" in mla.k_format
    with pytest.raises(kvmm.Error, match="PresetOptions.kv_cache_dtype = 'fp9'"):
        kvmm.presets.by_name("deepseek-v3", kv_cache_dtype="fp9")


def test_recurrent_state_preset_and_state_heavy_names():
    lay = kvmm.presets.by_name("qwen3-next-80b-a3b", max_large_page_bytes=128 << 20)
    state = lay.group(1)
    assert state.is_state()
    assert [t[0] for t in state.state_tensors] == ["conv", "recurrent"]
    assert state.state_bytes_per_layer == (8192 * 3 + 32 * 128 * 128) * 2
    assert lay.state_tensor_offset(1, 2, 1) == 2 * state.state_bytes_per_layer + 8192 * 3 * 2
    assert "nemotron-h-56b" in kvmm.presets.state_heavy_names()
    assert "nemotron-h-56b" not in kvmm.presets.names()


def test_planner_fits_tokens_per_page_instead_of_padding():
    # Qwen3-Next at the default 64 MiB limit: 8-token attention pages, one state page per
    # large page, nothing padded; KVLayout.plan(fit_tokens_per_page=False) pads 16-token ones.
    lay = kvmm.presets.by_name("qwen3-next-80b-a3b")
    assert lay.tokens_per_page_fitted and not lay.padded
    assert lay.group(0).tokens_per_page == 8 and lay.requested_tokens_per_page(0) == 16
    assert lay.large_page_bytes == lay.small_page_bytes(1) == 39518208
    assert lay.small_pages_per_large_page(0) == 201
    asked = [lay.group(g) for g in range(lay.num_groups)]
    asked[0].tokens_per_page = 16
    padded = kvmm.KVLayout.plan(asked, fit_tokens_per_page=False)
    assert padded.padded and padded.group(0).tokens_per_page == 16
    assert kvmm.KVLayout.plan(asked).group(0).tokens_per_page == 8


def test_planner_bounds_state_pages_per_large_page():
    # Jamba-1.5-Mini: 133 16-token attention pages = 4 Mamba states per 33.25 MiB large page;
    # max_state_pages_per_large_page=2 fits 8-token pages, 2 states per 16.6 MiB (issue 34).
    # 2 is the default: the preset plans 8-token pages; 0 turns the bound off.
    lay = kvmm.presets.by_name("jamba-1.5-mini")
    assert lay.tokens_per_page_fitted and lay.group(0).tokens_per_page == 8
    assert lay.small_pages_per_large_page(1) == 2 and lay.large_page_bytes == 17432576
    groups = [lay.group(g) for g in range(lay.num_groups)]
    groups[0].tokens_per_page = lay.requested_tokens_per_page(0)  # the preset's 16
    plain = kvmm.KVLayout.plan(groups, max_state_pages_per_large_page=0)
    assert not plain.tokens_per_page_fitted and plain.group(0).tokens_per_page == 16
    assert plain.small_pages_per_large_page(1) == 4 and plain.large_page_bytes == 34865152
    for two in (kvmm.KVLayout.plan(groups, max_state_pages_per_large_page=2), kvmm.KVLayout.plan(groups)):
        assert two.tokens_per_page_fitted and not two.padded
        assert two.group(0).tokens_per_page == 8 and two.group(1).tokens_per_page == 512
        assert two.small_pages_per_large_page(1) == 2 and two.large_page_bytes == 17432576
    # One state needs 4-token pages, under the default floor of 8: the plain plan.
    assert kvmm.KVLayout.plan(groups, max_state_pages_per_large_page=1).large_page_bytes == 34865152


def test_lineup_configs_place_every_layer():
    gemma = kvmm.read_hf_config_file(str(DATA / "gemma-3n-e4b.defaults.json"))
    roles = [p.role for p in gemma.layers]
    assert roles.count(kvmm.LayerRole.SHARED_KV) == 15
    assert gemma.layers[24].kv_owner == 19 and gemma.layers[24].group == gemma.layers[19].group
    ds = kvmm.read_hf_config_file(str(DATA / "deepseek-v3.2.config.json"))
    assert ds.layers[5].aux_group == 1 and ds.layers[5].aux_index == 5
    assert ds.attention[0].kv_lora_rank == 512 and ds.attention[0].v_head_dim == 128
    llama = kvmm.read_hf_config(json.dumps({"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4,
                                            "hidden_size": 256}), kv_cache_dtype="fp8")
    assert llama.layers[0].aux_group is None
    assert llama.layout.group(0).bytes_per_token() == 2 * 2 * 4 * 64
    with pytest.raises(kvmm.Error, match="malformed JSON"):
        kvmm.read_hf_config_file(str(DATA / "nemotron-h-56b-base-8k.config.json"))
    nemo = kvmm.read_hf_config_file(str(DATA / "nemotron-h-56b-base-8k.config.json"), python_literals=True,
                                    max_large_page_bytes=1 << 30)
    assert sum(p.role == kvmm.LayerRole.NO_CACHE for p in nemo.layers) == 54
