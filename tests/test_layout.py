"""The package's folders say what the README says: the core at the top, which imports with NumPy alone; fast/ and
kit/ beside it, loaded on first use; inside the kit, imports run one way (cli -> running -> data -> the kit's ground
floor, limits and files -> the tiers), with one name per module and no name imported from a module that does not
define it."""

import ast
import importlib
import json
import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import numpy
import pytest

import minitransformer as mt

ROOT = Path(mt.__file__).parent
KIT = ROOT / "kit"

# Each part of the package and its floor: a module imports modules of lower floors, and of its own folder.
FLOORS = {"core": 0, "fast": 0, "ground": 1, "data": 2, "running": 3, "classroom": 3, "cli": 4}


def part_of(module: str) -> str:
    parts = module.split(".")[1:]                           # after "minitransformer"
    if parts[:1] == ["fast"]:
        return "fast"
    if parts[:1] != ["kit"]:
        return "core"
    return parts[1] if parts[1:2] and parts[1] in FLOORS else "ground"     # kit/limits.py, kit/files.py


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports_of(path: Path) -> list:
    """Every ``minitransformer`` module the file imports, anywhere in it (a deferred import counts too), with the
    names it takes from each: [(module, [names])]."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names if alias.name.startswith("minitransformer")]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] if node.level else [])
            target = ".".join(p for p in (base, node.module or "") if p)
            if target.startswith("minitransformer"):
                names = [alias.name for alias in node.names]
                modules = [f"{target}.{n}" for n in names if is_module(f"{target}.{n}")]
                found += [(m, []) for m in modules] if modules else [(target, names)]
    return found


def is_module(name: str) -> bool:
    path = ROOT.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def package_files():
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def test_import_minitransformer_loads_the_core_alone():
    code = """
        import sys, minitransformer as mt
        print(sorted(m for m in sys.modules if m.startswith(("minitransformer.kit", "minitransformer.fast",
                                                               "safetensors", "tqdm", "threadpoolctl", "matplotlib",
                                                               "sacrebleu"))))
        print(mt.bleu.__name__, mt.viz.__name__, mt.fast.__name__, mt.kit.__name__)
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         cwd=ROOT.parent, check=True).stdout.splitlines()
    assert out[0] == "[]"
    assert out[1] == ("minitransformer.kit.data.bleu minitransformer.kit.running.viz minitransformer.fast "
                      "minitransformer.kit")


def test_each_module_has_one_name():
    for old in ("train", "tokenizers", "checkpoint", "datasets", "files", "limits", "tasks", "batching"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"minitransformer.{old}")
        assert f"minitransformer.{old}" not in sys.modules
    with pytest.raises(AttributeError, match="has no attribute 'Trainer'"):
        mt.Trainer  # noqa: B018
    # A file name (or a package's) says one thing, except the fast tier's, which mirror their core twins by design.
    stems = [p.parent.name if p.stem == "__init__" else p.stem for p in package_files() if "fast" not in p.parts]
    assert sorted(s for s in set(stems) if stems.count(s) > 1) == []


