"""Checkpoints: an exact round trip, safetensors that other tools open, atomic writes, every kind of damage
refused by name, one run per folder, and the earlier .npz files converted."""

import hashlib
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy

import minitransformer as mt
from minitransformer.kit.running import checkpoint as ck
from minitransformer.kit import limits
from minitransformer.kit import files
from minitransformer.kit.running import checkpoint_checks, npz
from minitransformer.loss import CrossEntropyLoss
from minitransformer.model import Transformer, TransformerConfig
from minitransformer.optim import Adam, NoamSchedule


def small_model(seed=0):
    mt.manual_seed(seed)
    config = TransformerConfig(11, 13, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                               d_ff=12, dropout=0.0, max_len=16)
    return Transformer(config)


def trained_state():
    """A model, optimiser and schedule after two real steps, so that Adam's moments are not zero."""
    model = small_model()
    opt = Adam(model.parameters(), lr=1.0)
    sched = NoamSchedule(opt, 8, warmup=4)
    loss_fn = CrossEntropyLoss(0)
    src = np.array([[4, 5, 6], [7, 8, 0]])
    tgt_in = np.array([[1, 4, 5], [1, 9, 0]])
    tgt_out = np.array([[4, 5, 2], [9, 2, 0]])
    for _ in range(2):
        opt.zero_grad()
        loss_fn(model(src, tgt_in), tgt_out)
        model.backward(loss_fn.backward())
        sched.step()
        opt.step()
    return model, opt, sched, (src, tgt_in)


def save_state(path, model, opt, sched, **kw):
    return ck.save_checkpoint(path, weights=model.state_dict(), optimizer=opt.state_dict(),
                              scheduler=sched.state_dict(), step=2, epoch=1, batch=3, rng=mt.backend.get_rng_state(),
                              config=model.config.to_dict(), tokenizers={"src": '{"type": "word"}'},
                              extra={"task": "copy"}, **kw)


@pytest.fixture
def saved(tmp_path):
    model, opt, sched, batch = trained_state()
    path = str(tmp_path / "checkpoint.safetensors")
    save_state(path, model, opt, sched)
    return path, model, opt, sched, batch


# ------------------------------------------------------------------------------------------ round trip

def test_round_trip_gives_identical_logits_and_state(saved):
    path, model, opt, sched, (src, tgt_in) = saved
    loaded = ck.load_checkpoint(path)
    assert loaded.step == 2 and loaded.epoch == 1 and loaded.batch == 3
    assert loaded.config == model.config.to_dict()
    assert loaded.tokenizers == {"src": '{"type": "word"}'} and loaded.extra == {"task": "copy"}
    assert loaded.rng == json.loads(json.dumps(mt.backend.get_rng_state()))

    other = Transformer(TransformerConfig.from_dict(loaded.config))
    other.load_state_dict(loaded.weights)
    model.eval()
    other.eval()
    np.testing.assert_array_equal(other(src, tgt_in), model(src, tgt_in))   # bit for bit

    opt2 = Adam(other.parameters(), lr=1.0)
    opt2.load_state_dict(loaded.optimizer)
    for name in ("m", "v"):
        for a, b in zip(opt.state[name], opt2.state[name]):
            np.testing.assert_array_equal(a, b)
    assert opt2.step_count == opt.step_count and opt2.lr == opt.lr
    sched2 = NoamSchedule(opt2, 8, warmup=99)
    sched2.load_state_dict(loaded.scheduler)
    assert sched2.state_dict() == sched.state_dict()


@pytest.mark.parametrize("switches", [{"positional": "learned"}, {"d_k": 3}, {"norm_first": True},
                                      {"positional": "learned", "d_k": 5, "norm_first": True},
                                      {"d_k": 3, "d_v": 5}, {"d_v": 1}])
