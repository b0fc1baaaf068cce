"""Checkpoints and run folders from elsewhere: every crafted file is refused by name, with exit code 2 from the
command line, and none crashes, hangs, exhausts memory or makes a command write through a planted link.

The sha256 in a checkpoint proves integrity, not origin: anyone can recompute it, so most files here are
crafted WITH a valid checksum, to reach the checks behind it.
"""

import contextlib
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
from safetensors import safe_open

import minitransformer as mt
from minitransformer.kit.running import checkpoint as ck
from minitransformer.kit import files, limits
from minitransformer.kit.data import datasets
from minitransformer.kit.cli import main
from minitransformer.kit.cli.common import (
    CLIError,
    model_from_checkpoint,
    tokenizers_from_checkpoint,
)
from minitransformer.kit.data import tokenizers
from minitransformer.kit.data.tokenizers import WordTokenizer, load_tokenizer, tokenizer_from_json
from minitransformer.kit.running.runs import save_figure
from minitransformer.kit.running.trainer import Trainer
from minitransformer.loss import CrossEntropyLoss
from minitransformer.model import Transformer, TransformerConfig
from minitransformer.optim import Adam, NoamSchedule

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--d-model", "16", "--heads", "2", "--layers", "1", "--d-ff", "24", "--no-progress", "--no-plots"]
MEMORY_LIMIT = 64 << 20      # what loading or refusing a (tiny) checkpoint may allocate, whatever the file claims
TIME_LIMIT = 5.0             # seconds per hostile file


# ------------------------------------------------------------------------------------------ crafting files

def arrays_of(path) -> dict:
    """The tensors of a checkpoint file, and its metadata JSON as the uint8 entry "meta" (to edit and rewrite)."""
    with safe_open(path, framework="np") as f:
        arrays = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - a safe_open is not iterable
        text, run = f.metadata()["minitransformer"], f.metadata()["run"]
    return {**arrays, "meta": np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy(), "run": run}


def meta_of(arrays) -> dict:
    return json.loads(bytes(arrays["meta"]).decode("utf-8"))


def with_meta(arrays, meta=None, text=None) -> dict:
    """The arrays with another meta (an object, or the raw JSON text)."""
    text = json.dumps(meta) if text is None else text
    return {**arrays, "meta": np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()}


def write_checkpoint(path, arrays) -> str:
    """``arrays`` as a checkpoint file with a VALID digest (anyone can compute one)."""
    tensors = {k: np.require(v, requirements=["C"]) for k, v in arrays.items() if k not in ("meta", "run")}
    metadata = {"minitransformer": bytes(arrays["meta"]).decode("utf-8"), "run": arrays.get("run", "")}
    metadata["sha256"] = ck._digest(metadata, tensors)
    Path(path).write_bytes(safetensors.numpy.save(tensors, metadata=metadata))
    return str(path)


def split_file(data: bytes) -> tuple:
    """(header as a dict, the bytes after it) of a safetensors file."""
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), data[8 + n:]


def write_raw(path, header: dict, body: bytes, length=None) -> str:
    """A file of an 8-byte header length (``length``, or the true one), the header's JSON, then ``body``."""
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes((len(text) if length is None else length).to_bytes(8, "little") + text + body)
    return str(path)


def first_param(arrays) -> str:
    return next(k for k in arrays if k.startswith("param/"))


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def measure_peak():
    """Start measuring; -> a function giving the peak growth of memory since, in bytes. On Linux the peak
    resident size (reset through /proc/self/clear_refs: cheap, and it sees every allocation that is used);
    elsewhere tracemalloc (NumPy reports its arrays to it), which slows Python down several times."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        start = _status_bytes("VmRSS")
        return lambda: _status_bytes("VmHWM") - start
    except OSError:
        tracemalloc.start()

        def peak():
            value = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            return value
        return peak


@contextlib.contextmanager
def bounded(seconds=TIME_LIMIT, memory=MEMORY_LIMIT):
    """Fail if the block runs longer than ``seconds`` (SIGALRM interrupts even a blocking open) or its memory
    grows by more than ``memory`` bytes at its peak."""
    def timeout(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    peak = measure_peak()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        grown = peak()
    assert grown < memory, f"memory grew by {grown:,} bytes at the peak (limit {memory:,})"


def refused(path, match) -> str:
    """load_checkpoint(path) raises a ValueError naming the path and matching ``match``, quickly and within
    the memory limit. -> the message."""
    with bounded(), pytest.raises(ValueError, match=match) as err:
        ck.load_checkpoint(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value), str(err.value)
    return str(err.value)


def cli_refuses(capsys, args, *expected) -> str:
    """The command exits 2 with one error line containing every ``expected`` string. -> that line."""
    capsys.readouterr()
    assert main(list(args)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("minitransformer "), err
    for text in expected:
        assert text in err[-1], err[-1]
    return err[-1]


# ------------------------------------------------------------------------------------------ real runs to mutate

@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
    """A real `train --task copy` run folder (4 steps, checkpoints at 2 and 4); tests copy it before changing it."""
    out = str(tmp_path_factory.mktemp("copy") / "run")
    assert main(["train", "--task", "copy", "--steps", "4", "--save-every", "2", "--heldout", "10", "--out", out,
                 *SMALL]) == 0
    return out


@pytest.fixture
def run(copy_run, tmp_path):
    """A fresh copy of the copy run's folder, and its checkpoint's arrays."""
    out = str(tmp_path / "run")
    shutil.copytree(copy_run, out)
    return out, arrays_of(os.path.join(out, ck.LATEST))


def replace_latest(out, arrays) -> str:
    """Make the run folder's latest checkpoint (and its newest step file) the crafted arrays."""
    latest = write_checkpoint(os.path.join(out, ck.LATEST), arrays)
    shutil.copyfile(latest, ck.list_checkpoints(out)[-1])
    return latest


