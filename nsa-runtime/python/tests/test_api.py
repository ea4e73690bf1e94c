"""The package as a CPU-only machine sees it: it imports, exposes the documented
functions with the documented signatures, and refuses every bad argument with the
named error before anything reaches a GPU. Arrays are numpy's, over DLPack."""

import inspect
import os

import numpy as np
import pytest

import nsa
from nsa import _nsa
from nsa.compat import sgl_kernel

ROWS, KEYS, K = 4, 4096, 2048


def good():
    """Arguments that pass every check but the device one (numpy lives on the CPU)."""
    return dict(
        score=np.zeros((ROWS, KEYS), np.float32),
        lengths=np.full(ROWS, KEYS, np.int32),
        out=np.zeros((ROWS, K), np.int32),
    )


def test_version_and_exports():
    assert nsa.__version__ == _nsa.__version__
    assert {"topk", "cache_stats", "compat", "__version__"} <= set(nsa.__all__)
    # Only a launch opens a device: every call here is refused before one.
    assert nsa.cache_stats() == {}


@pytest.mark.parametrize(
    "name, params",
    [
        ("fast_topk_v2", ["score", "lengths", "topk", "row_starts"]),
        ("fast_topk_transform_fused", ["score", "lengths", "page_table_size_1", "cu_seqlens_q", "topk", "row_starts"]),
        ("fast_topk_transform_ragged_fused", ["score", "lengths", "topk_indices_offset", "topk", "row_starts"]),
    ],
)
def test_sgl_kernel_signatures_match(name, params):
    sig = inspect.signature(getattr(sgl_kernel, name))
    assert list(sig.parameters) == params
    assert sig.parameters["row_starts"].default is None
    assert all(sig.parameters[p].default is inspect.Parameter.empty for p in params[:-1])


def test_native_signature():
    sig = inspect.signature(_nsa.topk)
    assert list(sig.parameters)[:3] == ["score", "lengths", "out"]
    for keyword in ["row_starts", "page_table", "cu_seqlens_q", "page_size", "offsets", "deterministic", "stream"]:
        assert sig.parameters[keyword].kind is inspect.Parameter.KEYWORD_ONLY


def test_nvrtc_is_found_without_ld_library_path():
    lib = nsa._nvrtc_from_wheel()
    if lib is None:
        pytest.fail("the nvidia-cuda-nvrtc wheel (a dependency of nsa) is not installed")
    assert os.path.isfile(os.path.join(lib, "libnvrtc.so.13"))
    assert os.environ["NSA_NVRTC_PATH"]


def test_a_cpu_array_is_refused_by_device():
    with pytest.raises(ValueError, match=r"`score`: on cpu, expected a CUDA tensor"):
        _nsa.topk(**good())
    with pytest.raises(ValueError, match=r"`score`: on cpu"):
        sgl_kernel.fast_topk_v2(good()["score"], good()["lengths"], K)


@pytest.mark.parametrize(
    "arg, value, error, message",
    [
        ("score", np.zeros((ROWS, KEYS), np.float16), TypeError, r"`score`: dtype float16, expected float32 or bfloat16"),
        ("score", np.zeros((ROWS * KEYS,), np.float32), ValueError, r"`score`: shape \(16384,\) \(1 dimensions\), expected 2"),
        ("score", np.zeros((ROWS, 2 * KEYS), np.float32)[:, ::2], ValueError, r"`score`: strides \[8192, 2\]"),
        ("lengths", np.full(ROWS, KEYS, np.int64), TypeError, r"`lengths`: dtype int64, expected int32"),
        ("lengths", np.full(ROWS + 1, KEYS, np.int32), ValueError, r"`lengths`: shape \(5,\), expected \(4,\)"),
        ("lengths", np.full(2 * ROWS, KEYS, np.int32)[::2], ValueError, r"`lengths`: strides \[2\]"),
        ("out", np.zeros((ROWS + 1, K), np.int32), ValueError, r"`out`: shape \(5, 2048\), expected \(4, 2048\)"),
        ("out", np.zeros((ROWS, K), np.uint32), TypeError, r"`out`: dtype uint32, expected int32"),
        ("out", np.zeros((K, ROWS), np.int32).T, ValueError, r"`out`: strides"),
        ("score", "scores", TypeError, r"`score`: expected a tensor .* got str"),
        ("lengths", [KEYS] * ROWS, TypeError, r"`lengths`: expected a tensor .* got list"),
    ],
)
def test_bad_arguments_are_named(arg, value, error, message):
    args = good()
    args[arg] = value
    with pytest.raises(error, match=message):
        _nsa.topk(**args)


