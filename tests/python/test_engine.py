# The Python engine example (examples/python/engine.py) end to end: chunked prefill, prefix
# hits, swap and recompute preemption, FlashInfer-format tables; every output must equal a
# dense recompute of the same model without kvmm.
import importlib.util
import pathlib

import pytest

import conftest

spec = importlib.util.spec_from_file_location("engine", conftest.ROOT / "examples" / "python" / "engine.py")
engine = importlib.util.module_from_spec(spec)
spec.loader.exec_module(engine)


@pytest.mark.parametrize("args", [
    ["--host-pages", "6"],                          # swap and recompute preemptions
    ["--host-pages", "0", "--large-pages", "30"],   # recompute only
    ["--large-pages", "200", "--token-budget", "7"],  # no preemption, small chunks
])
def test_engine_matches_dense_recompute(args, capsys):
    assert engine.main(["--build", str(conftest.BUILD), "--check", "--requests", "18"] + args) == 0
    out = capsys.readouterr().out
    assert "every output equals a dense recompute" in out
    if args == ["--host-pages", "6"]:
        assert "0 swap," not in out and " 0 recompute" not in out
