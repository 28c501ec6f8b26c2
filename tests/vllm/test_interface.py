"""Interface drift: every member of vLLM's KV cache manager that the pinned vLLM's schedulers
use (self.kv_cache_manager.<member> in scheduler.py and async_scheduler.py, parsed with ast)
is implemented by kvmm's adapter or listed in UNSUPPORTED with its feature; every keyword a
call passes is a parameter of the adapter's method; unsupported members raise."""

import ast
import inspect
import pathlib

import pytest
import vllm
import vllm.v1.core.sched.async_scheduler as async_sched_mod
import vllm.v1.core.sched.scheduler as sched_mod

from kvmm.integrations import vllm as kv_vllm
from harness import kv_cache_config


def manager_uses(path: pathlib.Path):
    """{member: [keyword names of each call]} for self.kv_cache_manager.<member>."""
    tree = ast.parse(path.read_text())
    uses: dict[str, list[set[str]]] = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                and node.value.attr == "kv_cache_manager" and isinstance(node.value.value, ast.Name)
                and node.value.value.id == "self"):
            uses.setdefault(node.attr, [])
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in uses:
            base = node.func.value
            if isinstance(base, ast.Attribute) and base.attr == "kv_cache_manager":
                uses[node.func.attr].append({k.arg for k in node.keywords if k.arg})
    return uses


SOURCES = [pathlib.Path(sched_mod.__file__), pathlib.Path(async_sched_mod.__file__)]


def all_uses():
    merged: dict[str, list[set[str]]] = {}
    for src in SOURCES:
        for name, calls in manager_uses(src).items():
            merged.setdefault(name, []).extend(calls)
    return merged


def test_pinned_version():
    assert vllm.__version__ == kv_vllm.VLLM_VERSION


def test_every_member_is_implemented_or_listed():
    uses = all_uses()
    assert len(uses) >= 20, f"the parse found only {sorted(uses)}: scheduler.py changed shape"
    mgr = kv_vllm.KvmmKVCacheManager(kv_cache_config(num_blocks=16), max_model_len=256)
    missing = []
    for name in sorted(uses):
        if name in kv_vllm.UNSUPPORTED:
            with pytest.raises(NotImplementedError, match=name):
                getattr(mgr, name)
            continue
        try:
            getattr(mgr, name)
        except (AttributeError, NotImplementedError):
            missing.append(name)
    assert not missing, f"vLLM {vllm.__version__}'s scheduler uses members kvmm neither implements nor lists: {missing}"
    # Nothing listed that the scheduler no longer uses (the list stays honest).
    assert set(kv_vllm.UNSUPPORTED) <= set(uses), set(kv_vllm.UNSUPPORTED) - set(uses)


def test_call_keywords_match_the_adapter():
    mgr = kv_vllm.KvmmKVCacheManager(kv_cache_config(num_blocks=16), max_model_len=256)
    for name, calls in all_uses().items():
        if name in kv_vllm.UNSUPPORTED:
            continue
        member = getattr(mgr, name)
        if not callable(member):
            continue
        params = inspect.signature(member).parameters
        for keywords in calls:
            assert keywords <= set(params), f"{name}: vLLM passes {keywords - set(params)}"


def test_vllm_manager_methods_have_the_same_parameters():
    """The adapter's methods take the parameters vLLM's own manager takes, in its order."""
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    for name in all_uses():
        ours = getattr(kv_vllm.KvmmKVCacheManager, name, None)
        theirs = getattr(KVCacheManager, name, None)
        if not (inspect.isfunction(ours) and inspect.isfunction(theirs)):
            continue
        assert list(inspect.signature(ours).parameters) == list(inspect.signature(theirs).parameters), name


def test_a_kv_connector_is_bound_to_kvmm(tmp_path):
    """vLLM binds a KV connector to the manager its __init__ made; kvmm's scheduler binds it
    again to kvmm's (whose block_pool raises on use: kvmm has no BlockPool). With async
    scheduling a KV consumer defers block frees into vLLM's BlockPool: refused at
    construction, with the feature named, rather than midway through a run."""
    import pytest

    from harness import Setup, make_scheduler

    ex = dict(kv_connector="ExampleConnector", kv_role="kv_both",
              kv_connector_extra_config={"shared_storage_path": str(tmp_path)})
    sched = make_scheduler(Setup(num_blocks=48, kv_transfer=ex), kvmm=True)
    assert sched.connector._kv_cache_manager is sched.kv_cache_manager
    with pytest.raises(NotImplementedError, match="BlockPool.free_blocks"):
        sched.kv_cache_manager.block_pool.free_blocks([])
    assert make_scheduler(Setup(num_blocks=48, kv_transfer=ex, async_scheduling=True), kvmm=False).defer_block_free
    with pytest.raises(NotImplementedError, match="deferred block frees"):
        make_scheduler(Setup(num_blocks=48, kv_transfer=ex, async_scheduling=True), kvmm=True)