def test_round_trip_of_the_table3_switches(tmp_path, switches):
    """Learned positions (a trained table per side), a head size apart from d_model / h, a value size apart from
    the key size, pre-LN: the checkpoint holds the config and every weight, and the model rebuilt from it computes
    the same logits."""
    mt.manual_seed(3)
    config = TransformerConfig(11, 13, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                               d_ff=12, dropout=0.0, max_len=16, **switches)
    model, src, tgt_in = Transformer(config), np.array([[4, 5, 6], [7, 8, 0]]), np.array([[1, 4, 5], [1, 9, 0]])
    for p in model.parameters():                       # weights unlike any fresh model's
        p.data += np.asarray(0.1 * np.random.default_rng(1).standard_normal(p.data.shape), p.data.dtype)
    path = str(tmp_path / "switches.safetensors")
    ck.save_checkpoint(path, weights=model.state_dict(), config=config.to_dict())
    loaded = ck.load_checkpoint(path)
    assert {k: loaded.config[k] for k in switches} == switches
    other = Transformer(TransformerConfig.from_dict(loaded.config))
    assert sorted(other.state_dict()) == sorted(model.state_dict())
    other.load_state_dict(loaded.weights)
    model.eval()
    other.eval()
    np.testing.assert_array_equal(other(src, tgt_in), model(src, tgt_in))


def test_a_checkpoint_written_before_d_v_existed_loads_with_values_as_wide_as_the_keys(tmp_path):
    """A config without the d_v key (files written before it existed) reads as d_v = d_k: the reader accepts
    the weights, and the model rebuilt from it has the same parameters and computes the same logits."""
    mt.manual_seed(3)
    config = TransformerConfig(11, 13, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                               d_ff=12, dropout=0.0, max_len=16, d_k=3)
    model, src, tgt_in = Transformer(config), np.array([[4, 5, 6], [7, 8, 0]]), np.array([[1, 4, 5], [1, 9, 0]])
    old = config.to_dict()
    del old["d_v"]
    path = str(tmp_path / "old.safetensors")
    ck.save_checkpoint(path, weights=model.state_dict(), config=old)
    loaded = ck.load_checkpoint(path)
    assert "d_v" not in loaded.config
    rebuilt = TransformerConfig.from_dict(loaded.config)
    assert rebuilt.d_v is None and rebuilt == config
    other = Transformer(rebuilt)
    assert other.encoder.layers[0].self_attn.W_v.W.shape == (8, 2 * 3)     # H*Dk
    other.load_state_dict(loaded.weights)
    model.eval()
    other.eval()
    np.testing.assert_array_equal(other(src, tgt_in), model(src, tgt_in))


def test_a_config_whose_d_v_needs_more_weights_than_given_is_refused(tmp_path):
    """The checks compare the config's parameter count, d_v included, with the weights: values wider than the
    keys need more than a d_v = d_k model holds (the writer runs the reader's checks, so nothing is written)."""
    config = TransformerConfig(11, 13, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                               d_ff=12, dropout=0.0, max_len=16, d_k=3)
    path = tmp_path / "wider.safetensors"
    with pytest.raises(ValueError, match=r"its config describes 1,\d{3} weights but the file holds 1,\d{3}"):
        ck.save_checkpoint(str(path), weights=Transformer(config).state_dict(), config={**config.to_dict(), "d_v": 5})
    assert not path.exists()


def test_nested_state_keeps_types(tmp_path):
    path = str(tmp_path / "c.safetensors")
    state = {"lr": 0.1, "t": np.int64(3), "f32": np.float32(0.5), "zero_d": np.zeros(()), "betas": [0.9, 0.98],
             "per_param": {"0": {"m": np.arange(3.0)}, "1": None}, "name": "adam", "flag": True}
    ck.save_checkpoint(path, weights={"w": np.ones((2, 3), np.float32)}, optimizer=state)
    back = ck.load_checkpoint(path).optimizer
    assert back["lr"] == 0.1 and type(back["lr"]) is float
    assert back["t"] == 3 and type(back["t"]) is np.int64
    assert type(back["f32"]) is np.float32
    assert isinstance(back["zero_d"], np.ndarray) and back["zero_d"].shape == ()
    assert back["betas"] == [0.9, 0.98] and back["name"] == "adam" and back["flag"] is True
    np.testing.assert_array_equal(back["per_param"]["0"]["m"], np.arange(3.0))
    assert back["per_param"]["1"] is None
    assert ck.load_checkpoint(path).weights["w"].dtype == np.float32


@pytest.mark.parametrize("state, kind", [({"betas": (0.9, 0.98)}, "tuple"), ({"per_param": {0: None}}, "dict"),
                                         ({"__array__": 1}, "dict"), ({"s": {1, 2}}, "set")])