@pytest.mark.parametrize(
    "keyword, value, error, message",
    [
        ("row_starts", np.zeros(ROWS, np.float32), TypeError, r"`row_starts`: dtype float32, expected int32"),
        ("offsets", np.zeros(ROWS - 1, np.int32), ValueError, r"`offsets`: shape \(3,\), expected \(4,\)"),
        ("page_table", np.zeros((ROWS, KEYS), np.int64), TypeError, r"`page_table`: dtype int64"),
        ("page_table", np.zeros(KEYS, np.int32), ValueError, r"`page_table`: shape \(4096,\) \(1 dimensions\)"),
        ("cu_seqlens_q", np.zeros(ROWS + 1, np.int32), ValueError, r"`cu_seqlens_q`: given without `page_table`"),
    ],
)
def test_bad_optional_arguments_are_named(keyword, value, error, message):
    with pytest.raises(error, match=message):
        _nsa.topk(**good(), **{keyword: value})


def test_one_transform_at_a_time():
    with pytest.raises(ValueError, match=r"`offsets`: given with `page_table`"):
        _nsa.topk(**good(), page_table=np.zeros((ROWS, KEYS), np.int32), offsets=np.zeros(ROWS, np.int32))
    with pytest.raises(ValueError, match=r"`cu_seqlens_q`: 6 entries, expected 1 to 5"):
        _nsa.topk(**good(), page_table=np.zeros((ROWS, KEYS), np.int32), cu_seqlens_q=np.zeros(6, np.int32))
    # Fewer requests than table rows (a server's padded table): past the checks,
    # refused only for living on the CPU.
    with pytest.raises(ValueError, match=r"`score`: on cpu"):
        _nsa.topk(**good(), page_table=np.zeros((ROWS, KEYS), np.int32), cu_seqlens_q=np.zeros(3, np.int32))


def test_compat_functions_check_before_allocating():
    with pytest.raises(TypeError, match=r"`score`: expected a tensor"):
        sgl_kernel.fast_topk_transform_fused(None, None, None, None, K)
    with pytest.raises(ValueError, match=r"`score`: shape \(4096,\)"):
        sgl_kernel.fast_topk_transform_ragged_fused(np.zeros(KEYS, np.float32), None, None, K)


def params(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


E = inspect.Parameter.empty


def test_flash_mla_signatures_match():
    from nsa.compat import flash_mla

    assert params(flash_mla.flash_mla_with_kvcache) == [
        ("q", E), ("k_cache", E), ("block_table", E), ("cache_seqlens", E), ("head_dim_v", E),
        ("tile_scheduler_metadata", E), ("num_splits", None), ("softmax_scale", None), ("causal", False),
        ("is_fp8_kvcache", False), ("indices", None), ("attn_sink", None), ("extra_k_cache", None),
        ("extra_indices_in_kvcache", None), ("topk_length", None), ("extra_topk_length", None),
    ]
    assert params(flash_mla.flash_mla_sparse_fwd) == [
        ("q", E), ("kv", E), ("indices", E), ("sm_scale", E), ("d_v", 512), ("attn_sink", None), ("topk_length", None),
    ]
    meta, none = flash_mla.get_mla_metadata(np.zeros(3, np.int32), 64, 1)  # old-style arguments are accepted
    assert none is None and not meta.have_initialized and meta.config is None


def test_deep_gemm_signatures_match():
    from nsa.compat import deep_gemm

    assert params(deep_gemm.fp8_mqa_logits) == [
        ("q", E), ("kv", E), ("weights", E), ("cu_seqlen_ks", E), ("cu_seqlen_ke", E), ("clean_logits", True),
    ]
    assert params(deep_gemm.fp8_paged_mqa_logits) == [
        ("q", E), ("kv_cache", E), ("weights", E), ("context_lens", E), ("block_table", E), ("schedule_meta", E),
        ("max_context_len", E), ("clean_logits", E),
    ]
    assert params(deep_gemm.get_paged_mqa_logits_metadata) == [("context_lens", E), ("block_kv", E), ("num_sms", E)]


def test_what_the_compat_modules_do_not_implement_is_named():
    from nsa.compat import deep_gemm, flash_mla

    q = np.zeros((2, 1, 64, 576), np.float32)
    cache = np.zeros((4, 64, 1, 656), np.uint8)
    idx = np.zeros((2, 1, 2048), np.int32)
    meta, _ = flash_mla.get_mla_metadata()
    with pytest.raises(NotImplementedError, match=r"`indices`: None asks for dense decode"):
        flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta)
    for name in ["attn_sink", "extra_k_cache", "extra_indices_in_kvcache", "extra_topk_length"]:
        with pytest.raises(NotImplementedError, match=rf"`{name}`"):
            flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta, is_fp8_kvcache=True, indices=idx, **{name: q})
    with pytest.raises(NotImplementedError, match=r"`attn_sink`"):
        flash_mla.flash_mla_sparse_fwd(q[0], cache[0], idx, 0.1, attn_sink=q)
    with pytest.raises(ValueError, match=r"`is_fp8_kvcache`: False"):
        flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta, indices=idx)
    with pytest.raises(ValueError, match=r"`head_dim_v`: 576"):
        flash_mla.flash_mla_with_kvcache(q, cache, None, None, 576, meta, is_fp8_kvcache=True, indices=idx)
    with pytest.raises(TypeError, match=r"`tile_scheduler_metadata`"):
        flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, object(), is_fp8_kvcache=True, indices=idx)
    with pytest.raises(ValueError, match=r"`q`: on cpu"):
        flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta, is_fp8_kvcache=True, indices=idx)
    q4 = np.zeros((2, 2, 64, 128), np.uint8)
    with pytest.raises(ValueError, match=r"`context_lens`: shape \(2, 3\), expected \(2,\) or \(2, 2\)"):
        deep_gemm.fp8_paged_mqa_logits(q4, None, None, np.zeros((2, 3), np.int32), None, None, 4096, False)
    with pytest.raises(ValueError, match=r"`block_kv`: 32, expected 64"):
        deep_gemm.get_paged_mqa_logits_metadata(np.zeros(2, np.int32), 32, 132)
    with pytest.raises(TypeError, match=r"`kv`: ndarray, expected a tuple"):
        deep_gemm.fp8_mqa_logits(np.zeros((4, 64, 128), np.uint8), np.zeros(3), None, None, None)