def test_the_core_runs_in_a_virtual_environment_with_numpy_alone(tmp_path):
    """A fresh virtual environment (no site-packages of this machine), NumPy alone beside the package: the core
    builds a model, trains a step, decodes and checks a gradient; the kit is out of reach."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    if not python.exists():
        pytest.skip("no POSIX virtual environment layout here")
    only = tmp_path / "only-numpy"
    only.mkdir()
    site = Path(numpy.__file__).parent.parent
    for entry in site.iterdir():                               # numpy and its bundled libraries (numpy.libs)
        if entry.name == "numpy" or entry.name.startswith("numpy.libs") or entry.name.startswith("numpy-"):
            (only / entry.name).symlink_to(entry)
    (only / "minitransformer").symlink_to(ROOT)
    code = """
        import numpy as np, minitransformer as mt
        mt.manual_seed(0)
        cfg = mt.TransformerConfig(src_vocab_size=12, tgt_vocab_size=12, d_model=16, num_heads=2,
                                   num_encoder_layers=1, num_decoder_layers=1, d_ff=32, dropout=0.1)
        model = mt.Transformer(cfg)
        loss_fn = mt.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
        opt = mt.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
        src = np.array([[5, 6, 7, 2], [8, 9, 2, 0]]); tgt = np.array([[1, 7, 6, 5, 2], [1, 9, 8, 2, 0]])
        loss = loss_fn(model(src, tgt[:, :-1]), tgt[:, 1:])
        model.backward(loss_fn.backward()); opt.step(); opt.zero_grad()
        print(round(float(loss), 1) > 0, len(mt.decoding.greedy_decode(model.eval(), src, max_len=3)))
        try:
            import minitransformer.kit.running.checkpoint
        except ImportError as err:
            print("kit:", type(err).__name__)
    """
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(only), "PYTHONNOUSERSITE": "1"}
    proc = subprocess.run([str(python), "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["True 2", "kit: ModuleNotFoundError"]


def test_neither_tier_imports_the_kit():
    for path in package_files():
        name = module_name(path)
        if part_of(name) in ("core", "fast") and name not in ("minitransformer", "minitransformer.__main__"):
            for target, _ in imports_of(path):
                assert ".kit" not in target, f"{name} imports {target}"


def test_kit_imports_run_one_way_without_circles():
    graph = {}
    for path in package_files():
        name = module_name(path)
        if not name.startswith("minitransformer.kit"):
            continue
        graph[name] = set()
        for target, _ in imports_of(path):
            mine, theirs = part_of(name), part_of(target)
            assert mine == theirs or FLOORS[theirs] < FLOORS[mine], \
                f"{name} ({mine}) imports {target} ({theirs}): against the floors"
            if target.startswith("minitransformer.kit"):
                graph[name].add(target)

    def visit(node, trail):
        assert node not in trail, "import circle: " + " -> ".join([*trail, node])
        for nxt in graph.get(node, ()):
            if nxt != node and not node.startswith(nxt + "."):         # a module imports its own package's parts
                visit(nxt, [*trail, node])

    for start in graph:
        visit(start, [])


def test_no_name_is_imported_from_a_kit_module_that_does_not_define_it():
    defined = {}
    for path in package_files():
        tree = ast.parse(path.read_text())
        names = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        defined[module_name(path)] = names
    others = [*(ROOT.parent / "tests").glob("*.py"), *(ROOT.parent / "experiments").glob("*.py"),
              *(ROOT.parent / "examples").glob("*.py"), *(ROOT.parent / "notebooks").glob("*.ipynb")]
    for path in [*package_files(), *others]:
        if path.name == "__init__.py" and path.parent == ROOT:
            continue
        if ROOT in path.parents:
            found = imports_of(path)
        else:
            found = [(n.module, [a.name for a in n.names]) for n in ast.walk(ast.parse(source_of(path)))
                     if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("minitransformer.kit")]
        for target, names in found:
            names = [n for n in names if not is_module(f"{target}.{n}")]
            if target.startswith("minitransformer.kit") and target in defined:
                for name in names:
                    assert name in defined[target], \
                        f"{path.name} imports {name} from {target}, which does not define it"


def source_of(path: Path) -> str:
    """A file's Python: a notebook's code cells, their IPython lines (%, !) left out."""
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    lines = [line for c in cells for line in "".join(c["source"]).splitlines()
             if not line.lstrip().startswith(("%", "!"))]
    return "\n".join(lines)


def test_no_module_renames_another_modules_name():
    """``full_config = checks.full_config`` would make one function reachable under two modules."""
    for path in package_files():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Attribute, ast.Tuple)):
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                targets = [n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
                for value, target in zip(values, targets):
                    aliased = isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and \
                        value.attr == target
                    assert not aliased, f"{module_name(path)}: {target} = {ast.unparse(value)}"


def test_the_kit_uses_plain_imports():
    """``importlib`` only where a plain import cannot do: the classroom loads a student's copy by path."""
    for path in KIT.rglob("*.py"):
        if "classroom" not in path.parts:
            assert "importlib" not in path.read_text(), f"{path.relative_to(ROOT)} imports through importlib"


def test_train_walks_down_the_kit_without_climbing_back(tmp_path):
    """From ``train``'s arguments to the first optimiser step (copy on both tiers, toy with its tokenisers), no call
    stack passes a kit module, then another, then the first again: each floor calls the ones below, never back."""
    from minitransformer.kit.cli import main

    class FirstStep(BaseException):
        pass

    climbs = []

    def watch(frame, event, arg):                            # called as each function starts
        name = frame.f_globals.get("__name__", "")
        if frame.f_code.co_name == "step" and name.endswith("optim"):
            raise FirstStep
        if not name.startswith("minitransformer.kit") or frame.f_back.f_globals.get("__name__") == name:
            return                                           # a climb back enters a kit module from another
        stack, f = [], frame                                 # the kit modules of the stack, a run of one counted once
        while f is not None:
            module = f.f_globals.get("__name__", "")
            if module.startswith("minitransformer.kit") and stack[-1:] != [module]:
                stack.append(module)
            f = f.f_back
        if len(set(stack)) < len(stack):
            climbs.append(" > ".join(reversed(stack)) + f" [{frame.f_code.co_name}]")

    before = sys.gettrace()                                  # a coverage tool's, if one runs
    for task, *extra in (("copy", "--reference"), ("copy",), ("toy",)):
        sys.settrace(watch)
        try:
            with pytest.raises(FirstStep):
                main(["train", "--task", task, "--steps", "2", "--out", str(tmp_path / f"{task}{len(extra)}"),
                      "--no-plots", "--no-progress", *extra])
        finally:
            sys.settrace(before)
    assert climbs == [], "a call climbs back up the kit: " + climbs[0]