def test_state_that_no_state_dict_holds_is_refused_by_name(tmp_path, state, kind):
    """What the optimisers' and schedules' state_dict()s hold is stored; anything else is refused, not tagged."""
    with pytest.raises(TypeError, match=f"save_checkpoint: cannot store a {kind} under 'optim'"):
        ck.save_checkpoint(tmp_path / "c.safetensors", weights={"w": np.ones(2)}, optimizer=state)


def test_the_file_is_plain_safetensors_with_the_same_numbers(saved):
    """Any safetensors reader gets the weights and moments: the tensors are the state, bit for bit."""
    path, model, opt, _, _ = saved
    tensors = safetensors.numpy.load_file(path)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(tensors[f"param/{name}"], value)
        assert tensors[f"param/{name}"].dtype == value.dtype
    moments = sorted(opt.state_dict()[k].tobytes() for k in opt.state_dict() if k[:2] in ("m.", "v."))
    assert sorted(v.tobytes() for k, v in tensors.items() if k.startswith("optim/") and v.ndim) == moments


def test_pytorch_opens_the_file_with_its_own_loader(saved):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    path, model, _, _, _ = saved
    tensors = load_file(path)
    for name, value in model.state_dict().items():
        assert tensors[f"param/{name}"].dtype == torch.float32
        np.testing.assert_array_equal(tensors[f"param/{name}"].numpy(), value)


def test_unstorable_state_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match="cannot store a set"):
        ck.save_checkpoint(str(tmp_path / "c.safetensors"), weights={}, optimizer={"x": {1, 2}})
    with pytest.raises(TypeError, match="weights must be a dict"):
        ck.save_checkpoint(str(tmp_path / "c.safetensors"), weights=[np.zeros(2)])


# ------------------------------------------------------------------------------------------ damage

def one_line_naming(err, path) -> None:
    assert str(path) in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_truncated_at_random_offsets_is_refused(saved, tmp_path):
    path = saved[0]
    data = Path(path).read_bytes()
    rng = np.random.default_rng(0)
    offsets = sorted(set(rng.integers(0, len(data), size=25).tolist()) | {0, 7, 8, 10, len(data) - 1, len(data) - 40})
    bad = str(tmp_path / "truncated.safetensors")
    for offset in offsets:
        with open(bad, "wb") as f:
            f.write(data[:offset])
        with pytest.raises(ValueError, match="truncated|not valid JSON") as err:
            ck.load_checkpoint(bad)
        one_line_naming(err, bad)