@pytest.mark.parametrize(
    "fn, args, message",
    [
        ("sparse_prefill", "prefill", r"`q`: dtype float32, expected bfloat16"),
        ("indexer_ragged_logits", "ragged", r"`k`: shape \(10, 64\), expected \(10, 128\)"),
        ("indexer_paged_logits", "paged", r"`kv_cache`: shape \(3, 64, 1, 128\), expected \(3, 64, 1, 132\)"),
    ],
)
def test_native_functions_name_bad_arguments(fn, args, message):
    bf = np.zeros((8, 16, 576), np.float32)
    cases = {
        "prefill": ((bf, bf[:, :1], np.zeros((8, 1, 2048), np.int32), bf, bf[:, :, 0], bf[:, :, 0]), {"sm_scale": 0.1}),
        "ragged": (
            (np.zeros((4, 64, 128), np.uint8), np.zeros((10, 64), np.uint8), np.zeros(10, np.float32),
             np.zeros((4, 64), np.float32), np.zeros(4, np.int32), np.zeros(4, np.int32), np.zeros((4, 12), np.float32)),
            {},
        ),
        "paged": (
            (np.zeros((2, 1, 64, 128), np.uint8), np.zeros((3, 64, 1, 128), np.uint8), np.zeros((2, 64), np.float32),
             np.zeros(2, np.int32), np.zeros((2, 3), np.int32), np.zeros((2, 192), np.float32)),
            {},
        ),
    }
    positional, keywords = cases[args]
    with pytest.raises((TypeError, ValueError), match=message):
        getattr(_nsa, fn)(*positional, **keywords)


def test_layer_signatures():
    sig = inspect.signature(nsa.Layer)
    assert list(sig.parameters)[0] == "config"
    for keyword in ["pool_slots", "max_bs", "max_context_len", "draft_tokens", "batch_invariant", "device"]:
        assert sig.parameters[keyword].kind is inspect.Parameter.KEYWORD_ONLY
    assert list(inspect.signature(nsa.Layer.plan).parameters) == [
        "self", "mode", "req_to_token", "req_pool_indices", "seq_lens", "seq_lens_cpu", "extend_lens", "extend_lens_cpu",
    ]
    assert list(inspect.signature(nsa.Layer.forward).parameters)[1:] == [
        "plan", "q", "k_nope", "k_rope", "out_cache_loc", "index_q", "index_weights", "index_k", "kv_cache",
        "index_k_cache", "out", "lse",
    ]
    assert list(inspect.signature(nsa.Layer.mha_store).parameters)[1:] == [
        "plan", "k_nope", "k_rope", "out_cache_loc", "index_k", "kv_cache", "index_k_cache", "latent", "read_back",
    ]
    assert list(inspect.signature(nsa.Layer.mha_attend).parameters)[1:] == ["plan", "q", "k", "v", "out", "lse"]
    assert sig.parameters["mha_one_shot"].default is False
    assert nsa.MODES == ("decode", "target_verify", "draft_extend", "draft_extend_v2", "extend")


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        ({"pool_slots": 0}, ValueError, r"`pool_slots`: 0, expected ≥ 1"),
        ({"max_bs": 0}, ValueError, r"`max_bs`: 0, expected ≥ 1"),
        ({"prefill_backend": "fa3"}, ValueError, r"`prefill_backend`: \"fa3\", expected \"auto\""),
        ({"config": object()}, TypeError, r"config"),
    ],
)
def test_layer_arguments_are_checked_before_the_device(overrides, error, message):
    args = dict(config=nsa.Config(), pool_slots=4160, max_bs=4, max_context_len=4096)
    args.update(overrides)
    config = args.pop("config")
    with pytest.raises(error, match=message):
        nsa.Layer(config, **args)


def test_layer_without_a_stream_is_refused_after_the_checks():
    # No torch here: the wrapper finds no stream, and nsa says what it needs.
    with pytest.raises(ValueError, match=r"`stream`: None"):
        nsa.Layer(nsa.Config(), pool_slots=4160, max_bs=4, max_context_len=4096)
