"""nsa.Config on a CPU-only machine: presets, keyword overrides validated with the
field named, JSON/TOML round trips, the kernel set, and baking it into the kernel
cache with NVRTC (no GPU), honouring NSA_CACHE_DIR and NSA_JIT=off."""

import pytest

import nsa


def test_default_preset_and_fields():
    cfg = nsa.Config()
    assert (cfg.num_q_heads, cfg.topk, cfg.page_size, cfg.kv_cache) == (128, 2048, 64, "fp8")
    assert cfg.targets == ["sm_90a", "sm_100a"]
    assert "h=128" in repr(cfg) and cfg.summary() in repr(cfg)
    assert [name for name, _ in nsa.Config.presets()][0] == "deepseek-v3.2"
    assert nsa.Config("deepseek-v3.2-tp8").num_q_heads == 16


def test_overrides_apply_before_validation():
    cfg = nsa.Config("deepseek-v3.2-tp8", topk=1024, kv_cache="bf16", targets=["sm_90a"], page_size=1)
    assert (cfg.topk, cfg.kv_cache, cfg.targets, cfg.page_size) == (1024, "bf16", ["sm_90a"], 1)
    assert cfg.replace(topk=512).topk == 512 and cfg.topk == 1024
    assert cfg == nsa.Config.from_text(cfg.to_json()) and cfg != cfg.replace(topk=512)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(topk=100), ValueError, r"topk"),
        (dict(num_q_heads=12), ValueError, r"num_q_heads"),
        (dict(topk="many"), ValueError, r"`topk`: invalid type"),
        (dict(kv_cache="fp4"), ValueError, r"`kv_cache`"),
        (dict(targets=["sm_90a", "sm_90a"]), ValueError, r"targets"),
        (dict(top_k=2048), TypeError, r"unknown config field `top_k` \(did you mean `topk`\?\)"),
        (dict(topk=object()), TypeError, r"config overrides"),
    ],
)
def test_bad_overrides_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        nsa.Config(**kwargs)


def test_bad_presets_and_texts_are_named():
    with pytest.raises(ValueError, match=r"deepseek-v3\.2-tp8"):
        nsa.Config("deepseek-v3.2-tp9")
    with pytest.raises(ValueError, match=r"empty"):
        nsa.Config.from_text("  ")
    with pytest.raises(ValueError, match=r"did you mean `page_size`"):
        nsa.Config.from_text('{"page_sise": 64}')
    toml = 'page_size = 64\ntopk = 2048\nnum_q_heads = 32\nkv_cache = "fp8"\ntargets = ["sm_100a"]\n'
    assert nsa.Config.from_text(toml, topk=256).topk == 256


def test_kernel_ids():
    cfg = nsa.Config("deepseek-v3.2-tp8", targets=["sm_90a"])
    ids = cfg.kernel_ids()
    assert ids and all(i.endswith(".sm_90a") for i in ids)
    assert any(i.startswith("kv_store.fp8_656") for i in ids)
    assert len(cfg.kernel_ids(deterministic_topk=True)) > len(ids)


def test_compile_bakes_the_cache_and_reads_it_back(tmp_path, monkeypatch):
    monkeypatch.setenv("NSA_CACHE_DIR", str(tmp_path / "cache"))
    cfg = nsa.Config("deepseek-v3.2-tp8", targets=["sm_90a"])
    first = cfg.compile(only=["kv_store.*"])
    assert [r["id"] for r in first] == ["kv_store.fp8_656.sm_90a"]
    assert first[0]["origin"] == "compiled" and first[0]["target"] == "sm_90a" and first[0]["ms"] > 0
    again = cfg.compile(only=["kv_store.*"])
    assert again[0]["origin"] == "disk"
    monkeypatch.setenv("NSA_JIT", "off")
    assert cfg.compile(only=["kv_store.*"])[0]["origin"] == "disk"
    monkeypatch.setenv("NSA_CACHE_DIR", str(tmp_path / "empty"))
    with pytest.raises(RuntimeError, match=r"NSA_JIT=off"):
        cfg.compile(only=["kv_store.*"])


def test_compile_selection_is_checked():
    with pytest.raises(ValueError, match=r"`only`"):
        nsa.Config().compile(only=["no_such_kernel*"])