def test_flipped_byte_anywhere_is_refused(saved, tmp_path):
    path = saved[0]
    data = Path(path).read_bytes()
    header_end = 8 + int.from_bytes(data[:8], "little")
    rng = np.random.default_rng(1)
    bad = str(tmp_path / "flipped.safetensors")
    offsets = set(rng.integers(0, len(data), size=60).tolist()) | set(range(8)) | {len(data) - 1, header_end}
    offsets |= {header_end - 20, header_end // 2, 30}                       # in the header's JSON too
    for offset in sorted(offsets):
        b = bytearray(data)
        b[offset] ^= 0x01
        with open(bad, "wb") as f:
            f.write(bytes(b))
        with pytest.raises(ValueError) as err:
            ck.load_checkpoint(bad)
        one_line_naming(err, bad)
        if offset >= header_end:
            assert "checksum mismatch" in str(err.value)


def test_altered_tensor_with_a_valid_container_is_refused(saved, tmp_path):
    """Rewrite one weight with safetensors itself (a valid file, the same metadata): only the digest notices."""
    path = saved[0]
    bad = str(tmp_path / "edited.safetensors")
    with safetensors.safe_open(path, framework="np") as f:
        tensors, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()  # noqa: SIM118 - not iterable
    name = next(k for k in tensors if k.startswith("param/"))
    tensors[name] = tensors[name] + 1
    safetensors.numpy.save_file(tensors, bad, metadata=metadata)
    with pytest.raises(ValueError, match="checksum mismatch") as err:
        ck.load_checkpoint(bad)
    one_line_naming(err, bad)
    safetensors.numpy.save_file(tensors, bad, metadata={"minitransformer": metadata["minitransformer"]})
    with pytest.raises(ValueError, match="not a minitransformer checkpoint"):
        ck.load_checkpoint(bad)


def test_a_pickle_is_refused_without_unpickling(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    whole = str(tmp_path / "pickle.safetensors")
    with open(whole, "wb") as f:
        pickle.dump({"weights": Evil()}, f)
    with pytest.raises(ValueError, match="not a safetensors file, or truncated") as err:
        ck.load_checkpoint(whole)
    one_line_naming(err, whole)
    assert not marker.exists()                              # nothing was executed


def test_wrong_version_is_refused(saved, tmp_path, monkeypatch):
    _, model, opt, sched, _ = saved
    monkeypatch.setattr(checkpoint_checks, "FORMAT_VERSION", 99)
    future = str(tmp_path / "future.safetensors")
    save_state(future, model, opt, sched)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="format version 99 is not supported") as err:
        ck.load_checkpoint(future)
    assert future in str(err.value)


def test_other_files_are_refused_by_name(tmp_path):
    npy = str(tmp_path / "array.npy")
    np.save(npy, np.zeros(3))
    with pytest.raises(ValueError, match="not a safetensors file"):
        ck.load_checkpoint(npy)
    plain = str(tmp_path / "plain.safetensors")
    safetensors.numpy.save_file({"a": np.zeros(2)}, plain)
    with pytest.raises(ValueError, match="not a minitransformer checkpoint"):
        ck.load_checkpoint(plain)
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        ck.load_checkpoint(str(tmp_path / "missing.safetensors"))
    with pytest.raises(IsADirectoryError, match="is a folder"):
        ck.load_checkpoint(str(tmp_path))


# ------------------------------------------------------------------------------------------ atomic writes

def test_failed_write_leaves_previous_checkpoint_whole(saved, monkeypatch):
    path, model, opt, sched, _ = saved
    before = Path(path).read_bytes()

    def half_then_fail(f, data):
        f.write(data[:len(data) // 2])
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(ck, "_write_file", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        save_state(path, model, opt, sched)
    monkeypatch.undo()
    assert Path(path).read_bytes() == before
    ck.load_checkpoint(path)                                # still loads
    leftovers = [n for n in os.listdir(os.path.dirname(path)) if n.endswith(files.TEMP_SUFFIX)]
    assert leftovers == []                                  # and the temporary file is gone


def test_failed_rename_leaves_previous_checkpoint_whole(saved, monkeypatch):
    path, model, opt, sched, _ = saved
    before = Path(path).read_bytes()

    def no_replace(src, dst):
        raise OSError("rename failed (simulated)")

    monkeypatch.setattr(ck.os, "replace", no_replace)
    with pytest.raises(OSError, match="rename failed"):
        save_state(path, model, opt, sched)
    monkeypatch.undo()
    assert Path(path).read_bytes() == before


def test_the_digest_covers_the_metadata_and_every_tensor(saved):
    """Recomputed here from the file's parts, independently of the writer's function."""
    with safetensors.safe_open(saved[0], framework="np") as f:
        tensors, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()  # noqa: SIM118 - not iterable
    h = hashlib.sha256(json.dumps({"minitransformer": metadata["minitransformer"], "run": metadata["run"]},
                                  sort_keys=True).encode())
    for name in sorted(tensors):
        h.update(f"\0{name}\0{tensors[name].dtype.str}\0{tensors[name].shape}\0".encode())
        h.update(tensors[name].tobytes())
    assert metadata["sha256"] == h.hexdigest()


# ------------------------------------------------------------------------------------------ keeping K, averaging

def test_manager_keeps_last_k_and_latest(tmp_path):
    model = small_model()
    manager = ck.CheckpointManager(tmp_path / "run", keep=2)
    for step in (10, 20, 30):
        for p in model.parameters():
            p.data += 1.0
        manager.save(step, weights=model.state_dict())
    names = sorted(os.listdir(tmp_path / "run"))
    assert names == ["checkpoint-20.safetensors", "checkpoint-30.safetensors", "checkpoint.safetensors"]
    latest = ck.load_checkpoint(manager.latest)
    assert latest.step == 30
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(latest.weights[name], value)


def test_latest_is_a_file_of_its_own(tmp_path):
    """Restoring a backup with ``cp backup/checkpoint.safetensors run/`` writes into the existing file. Were
    checkpoint.safetensors a hard link to checkpoint-<step>.safetensors, that would rewrite the step file too."""
    model = small_model()
    manager = ck.CheckpointManager(tmp_path / "run", keep=5)
    manager.save(10, weights=model.state_dict())
    backup = Path(manager.latest).read_bytes()
    for p in model.parameters():
        p.data += 1.0
    manager.save(20, weights=model.state_dict())
    with open(manager.latest, "r+b") as f:                  # what cp does to an existing destination
        f.write(backup)
        f.truncate()
    assert ck.load_checkpoint(manager.latest).step == 10
    step_20 = ck.load_checkpoint(tmp_path / "run" / "checkpoint-20.safetensors")
    assert step_20.step == 20                               # the step file is untouched
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(step_20.weights[name], value)


def test_last_checkpoints_up_to_a_step(tmp_path):
    model = small_model()
    manager = ck.CheckpointManager(tmp_path, keep=5)
    for step in (2, 4, 6, 8):
        manager.save(step, weights=model.state_dict())
    names = [os.path.basename(p) for p in ck.last_checkpoints(tmp_path, 2, up_to_step=6)]
    assert names == ["checkpoint-4.safetensors", "checkpoint-6.safetensors"]
    assert [os.path.basename(p) for p in ck.last_checkpoints(tmp_path, 3, up_to_step=3)] == ["checkpoint-2.safetensors"]
    assert ck.last_checkpoints(tmp_path, 2, up_to_step=1) == []
    assert ck.step_of_file(tmp_path / "checkpoint-6.safetensors") == 6 and ck.step_of_file(manager.latest) is None


def test_average_checkpoints(tmp_path):
    model = small_model()
    manager = ck.CheckpointManager(tmp_path, keep=5)
    states = []
    for step in (1, 2, 3):
        for p in model.parameters():
            p.data += np.float32(step)
        states.append(model.state_dict())
        manager.save(step, weights=model.state_dict())
    paths = ck.last_checkpoints(tmp_path, 2)
    assert [os.path.basename(p) for p in paths] == ["checkpoint-2.safetensors", "checkpoint-3.safetensors"]
    avg = ck.average_checkpoints(paths)
    for name in avg:
        expected = ((states[1][name].astype(np.float64) + states[2][name]) / 2).astype(np.float32)
        np.testing.assert_array_equal(avg[name], expected)
        assert avg[name].dtype == np.float32
    with pytest.raises(ValueError, match="at least one"):
        ck.average_checkpoints([])


def test_average_refuses_different_models(tmp_path):
    a = str(tmp_path / "a.safetensors")
    b = str(tmp_path / "b.safetensors")
    ck.save_checkpoint(a, weights={"w": np.zeros((2, 2))})
    ck.save_checkpoint(b, weights={"w": np.zeros((3, 2))})
    with pytest.raises(ValueError, match="shape"):
        ck.average_checkpoints([a, b])


def test_files_of_another_run_are_neither_pruned_nor_averaged(tmp_path, capsys):
    """A checkpoint-999999 dropped into a run folder: pruning keeps it (and names it), averaging leaves it out, and
    average_checkpoints refuses to mix it with the run's own files."""
    manager = ck.CheckpointManager(tmp_path, keep=2)
    manager.save(1, weights={"w": np.full(2, 1.0)})
    ck.save_checkpoint(tmp_path / "checkpoint-999999.safetensors", weights={"w": np.full(2, 100.0)}, run="stranger")
    for step in (2, 3):
        manager.save(step, weights={"w": np.full(2, float(step))})
    names = sorted(os.listdir(tmp_path))
    assert names == ["checkpoint-2.safetensors", "checkpoint-3.safetensors", "checkpoint-999999.safetensors",
                     "checkpoint.safetensors"]
    assert "checkpoint-999999.safetensors was not written by this run (run stranger" in capsys.readouterr().err
    used = ck.last_checkpoints(tmp_path, 5)
    assert [os.path.basename(p) for p in used] == ["checkpoint-2.safetensors", "checkpoint-3.safetensors"]
    assert "left out of averaging" in capsys.readouterr().err
    np.testing.assert_array_equal(ck.average_checkpoints(used)["w"], [2.5, 2.5])
    with pytest.raises(ValueError, match="written by another run .* cannot be averaged"):
        ck.average_checkpoints(used + [str(tmp_path / "checkpoint-999999.safetensors")])
    assert ck.load_checkpoint(manager.latest).run == manager.run != "stranger"


def test_a_resumed_manager_keeps_the_runs_id(tmp_path):
    first = ck.CheckpointManager(tmp_path, keep=2)
    first.save(1, weights={"w": np.zeros(2)})
    first.close()
    second = ck.CheckpointManager(tmp_path, keep=2)
    for step in (2, 3):
        second.save(step, weights={"w": np.zeros(2)})
    assert second.run == first.run
    assert sorted(os.listdir(tmp_path))[:2] == ["checkpoint-2.safetensors", "checkpoint-3.safetensors"]


def test_only_our_own_temp_files_of_dead_writers_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    ours_dead = f"{files.TEMP_PREFIX}{dead}-0123456789ab{files.TEMP_SUFFIX}"
    kept = [f".checkpoint-{dead}-x.tmp", f"{files.TEMP_PREFIX}{dead}-notours.tmp",           # not our pattern
            f"{files.TEMP_PREFIX}{os.getppid()}-0123456789ab{files.TEMP_SUFFIX}", "notes.tmp"]  # a live owner
    for name in [ours_dead, *kept]:
        (tmp_path / name).write_text("x")
    ck.CheckpointManager(tmp_path)
    assert sorted(os.listdir(tmp_path)) == sorted(kept)


HOLD_THE_FOLDER = textwrap.dedent("""
    import sys, time
    from minitransformer.kit.running import checkpoint as ck
    manager = ck.CheckpointManager(sys.argv[1])
    print("locked", flush=True)
    time.sleep(120)
""")


def test_one_run_per_folder_and_a_killed_runs_folder_is_free_at_once(tmp_path):
    folder = str(tmp_path / "run")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_FOLDER, folder], env=env, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=r"checkpoint folder .*/run is in use by another run") as err:
            ck.CheckpointManager(folder)
        assert "\n" not in str(err.value)
        cli = subprocess.run([sys.executable, "-m", "minitransformer", "train", "--task", "copy", "--steps", "1",
                              "--out", folder, "--no-plots", "--no-progress", "--d-model", "8", "--heads", "2",
                              "--layers", "1", "--d-ff", "8"], env=env, capture_output=True, text=True, timeout=120,
                             check=False)
        assert cli.returncode == 2 and "is in use by another run" in cli.stderr.strip().splitlines()[-1], cli.stderr
        assert "Traceback" not in cli.stderr and os.listdir(folder) == []
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    manager = ck.CheckpointManager(folder)                  # the OS released the dead run's lock
    manager.save(1, weights={"w": np.zeros(2)})
    again = ck.CheckpointManager(folder)                    # the same process: one owner
    again.save(2, weights={"w": np.zeros(2)})


def test_the_writer_refuses_what_the_reader_would_refuse(tmp_path, monkeypatch):
    """Metadata over the reader's cap, too many tensors, non-finite weights: refused when saving, so that a run
    never writes a file it cannot read; the reader refuses the same file (written before the cap was lowered)."""
    path = tmp_path / "c.safetensors"
    ck.save_checkpoint(path, weights={"w": np.zeros(2)}, extra={"history": [[1.0, 2.0]] * 5000})
    monkeypatch.setattr(limits, "MAX_META_BYTES", 50_000)
    with pytest.raises(ValueError, match=r"save_checkpoint: its metadata is [\d,]+ bytes, more than a checkpoint may "
                                         r"hold \(limits.MAX_META_BYTES = 50,000\)"):
        ck.save_checkpoint(tmp_path / "d.safetensors", weights={"w": np.zeros(2)}, extra={"h": [[1.0, 2.0]] * 5000})
    with pytest.raises(ValueError, match=r"its metadata is [\d,]+ bytes, more than") as err:
        ck.load_checkpoint(path)
    assert str(path) in str(err.value)
    monkeypatch.setattr(limits, "MAX_ENTRIES", 3)
    with pytest.raises(ValueError, match=r"holds 4 tensors, more than a checkpoint has"):
        ck.save_checkpoint(tmp_path / "e.safetensors", weights={str(i): np.zeros(1) for i in range(4)})
    with pytest.raises(ValueError, match=r"save_checkpoint: weight 'w' holds NaN or infinite values"):
        ck.save_checkpoint(tmp_path / "f.safetensors", weights={"w": np.array([1.0, np.inf])})
    assert sorted(os.listdir(tmp_path)) == ["c.safetensors"]


@pytest.mark.parametrize("skeleton, match", [
    ({"__dict__": [["a", 1]], "__tuple__": [1]}, "malformed entry"),
    ({"__array__": "optim/1", "__tuple__": []}, "malformed entry"),
    ({"__dict__": [[True, 1]]}, "malformed entry"),
    ({"__array__": "param/w"}, "not one of its own"),
    ({"__array__": "optim/7"}, "lists tensors the file lacks"),
])
def test_malformed_skeletons_are_refused_in_one_line(tmp_path, skeleton, match):
    meta = {"format": checkpoint_checks.FORMAT_NAME, "format_version": checkpoint_checks.FORMAT_VERSION, "step": 0, "epoch": 0, "batch": 0,
            "param_names": ["w"], "optimizer": {"state": skeleton}}
    metadata = {"minitransformer": json.dumps(meta), "run": ""}
    tensors = {"param/w": np.zeros(2, np.float32)}
    metadata["sha256"] = ck._digest(metadata, tensors)
    path = str(tmp_path / "skeleton.safetensors")
    safetensors.numpy.save_file(tensors, path, metadata=metadata)
    with pytest.raises(ValueError, match=match) as err:
        ck.load_checkpoint(path)
    one_line_naming(err, path)


# ------------------------------------------------------------------------------------------ earlier .npz files

def write_old_npz(path, model, opt, sched, step=2) -> str:
    """A checkpoint in the .npz layout of format version 1, written as that version wrote it: numpy.savez of
    param/<name>, optim/<i>, meta (JSON bytes) and format_version, then the sha256 in the zip comment."""
    arrays = {f"param/{k}": v for k, v in model.state_dict().items()}
    skeleton = {}
    for key, value in opt.state_dict().items():
        if isinstance(value, np.ndarray):
            skeleton[key] = {"__array__": f"optim/{len(arrays)}", "scalar": False}
            arrays[f"optim/{len(arrays)}"] = value
        else:
            skeleton[key] = value
    meta = {"format": checkpoint_checks.FORMAT_NAME, "format_version": 1, "step": step, "epoch": 0, "batch": 1,
            "param_names": list(model.state_dict()), "optimizer": skeleton, "scheduler": sched.state_dict(),
            "rng": None, "config": model.config.to_dict(), "tokenizers": {}, "extra": {"task": "copy"}}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    arrays["format_version"] = np.array(1)
    np.savez(path, **arrays)
    data = Path(path).read_bytes()
    digest = b"minitransformer-sha256:" + hashlib.sha256(data).hexdigest().encode()
    Path(path).write_bytes(data[:-2] + len(digest).to_bytes(2, "little") + digest)
    return str(path)


def test_an_old_npz_checkpoint_is_named_then_converted_with_the_same_numbers(saved, tmp_path, capsys):
    _, model, opt, sched, _ = saved
    (tmp_path / "old").mkdir()
    old = write_old_npz(tmp_path / "old" / "checkpoint.npz", model, opt, sched)
    with pytest.raises(ValueError, match=r"in the .npz format of earlier versions: convert it once with "
                                         r"`minitransformer convert .*checkpoint.npz`"):
        ck.load_checkpoint(old)
    assert npz.convert_npz(old) == [str(tmp_path / "old" / "checkpoint.safetensors")]
    new = ck.load_checkpoint(tmp_path / "old" / "checkpoint.safetensors")
    assert new.step == 2 and new.batch == 1 and new.extra == {"task": "copy"} and new.scheduler == sched.state_dict()
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(new.weights[name], value)
    for key, value in opt.state_dict().items():
        np.testing.assert_array_equal(new.optimizer[key], value)
    assert os.path.exists(old)                              # the old file is kept ...
    with pytest.raises(ValueError, match="exists already"):
        npz.convert_npz(old)                                # ... and a converted one never replaced


def test_a_run_folder_of_npz_files_converts_with_one_command(saved, tmp_path, capsys):
    from minitransformer.kit.cli.parser import build_parser
    from minitransformer.kit.cli.utility import cmd_convert

    _, model, opt, sched, _ = saved
    tmp_path = tmp_path / "old"
    tmp_path.mkdir()
    for step in (2, 4):
        write_old_npz(tmp_path / f"checkpoint-{step}.npz", model, opt, sched, step=step)
    write_old_npz(tmp_path / "checkpoint.npz", model, opt, sched, step=4)
    for find in (ck.latest_checkpoint, ck.resolve_checkpoint):        # what --resume, translate, evaluate call
        with pytest.raises(ValueError, match=r"holds checkpoints of an earlier version \(.npz\): convert them once "
                                             r"with `minitransformer convert .*old`"):
            find(tmp_path)

    assert cmd_convert(build_parser().parse_args(["convert", str(tmp_path)])) == 0
    assert capsys.readouterr().out.count("wrote ") == 3
    assert [ck.step_of_file(p) for p in ck.last_checkpoints(tmp_path, 5)] == [2, 4]    # one run: averaged together
    assert ck.load_checkpoint(ck.resolve_checkpoint(tmp_path)).step == 4


@pytest.mark.parametrize("damage", ["object array", "flipped byte", "no digest", "header claims 8 TiB"])
def test_a_crafted_npz_is_refused_by_the_converter(saved, tmp_path, damage):
    _, model, opt, sched, _ = saved
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    old = str(tmp_path / "old.npz")
    write_old_npz(old, model, opt, sched)
    data = bytearray(Path(old).read_bytes())
    if damage == "object array":
        np.savez(old, meta=np.array([Evil()], dtype=object), format_version=np.array(1))
        body = Path(old).read_bytes()
        digest = b"minitransformer-sha256:" + hashlib.sha256(body).hexdigest().encode()
        Path(old).write_bytes(body[:-2] + len(digest).to_bytes(2, "little") + digest)
    elif damage == "flipped byte":
        data[len(data) // 2] ^= 1
        Path(old).write_bytes(bytes(data))
    elif damage == "no digest":
        Path(old).write_bytes(bytes(data[:-89]) + b"\0\0")
    else:
        at = bytes(data).index(b"'shape': (") + len(b"'shape': (")
        data[at:at + 2] = b"9" * 2                           # a header whose shape claims far more than the entry
        body = bytes(data[:-89])
        digest = b"minitransformer-sha256:" + hashlib.sha256(body + b"\0\0").hexdigest().encode()
        Path(old).write_bytes(body + len(digest).to_bytes(2, "little") + digest)
    with pytest.raises(ValueError, match="is no array a checkpoint holds|checksum|damaged") as err:
        npz.convert_npz(old, tmp_path / "new.safetensors")
    one_line_naming(err, old)
    assert not marker.exists() and not (tmp_path / "new.safetensors").exists()


def test_two_train_commands_on_one_folder_end_with_one_run_and_one_refusal(tmp_path):
    """Started together with different seeds: one trains to the end, the other is refused in one line (exit 2),
    and the folder holds the checkpoints of one run only."""
    out = str(tmp_path / "run")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OPENBLAS_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-m", "minitransformer", "train", "--task", "copy", "--steps", "30",
                               "--save-every", "5", "--seed", str(seed), "--out", out, "--no-plots", "--no-progress",
                               "--d-model", "8", "--heads", "2", "--layers", "1", "--d-ff", "8", "--heldout", "5"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for seed in (0, 1)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert sorted(code for code, _ in results) == [0, 2], results
    refusal = next(err for code, err in results if code == 2).strip().splitlines()[-1]
    assert "is in use by another run" in refusal or "already holds the checkpoints of a run" in refusal, refusal
    runs = {ck.load_checkpoint(p).run for p in ck.checkpoint_files(out)}
    assert len(runs) == 1 and ck.load_checkpoint(os.path.join(out, ck.LATEST)).step == 30


def test_pruning_reads_each_step_file_header_once(tmp_path, monkeypatch):
    """A long run prunes after every save; the run that wrote a step file is read from its header once, not at
    every save."""
    reads = []
    real = ck.run_of
    monkeypatch.setattr(ck, "run_of", lambda path: reads.append(os.path.basename(str(path))) or real(path))
    manager = ck.CheckpointManager(tmp_path, keep=2)
    for step in range(1, 8):
        manager.save(step, weights={"w": np.full(2, float(step))})
    step_reads = [r for r in reads if r.startswith("checkpoint-")]
    assert len(step_reads) == len(set(step_reads)) and len(reads) <= 1 + len(step_reads)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-6.safetensors", "checkpoint-7.safetensors",
                                            "checkpoint.safetensors"]