TOKENS = WordTokenizer.build(["a b c d e f g"])


def api_trainer(out=None, seed=0):
    """A Trainer of a tiny model with tokenisers, on a fixed list of batches (what the fuzz resumes into)."""
    mt.manual_seed(seed)
    v = TOKENS.vocab_size
    config = TransformerConfig(v, v, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=12,
                               dropout=0.1, max_len=16)
    model = Transformer(config)
    opt = Adam(model.parameters(), lr=1.0)
    sched = NoamSchedule(opt, 8, warmup=4)
    src = np.array([[4, 5, 6], [7, 8, 0]])
    batches = [(src, np.array([[1, 4, 5], [1, 9, 0]]), np.array([[4, 5, 2], [9, 2, 0]]))] * 3
    return Trainer(model, CrossEntropyLoss(0), opt, batches, scheduler=sched, max_steps=2, progress=False,
                   checkpoint_dir=out, config=config.to_dict(),
                   tokenizers={"src": TOKENS.to_json(), "tgt": TOKENS.to_json()}, extra={"task": "toy"})


@pytest.fixture(scope="module")
def api_checkpoint(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("api"))
    api_trainer(out).fit()
    return os.path.join(out, ck.LATEST)


def snapshot(trainer) -> dict:
    return {"weights": trainer.model.state_dict(), "optim": trainer.optimizer.state_dict(),
            "sched": trainer.scheduler.state_dict(), "data": trainer.train_data.state_dict(),
            "rng": json.dumps(mt.backend.get_rng_state()), "step": trainer.step, "history": list(trainer.history)}


def assert_unchanged(before, after):
    assert before.keys() == after.keys()
    for key in before:
        if isinstance(before[key], dict):
            assert before[key].keys() == after[key].keys(), key
            for k in before[key]:
                np.testing.assert_array_equal(before[key][k], after[key][k], err_msg=f"{key}[{k}]")
        else:
            assert before[key] == after[key], key


# ============================================================================ tracebacks and memory

@pytest.mark.parametrize("shape", [[2 ** 40], [0, 2 ** 62], [2 ** 31, 2 ** 31, 2 ** 31]])
def test_a_tensor_claiming_terabytes_is_refused_before_allocating(run, tmp_path, shape):
    header, body = split_file(Path(run[0], ck.LATEST).read_bytes())
    name = next(k for k in header if k.startswith("param/"))
    header[name]["shape"] = shape
    path = write_raw(tmp_path / "huge.safetensors", header, body)
    refused(path, rf"tensor '{name}' (claims [\d,]+ bytes .* refused before allocating|has the shape .* which no)")


@pytest.mark.parametrize("length", [2 ** 63, 2 ** 40, limits.MAX_HEADER_BYTES + 1, 2 ** 20])
def test_a_header_length_beyond_the_cap_or_the_file_is_refused_unread(run, tmp_path, length):
    header, body = split_file(Path(run[0], ck.LATEST).read_bytes())
    path = write_raw(tmp_path / "long-header.safetensors", header, body, length=length)
    refused(path, rf"first 8 bytes announce a header of {length:,} bytes, the file has .* refused unread")


@pytest.mark.parametrize("field, value, match", [
    ("src_vocab_size", 10 ** 12, "src_vocab_size = 1000000000000 is beyond the sizes this project supports"),
    ("max_len", 10 ** 12, "max_len = 1000000000000 is beyond"),
    ("d_model", 2 ** 20, "d_model = 1048576 is beyond"),
    ("num_encoder_layers", 10 ** 6, "num_encoder_layers = 1000000 is beyond"),
    ("d_v", 10 ** 6, "d_v = 1000000 is beyond"),
    # within every cap, yet a model far larger than the file: refused before it is built
    ("src_vocab_size", 999_999, "describes .* weights but the file holds"),
])
def test_config_beyond_caps_or_file_is_refused_before_building(run, tmp_path, capsys, field, value, match):
    _, arrays = run
    meta = meta_of(arrays)
    meta["config"][field] = value
    if field == "src_vocab_size" and value < 10 ** 6:
        meta["config"]["tgt_vocab_size"] = value
    path = write_checkpoint(tmp_path / "big.safetensors", with_meta(arrays, meta))
    refused(path, match)
    cli_refuses(capsys, ["translate", "--checkpoint", path, "4 5"], path, field if "beyond" in match else "describes")


def test_missing_step_and_param_names_are_named(run, tmp_path):
    _, arrays = run
    for key in ("step", "param_names", "batch"):
        meta = meta_of(arrays)
        del meta[key]
        refused(write_checkpoint(tmp_path / f"no-{key}.safetensors", with_meta(arrays, meta)), f"is missing '{key}'")


