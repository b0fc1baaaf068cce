"""The package's folders say what the README says: the core at the top, fast/ and kit/ beside it, and every
public name still reachable where users reach it (``mt.Trainer``, ``mt.tokenizers``, ``import minitransformer.train``)."""

import importlib

import minitransformer as mt
from minitransformer.kit.data import tokenizers
from minitransformer.kit.running import checkpoint, train


def test_kit_modules_keep_their_public_names():
    assert mt.tokenizers is tokenizers and mt.checkpoint is checkpoint and mt.train is train
    assert importlib.import_module("minitransformer.train") is train
    assert importlib.import_module("minitransformer.tokenizers") is tokenizers
    assert mt.Trainer is train.Trainer and mt.BPETokenizer is tokenizers.BPETokenizer
    assert mt.viz is importlib.import_module("minitransformer.kit.running.viz")


def test_neither_tier_imports_the_kit():
    import ast
    import pathlib

    root = pathlib.Path(mt.__file__).parent
    tiers = [p for p in root.glob("*.py") if p.stem not in ("__init__", "__main__")]
    tiers += list((root / "layers").glob("*.py")) + list((root / "fast").glob("*.py"))
    for path in tiers:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                target = ("." * node.level) + (node.module or "")
                assert "kit" not in target.split("."), f"{path.name} imports {target}"