def test_tokenizers_without_tgt_are_named(run, tmp_path, capsys):
    _, arrays = run
    meta = meta_of(arrays)
    meta["tokenizers"] = {"src": TOKENS.to_json()}
    path = write_checkpoint(tmp_path / "half.safetensors", with_meta(arrays, meta))
    cli_refuses(capsys, ["translate", "--checkpoint", path, "a b"], path, "missing tokenizers.tgt")


def test_a_tokenizer_beyond_its_size_is_refused_by_size_before_parsing(run, tmp_path, capsys, monkeypatch):
    """A tokeniser's JSON of more than limits.MAX_TOKENIZER_BYTES is refused by its size, unparsed: as text at
    the real limit (bytes, not characters), and at a small one in a checkpoint (by the reader, quickly and within
    the memory limit, and by the writer) and in a tokeniser file."""
    cap, too_big = limits.MAX_TOKENIZER_BYTES, r"more than ([\d,]+) bytes, the most a tokenizer's JSON may be"
    for text in ("x" * (cap + 1), "ü" * (cap // 2 + 1)):            # ü is 2 bytes: fewer characters than the cap
        with pytest.raises(ValueError, match=rf"^tokenizer_from_json: text: {too_big} .*: refused unread$") as err:
            tokenizer_from_json(text)
        assert err.match(f"{cap:,} bytes")
    with pytest.raises(ValueError, match="data must be a dict"):    # at the cap: parsed, then judged by what it is
        tokenizer_from_json('"' + "x" * (cap - 2) + '"')
    monkeypatch.setattr(limits, "MAX_TOKENIZER_BYTES", 1000)
    big = WordTokenizer.build([" ".join(f"w{i}" for i in range(300))]).to_json()
    assert len(big) > 1000
    _, arrays = run
    meta = meta_of(arrays)
    meta["tokenizers"] = {"src": big, "tgt": TOKENS.to_json()}
    path = write_checkpoint(tmp_path / "big-tokenizer.safetensors", with_meta(arrays, meta))
    assert refused(path, f"tokenizers.src: {too_big}").count("1,000 bytes") == 1
    cli_refuses(capsys, ["translate", "--checkpoint", path, "a b"], path, "tokenizers.src: more than 1,000 bytes")
    with pytest.raises(ValueError, match="save_checkpoint: tokenizers.src: more than 1,000 bytes"):
        ck.pack_checkpoint(weights={"w": np.zeros(2, np.float32)}, tokenizers=meta["tokenizers"])
    (tmp_path / "big.json").write_text(big)
    with pytest.raises(ValueError, match=f"tokenizer file {tmp_path / 'big.json'}: more than 1,000 bytes"):
        load_tokenizer(tmp_path / "big.json")


@pytest.mark.parametrize("where", ["meta", "optimizer", "tokenizer"])
def test_deep_nesting_is_refused_without_recursion_error(run, tmp_path, capsys, where):
    _, arrays = run
    meta = meta_of(arrays)
    if where == "meta":                                     # 200,000 nested [ inside the metadata
        text = json.dumps({**meta, "extra": "@"}).replace('"@"', "[" * 200_000 + "]" * 200_000)
        path = write_checkpoint(tmp_path / "deep.safetensors", with_meta(arrays, text=text))
        refused(path, "nested too deeply")
    elif where == "optimizer":                              # a skeleton 980 lists deep around a real array entry
        skeleton = json.dumps(meta["optimizer"])
        text = json.dumps({**meta, "optimizer": "@"}).replace('"@"', "[" * 980 + skeleton + "]" * 980)
        path = write_checkpoint(tmp_path / "deep.safetensors", with_meta(arrays, text=text))
        refused(path, "nested too deeply")
    else:                                                   # the tokenizer JSON string, parsed later by the CLI
        meta["tokenizers"] = {"src": "[" * 100_000 + "]" * 100_000, "tgt": TOKENS.to_json()}
        path = write_checkpoint(tmp_path / "deep.safetensors", with_meta(arrays, meta))
    cli_refuses(capsys, ["translate", "--checkpoint", path, "4 5"], path, "nested too deeply")


def test_resume_state_without_preset_or_data_is_named(run, capsys):
    out, arrays = run
    meta = meta_of(arrays)
    del meta["extra"]["settings"]["preset"]
    replace_latest(out, with_meta(arrays, meta))
    resume = ["train", "--task", "copy", "--out", out, "--resume", "--no-progress"]
    cli_refuses(capsys, resume, "missing settings.preset")
    meta = meta_of(arrays)
    del meta["extra"]["trainer"]["data"]
    replace_latest(out, with_meta(arrays, meta))
    cli_refuses(capsys, resume, "is missing the training state's 'data'")


# ============================================================================ silent acceptance

def test_negative_step_is_refused_and_writes_no_file(run, tmp_path, capsys):
    out, arrays = run
    meta = meta_of(arrays)
    meta["step"] = -5
    latest = replace_latest(out, with_meta(arrays, meta))
    refused(latest, r"step must be an integer in \[0, 1,000,000,000\], got -5")
    before = sorted(os.listdir(out))
    cli_refuses(capsys, ["train", "--task", "copy", "--out", out, "--resume", "--steps", "8", "--no-progress"], "step")
    assert sorted(os.listdir(out)) == before                # no checkpoint--5 file, nothing else either
    with pytest.raises(ValueError, match=r"save_checkpoint: step must be an integer in \[0, 1,000,000,000\]"):
        ck.CheckpointManager(tmp_path / "m").save(-5, weights={"w": np.zeros(2)})
    assert os.listdir(tmp_path / "m") == []


@pytest.mark.parametrize("where, value, match", [
    ("batch", 10 ** 12, r"batch must be an integer in \[0, 1,000,000,000\]"),
    ("epoch", -1, r"epoch must be an integer in \[0,"),
    ("data position", 10 ** 12, r"position'\] must be an integer in \[0,"),
    ("data position", 101, "data position 101 is beyond the 100 batches"),
])
def test_absurd_data_positions_are_refused(run, capsys, where, value, match):
    out, arrays = run
    meta = meta_of(arrays)
    if where == "data position":
        meta["extra"]["trainer"]["data"]["position"] = value
    else:
        meta[where] = value
    replace_latest(out, with_meta(arrays, meta))
    cli_refuses(capsys, ["train", "--task", "copy", "--out", out, "--resume", "--steps", "8", "--no-progress"])
    assert ck.list_checkpoints(out)[-1].endswith("checkpoint-4.safetensors")    # nothing trained, nothing saved


def test_complex_weights_are_refused(run, tmp_path):
    _, arrays = run
    name = first_param(arrays)
    path = write_checkpoint(tmp_path / "complex.safetensors", {**arrays, name: arrays[name] + 1j})
    refused(path, "holds 'C64' values; a checkpoint holds only bool, integer and float arrays")
    with pytest.raises(TypeError, match="complex64 array; a checkpoint holds bool, int and float"):
        ck.save_checkpoint(tmp_path / "c.safetensors", weights={"w": np.zeros(2, np.complex64)})


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_nonfinite_weights_are_refused(run, tmp_path, capsys, value):
    _, arrays = run
    crafted = {k: (np.full_like(v, value) if k.startswith("param/") else v) for k, v in arrays.items()}
    path = write_checkpoint(tmp_path / "nan.safetensors", crafted)
    refused(path, "holds NaN or infinite values")
    cli_refuses(capsys, ["translate", "--checkpoint", path, "4 5"], "NaN or infinite")   # not empty lines, exit 0


@pytest.mark.parametrize("crafted, expected", [
    ("float64 weights of 1e300", "holds values beyond the range of float32, the dtype it runs in"),
    ("negative second moments", "holds negative values; Adam's second moments are squares"),
    ("schedule factor 1e300", "scheduler['factor'] must be a finite number >= 0 (at most 3.403e+38"),
])
def test_values_finite_only_before_the_cast_are_refused(run, capsys, crafted, expected):
    """Finite means finite in the dtype the run computes in: each of these loads as a file, and would end in a
    non-finite loss after the first step; resume (and translate, for the weights) refuse them first."""
    out, arrays = run
    meta = meta_of(arrays)
    if crafted.startswith("float64"):
        name = first_param(arrays)
        arrays = {**arrays, name: np.full(arrays[name].shape, 1e300)}
    elif crafted.startswith("negative"):
        name = meta["optimizer"]["v.0"]["__array__"]
        arrays = {**arrays, name: -1.0 - np.abs(arrays[name])}
    else:
        meta["scheduler"]["factor"] = 1e300
    latest = replace_latest(out, with_meta(arrays, meta))
    ck.load_checkpoint(latest)
    cli_refuses(capsys, ["train", "--task", "copy", "--out", out, "--resume", "--steps", "8", "--no-progress"],
                latest, expected)
    if crafted.startswith("float64"):
        cli_refuses(capsys, ["translate", "--checkpoint", out, "4 5"], latest, "beyond the range of float32")


def test_optimizer_metadata_with_both_dict_and_tuple_is_refused_in_one_line(run, tmp_path, capsys):
    _, arrays = run
    meta = meta_of(arrays)
    meta["optimizer"]["lr"] = {"__dict__": [["a", 1]], "__tuple__": [1, 2]}
    path = write_checkpoint(tmp_path / "both.safetensors", with_meta(arrays, meta))
    refused(path, r"optimizer holds a malformed entry \(keys \['__dict__', '__tuple__'\]\)")
    cli_refuses(capsys, ["evaluate", "--checkpoint", path], path, "malformed entry")


def test_a_header_cut_inside_its_json_is_refused_in_one_line(run, tmp_path, capsys):
    data = Path(run[0], ck.LATEST).read_bytes()
    for cut in (9, 40, 8 + int.from_bytes(data[:8], "little") // 2):
        path = tmp_path / f"cut-{cut}.safetensors"
        path.write_bytes(data[:cut])                          # the length still announces the whole header
        refused(path, "truncated")
        n = cut - 8                                          # the same cut, with the length saying so
        path.write_bytes(n.to_bytes(8, "little") + data[8:cut])
        refused(path, "header: not valid JSON")
    cli_refuses(capsys, ["translate", "--checkpoint", str(path), "4 5"], str(path), "not valid JSON")


def test_extra_entries_are_refused_unread(run, tmp_path):
    _, arrays = run
    path = write_checkpoint(tmp_path / "extra.safetensors", {**arrays, "payload": np.zeros(1000)})
    refused(path, r"holds tensors no checkpoint has \(\['payload'\]\): refused unread")


# ============================================================================ hangs

def test_fifo_checkpoint_is_refused_without_blocking(tmp_path):
    fifo = str(tmp_path / "f.safetensors")
    os.mkfifo(fifo)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "minitransformer", "translate", "--checkpoint", fifo, "4 5"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"minitransformer translate: error: checkpoint {fifo} is not a regular file " \
                                  f"(a FIFO, device or socket): refused"
    with bounded(), pytest.raises(ValueError, match="not a regular file"):      # in-process too: no blocking open
        ck.load_checkpoint(fifo)
    with bounded(), pytest.raises(ValueError, match="not a regular file"):
        datasets._read_lines(Path(fifo))


# ============================================================================ overwrites through symlinks

def test_evaluate_refuses_an_eval_json_that_is_a_symlink(run, tmp_path, capsys):
    out, _ = run
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, os.path.join(out, "eval-heldout.json"))
    cli_refuses(capsys, ["evaluate", "--checkpoint", out], "eval-heldout.json is a symbolic link")
    assert victim.read_text() == "precious"


def test_resume_refuses_a_metrics_json_that_is_a_symlink_before_training(run, tmp_path, capsys):
    out, _ = run
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.unlink(os.path.join(out, "metrics.json"))
    os.symlink(victim, os.path.join(out, "metrics.json"))
    before = Path(out, ck.LATEST).read_bytes()
    cli_refuses(capsys, ["train", "--task", "copy", "--out", out, "--resume", "--steps", "6", "--no-progress"],
                "metrics.json is a symbolic link")
    assert victim.read_text() == "precious" and Path(out, ck.LATEST).read_bytes() == before   # refused at start


def test_no_write_goes_through_a_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "link"
    os.symlink(victim, link)
    with pytest.raises(ValueError, match="is a symbolic link"):
        files.write_json(link, {"a": 1}, "metrics")
    folder = tmp_path / "run"
    manager = ck.CheckpointManager(folder)
    os.symlink(victim, folder / ck.LATEST)
    with pytest.raises(ValueError, match="checkpoint.safetensors is a symbolic link"):
        manager.save(1, weights={"w": np.zeros(2)})
    assert victim.read_text() == "precious"
    assert not [n for n in os.listdir(folder) if n.endswith(files.TEMP_SUFFIX)]


# ============================================================================ atomic writes

def test_a_file_size_limit_leaves_the_previous_metrics_whole(tmp_path):
    """``ulimit -f 1``: the write fails past 1,024 bytes; the previous metrics.json stays, whole."""
    path = tmp_path / "metrics.json"
    path.write_text('{"bleu": 27.3}')
    script = textwrap.dedent(f"""
        import resource
        from minitransformer.kit import files
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
        try:
            files.write_json({str(path)!r}, {{"history": list(range(5000))}}, "metrics")
        except OSError as err:
            print("refused:", err.errno)
    """)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert "refused: 27" in proc.stdout, proc.stdout + proc.stderr            # EFBIG: File too large
    assert path.read_text() == '{"bleu": 27.3}'
    assert os.listdir(tmp_path) == ["metrics.json"]                           # no temporary file left


def test_a_plot_that_fails_half_way_leaves_the_previous_plot_whole(tmp_path):
    path = tmp_path / "loss.png"
    path.write_bytes(b"\x89PNG previous")

    class HalfFigure:
        def savefig(self, f, **kw):
            f.write(b"\x89PNG half")
            raise OSError("disk full (simulated)")

    with pytest.raises(OSError, match="disk full"):
        save_figure(HalfFigure(), str(path))
    assert path.read_bytes() == b"\x89PNG previous" and os.listdir(tmp_path) == ["loss.png"]


# ============================================================================ unclear messages

@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_proc_file_is_refused_by_name(capsys):
    cli_refuses(capsys, ["translate", "--checkpoint", "/proc/self/status", "4 5"], "checkpoint /proc/self/status")


@pytest.mark.parametrize("field, value, expected", [
    ("step", "x", "step must be an integer"),
    ("tokenizers", ["src"], "tokenizers must be an object, got list"),
    ("tokenizers.src", {"type": "word"}, "tokenizers.src must be a tokenizer's JSON as a string, got dict"),
    ("extra", "s", "extra must be an object, got str"),
    ("rng", {"host": "garbage"}, "rng is not a random generator state"),
    ("optimizer.lr", "x", "optimizer['lr'] must be a finite number >= 0"),
    ("optimizer.step", -3, "optimizer['step'] must be an integer in [0,"),
    ("settings", "str", "is not a checkpoint of a `train --task copy` run"),
    ("settings.heldout", 10 ** 12, "settings.heldout must be an integer in [1, 100,000]"),
    ("settings.model", [1], "settings.model must be an object"),
    ("trainer.history", 5, "history must be a list of [4 numbers] rows"),
    ("config", {"src_vocab_size": "x"}, "config is not a valid model config"),
])
def test_crafted_fields_are_named(run, capsys, field, value, expected):
    out, arrays = run
    meta = meta_of(arrays)
    parent, _, key = field.partition(".")
    if parent in ("settings", "trainer"):
        if key:
            meta["extra"][parent][key] = value
        else:
            meta["extra"][parent] = value
    elif key:
        meta[parent][key] = value
    else:
        meta[field] = value
    latest = replace_latest(out, with_meta(arrays, meta))
    cli_refuses(capsys, ["train", "--task", "copy", "--out", out, "--resume", "--steps", "8", "--no-progress"],
                latest, expected)


def write_multi30k(folder, broken=None, data=b""):
    folder.mkdir(exist_ok=True)
    for split in datasets.MULTI30K_SPLITS:
        for lang in datasets.MULTI30K_LANGS:
            (folder / f"{split}.{lang}").write_bytes(b"ein hund .\nzwei katzen .\n")
    if broken:
        (folder / "train.de").unlink()
        (folder / broken).write_bytes(data)
    return folder


@pytest.mark.parametrize("broken, data, expected", [
    ("train.de", b"ein hund .\nzwei \xff katzen .\n", "train.de, line 2: not UTF-8 text (byte 0xff)"),
    ("train.de.gz", b"\x1f\x8b\x08 not gzip at all", "train.de.gz: not a readable gzip file"),
    ("train.de.gz", gzip.compress(b"ein hund .\nzwei katzen .\n")[:-12], "train.de.gz: not a readable gzip file"),
])
def test_multi30k_bad_utf8_and_bad_gzip_name_the_file(tmp_path, capsys, broken, data, expected):
    folder = write_multi30k(tmp_path / "m30k", broken, data)
    with pytest.raises(ValueError, match="not UTF-8|not a readable gzip") as err:
        datasets.load_multi30k(folder, "train")
    assert str(folder / broken) in str(err.value)
    cli_refuses(capsys, ["train", "--task", "multi30k", "--data-dir", str(folder), "--out", str(tmp_path / "out"),
                         "--steps", "1", *SMALL], expected)


# ============================================================================ all-or-nothing resume

@pytest.mark.parametrize("crafted", ["last weight's shape", "optimizer moment", "rng", "data position"])
def test_a_refused_resume_changes_nothing(api_checkpoint, tmp_path, crafted):
    arrays = arrays_of(api_checkpoint)
    meta = meta_of(arrays)
    if crafted == "last weight's shape":
        last = [k for k in arrays if k.startswith("param/")][-1]
        arrays[last] = np.zeros(arrays[last].shape[0] + 1, arrays[last].dtype)
    elif crafted == "optimizer moment":
        key = next(k for k in arrays if k.startswith("optim/") and arrays[k].ndim == 2)
        arrays[key] = arrays[key][:, :1]
    elif crafted == "rng":
        meta["rng"]["host"]["state"] = "garbage"
    else:
        meta["extra"]["trainer"]["data"]["position"] = 4
    path = write_checkpoint(tmp_path / "crafted.safetensors", with_meta(arrays, meta))
    trainer = api_trainer(seed=1)
    before = snapshot(trainer)
    with pytest.raises(ValueError, match=str(tmp_path)):
        trainer.resume(path)
    assert_unchanged(before, snapshot(trainer))


def test_a_run_saved_before_d_k_d_v_positional_reference_and_workers_existed_still_resumes(run, capsys):
    """The checks refuse crafted files, not older ones: a run saved without the config fields and the setting
    added since (their defaults then) loads, translates and resumes."""
    out, arrays = run
    meta = meta_of(arrays)
    for key in ("d_k", "d_v", "positional"):
        del meta["config"][key]
    del meta["extra"]["settings"]["reference"]
    del meta["extra"]["settings"]["workers"]
    replace_latest(out, with_meta(arrays, meta))
    assert main(["translate", "--checkpoint", out, "4 5 6"]) == 0
    assert main(["train", "--task", "copy", "--out", out, "--resume", "--steps", "5", "--no-progress"]) == 0
    assert ck.load_checkpoint(os.path.join(out, ck.LATEST)).step == 5
    assert json.loads(Path(out, "metrics.json").read_text())["workers"] == 1   # as it was trained


def test_the_checkpoint_the_fuzz_mutates_resumes(api_checkpoint):
    trainer = api_trainer(seed=1)
    trainer.resume(api_checkpoint)
    assert trainer.step == 2 and trainer.train_data.state_dict() == {"epoch": 0, "position": 2}


# ============================================================================ fuzz

FUZZ_CASES = int(os.environ.get("MINITRANSFORMER_FUZZ_CASES", "240"))
HEADER_DTYPES = ["F32", "F64", "F16", "BF16", "I64", "U8", "BOOL", "C64", "F8_E4M3", "", "f4"]


def random_json(rng, depth=0):
    kind = rng.integers(0, 9 if depth < 40 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return bool(rng.integers(0, 2))
    if kind == 2:
        return int(rng.choice([0, 1, -1, 2 ** 31, -(2 ** 63), 10 ** 12, 10 ** 30, int(rng.integers(-50, 50))]))
    if kind == 3:
        return float(rng.choice([0.5, -1e300, 1e308, float("nan"), float("inf"), -0.0]))
    if kind in (4, 5):
        return str(rng.choice(["", "x", "param/0", "optim/0", "sched/0", "__array__", "a" * 300]))
    if kind in (6, 7):
        return [random_json(rng, depth + 1) for _ in range(rng.integers(0, 4 if depth < 5 else 2))]
    keys = ["__array__", "__tuple__", "__dict__", "scalar", "step", "lr", "epoch", "position", "host", "x"]
    return {str(rng.choice(keys)): random_json(rng, depth + 1) for _ in range(rng.integers(0, 3))}


def json_paths(obj, prefix=()):
    """Every (path of keys/indices) inside a JSON object, the root excluded."""
    out = []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        out.append(prefix + (k,))
        out.extend(json_paths(v, prefix + (k,)))
    return out


def mutate(rng, base: bytes, arrays: dict, path: str) -> str:
    """Write one mutation of the checkpoint to ``path``; -> what kind it was."""
    kind = str(rng.choice(["bytes", "truncate", "header", "meta", "array"]))
    keep_digest = bool(rng.integers(0, 2))
    if kind == "bytes":
        data = bytearray(base)
        start = 8 + int.from_bytes(base[:8], "little") if keep_digest else 0    # with a digest: the tensors only
        for offset in rng.integers(start, len(data), size=rng.integers(1, 9)):
            data[offset] = int(rng.integers(0, 256))
        if keep_digest:                                              # a valid digest over the damaged tensors
            write_checkpoint(path, {**safetensors.numpy.load(bytes(data)), "meta": arrays["meta"], "run": arrays["run"]})
        else:
            Path(path).write_bytes(bytes(data))
        return f"bytes{'+digest' if keep_digest else ''}"
    if kind == "truncate":
        Path(path).write_bytes(base[:rng.integers(0, len(base))])
        return kind
    if kind == "header":                                             # one tensor's dtype, shape or offsets
        header, body = split_file(base)
        name = str(rng.choice(sorted(k for k in header if k != "__metadata__")))
        entry = header[name]
        field = str(rng.choice(["dtype", "shape", "data_offsets", "extra key"]))
        if field == "dtype":
            entry["dtype"] = str(rng.choice(HEADER_DTYPES))
        elif field == "shape":
            entry["shape"] = [int(rng.choice([0, 1, 3, 2 ** 20, 2 ** 40, -1, 2 ** 64])) for _ in range(rng.integers(0, 4))]
        elif field == "data_offsets":
            entry["data_offsets"] = [int(rng.choice([0, 1, 8, 2 ** 40, -1])), entry["data_offsets"][1]]
        else:
            entry["x"] = random_json(rng)
        write_raw(path, header, body)
        return f"header {name} {field}"
    if kind == "meta":
        meta = meta_of(arrays)
        where = json_paths(meta)
        target = where[rng.integers(0, len(where))]
        parent = meta
        for k in target[:-1]:
            parent = parent[k]
        parent[target[-1]] = random_json(rng)
        write_checkpoint(path, with_meta(arrays, meta))
        return f"meta {'.'.join(map(str, target[:4]))}"
    name = str(rng.choice(sorted(k for k in arrays if k not in ("meta", "run"))))
    replacements = [np.full_like(arrays[name], np.nan, dtype=float), arrays[name].astype(np.complex64),
                    np.zeros((2, 3, 4)), np.array(10 ** 18), arrays[name].astype(np.int8), np.zeros(0, np.float32)]
    replacement = replacements[rng.integers(0, len(replacements))]
    write_checkpoint(path, {**arrays, name: replacement})
    return f"array {name}"


def try_everything(path) -> str:
    """What a user can do with a checkpoint: load it, build the model and tokenisers for translate and evaluate,
    resume a run from it. -> "refused" or "loaded"; any other exception fails the test."""
    try:
        loaded = ck.load_checkpoint(path)
    except (ValueError, FileNotFoundError):
        return "refused"
    try:
        tokenizers_from_checkpoint(loaded)
        model_from_checkpoint(loaded)
    except CLIError:
        return "refused"
    try:
        api_trainer(seed=1).resume(path)
    except ValueError:
        return "refused"
    return "loaded"


def test_fuzz_mutated_checkpoints_are_refused_or_load(api_checkpoint, tmp_path):
    """Random bytes, truncations, the header's tensor fields, metadata fields set to random JSON of every type and depth,
    arrays of other dtypes and shapes; with and without a valid checksum. Each is a clean refusal or a load that
    works, within TIME_LIMIT and MEMORY_LIMIT. MINITRANSFORMER_FUZZ_CASES sets the count (default 240)."""
    base = Path(api_checkpoint).read_bytes()
    arrays = arrays_of(api_checkpoint)
    rng = np.random.default_rng(2024)
    counts = {"refused": 0, "loaded": 0}
    path = str(tmp_path / "fuzz.safetensors")
    started = time.perf_counter()
    for case in range(FUZZ_CASES):
        kind = mutate(rng, base, arrays, path)
        try:
            with bounded():
                counts[try_everything(path)] += 1
        except Exception as err:
            raise AssertionError(f"case {case} ({kind}): {type(err).__name__}: {err}") from err
    print(f"\nfuzz of the file: {FUZZ_CASES} cases in {time.perf_counter() - started:.1f} s: {counts['refused']} refused, "
          f"{counts['loaded']} loaded, 0 other")
    assert sum(counts.values()) == FUZZ_CASES and counts["refused"] > FUZZ_CASES // 2 and counts["loaded"] > 0


def test_fuzz_saved_settings_and_training_state_through_train_resume(run, capsys):
    """What `train --resume` reads besides the arrays (the saved settings, the training state, the config), set to
    random JSON: the run either continues or exits 2 with a message, never anything else."""
    out, arrays = run
    latest = os.path.join(out, ck.LATEST)
    rng = np.random.default_rng(7)
    counts = {0: 0, 2: 0}
    for case in range(int(os.environ.get("MINITRANSFORMER_FUZZ_CASES", "240")) // 10):
        meta = meta_of(arrays)
        section = meta["extra"] if rng.integers(0, 4) else meta
        where = [p for p in json_paths(section) if p[0] in ("settings", "trainer", "config")]
        target = where[rng.integers(0, len(where))]
        parent = section
        for k in target[:-1]:
            parent = parent[k]
        parent[target[-1]] = random_json(rng)
        shutil.rmtree(out)
        os.makedirs(out)
        for name in (ck.LATEST, "checkpoint-4.safetensors"):
            write_checkpoint(os.path.join(out, name), with_meta(arrays, meta))
        capsys.readouterr()
        try:
            with bounded(seconds=30, memory=256 << 20):
                code = main(["train", "--task", "copy", "--out", out, "--resume", "--steps", "5", "--no-progress"])
        except Exception as err:
            raise AssertionError(f"case {case} ({'.'.join(map(str, target))}): {type(err).__name__}: {err}") from err
        err = capsys.readouterr().err.strip().splitlines()
        assert code in counts and (code == 0 or err[-1].startswith("minitransformer train: error:")), (code, err)
        counts[code] += 1
    print(f"\nfuzz of train --resume: {sum(counts.values())} cases: {counts[2]} refused (exit 2), {counts[0]} resumed")
    assert counts[2] > 0 and os.path.exists(latest)


# ----------------------------------------------------------------------------------------- the API's loads

@pytest.mark.parametrize("data", [None, "abc", np.array([None, 1.0], dtype=object), np.array([1 + 2j]),
                                  np.array([1.0, np.nan]), [[1.0], [2.0, 3.0]]], ids=repr)
def test_parameter_refuses_what_is_not_finite_real_numbers(data):
    with pytest.raises((TypeError, ValueError), match=r"Parameter: data must"):
        mt.Parameter(data)


def test_parameter_refuses_numbers_its_dtype_cannot_hold():
    with pytest.raises(ValueError, match="Parameter: data holds values beyond the range of float32"):
        mt.Parameter(np.array([1.0, 1e300]))                     # finite in float64, inf in the default float32
    assert mt.Parameter(np.array([1e300]), dtype=np.float64).data[0] == 1e300


@pytest.mark.parametrize("spoil", ["shape of the last key", "inf", "1e300 into float32", "list of None",
                                   "not a dict"])
def test_load_state_dict_is_all_or_nothing(spoil):
    model = mt.layers.PositionwiseFeedForward(4, 6)
    before = {k: v.copy() for k, v in model.state_dict().items()}
    state = {k: v + 1.0 for k, v in before.items()}             # every weight would change ...
    last = list(state)[-1]
    state[last] = {"shape of the last key": np.zeros(3), "inf": np.full(before[last].shape, np.inf),
                   "1e300 into float32": np.full(before[last].shape, 1e300),            # finite in float64 only
                   "list of None": [None] * before[last].size}.get(spoil)   # ... but the last entry is bad
    with pytest.raises((TypeError, ValueError), match="load_state_dict"):
        model.load_state_dict(None if spoil == "not a dict" else state)
    assert all(np.array_equal(model.state_dict()[k], v) for k, v in before.items())   # nothing changed


def test_optimizer_load_state_dict_is_all_or_nothing():
    model = mt.layers.Linear(3, 2)
    opt = mt.optim.Adam(model.parameters())
    with pytest.raises(TypeError, match=r"Adam.load_state_dict: state must be a dict"):
        opt.load_state_dict(None)
    state = opt.state_dict()
    state.update({"step": 7, "m.0": np.ones((3, 2)), "v.1": np.full(2, np.nan)})
    with pytest.raises(ValueError, match=r"v\.1 must hold finite numbers"):
        opt.load_state_dict(state)
    assert opt.step_count == 0 and not np.any(opt.state["m"][0])


def test_attention_with_no_key_is_refused_by_name():
    mha = mt.layers.MultiHeadAttention(4, 2)
    with pytest.raises(ValueError, match="at least one key"):
        mha(np.zeros((1, 2, 4)), np.zeros((1, 0, 4)), np.zeros((1, 0, 4)))
    with pytest.raises(ValueError, match="at least one key"):
        mt.layers.ScaledDotProductAttention()(np.zeros((1, 1, 2, 3)), np.zeros((1, 1, 0, 3)), np.zeros((1, 1, 0, 3)))


def test_backward_refuses_a_list_by_name():
    layer = mt.layers.Linear(3, 2)
    layer(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"Linear.backward: dout must have the shape"):
        layer.backward([[1.0, 2.0], [3.0, 4.0]])


def test_a_tokenizer_file_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "tokenizer.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        tokenizers.load_tokenizer(fifo)
