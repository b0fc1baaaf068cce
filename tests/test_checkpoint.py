"""Checkpoints: an exact round trip, no pickle, atomic writes, and every kind of damage refused by name."""

import json
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

import minitransformer as mt
from minitransformer import checkpoint as ck
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
    path = str(tmp_path / "checkpoint.npz")
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
                                      {"positional": "learned", "d_k": 5, "norm_first": True}])
def test_round_trip_of_the_table3_switches(tmp_path, switches):
    """Learned positions (a trained table per side), a head size apart from d_model / h, pre-LN: the checkpoint
    holds the config and every weight, and the model rebuilt from it computes the same logits."""
    mt.manual_seed(3)
    config = TransformerConfig(11, 13, d_model=8, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                               d_ff=12, dropout=0.0, max_len=16, **switches)
    model, src, tgt_in = Transformer(config), np.array([[4, 5, 6], [7, 8, 0]]), np.array([[1, 4, 5], [1, 9, 0]])
    for p in model.parameters():                       # weights unlike any fresh model's
        p.data += np.asarray(0.1 * np.random.default_rng(1).standard_normal(p.data.shape), p.data.dtype)
    path = str(tmp_path / "switches.npz")
    ck.save_checkpoint(path, weights=model.state_dict(), config=config.to_dict())
    loaded = ck.load_checkpoint(path)
    assert {k: loaded.config[k] for k in switches} == switches
    other = Transformer(TransformerConfig.from_dict(loaded.config))
    assert sorted(other.state_dict()) == sorted(model.state_dict())
    other.load_state_dict(loaded.weights)
    model.eval()
    other.eval()
    np.testing.assert_array_equal(other(src, tgt_in), model(src, tgt_in))


def test_nested_state_keeps_types(tmp_path):
    path = str(tmp_path / "c.npz")
    state = {"lr": 0.1, "t": np.int64(3), "f32": np.float32(0.5), "zero_d": np.zeros(()), "betas": (0.9, 0.98),
             "per_param": {0: {"m": np.arange(3.0)}, 1: None}, "name": "adam", "flag": True}
    ck.save_checkpoint(path, weights={"w": np.ones((2, 3), np.float32)}, optimizer=state)
    back = ck.load_checkpoint(path).optimizer
    assert back["lr"] == 0.1 and type(back["lr"]) is float
    assert back["t"] == 3 and type(back["t"]) is np.int64
    assert type(back["f32"]) is np.float32
    assert isinstance(back["zero_d"], np.ndarray) and back["zero_d"].shape == ()
    assert back["betas"] == (0.9, 0.98) and back["name"] == "adam" and back["flag"] is True
    np.testing.assert_array_equal(back["per_param"][0]["m"], np.arange(3.0))
    assert back["per_param"][1] is None
    assert ck.load_checkpoint(path).weights["w"].dtype == np.float32


def test_no_pickle_inside(saved):
    path = saved[0]
    with np.load(path, allow_pickle=False) as archive:     # loads without pickle ...
        for name in archive.files:
            assert archive[name].dtype != object           # ... because no array needs it


def test_unstorable_state_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match="cannot store a set"):
        ck.save_checkpoint(str(tmp_path / "c.npz"), weights={}, optimizer={"x": {1, 2}})
    with pytest.raises(TypeError, match="weights must be a dict"):
        ck.save_checkpoint(str(tmp_path / "c.npz"), weights=[np.zeros(2)])


# ------------------------------------------------------------------------------------------ damage

def test_truncated_at_random_offsets_is_refused(saved, tmp_path):
    path = saved[0]
    data = Path(path).read_bytes()
    rng = np.random.default_rng(0)
    offsets = sorted(set(rng.integers(0, len(data), size=25).tolist()) | {0, 10, len(data) - 1, len(data) - 40})
    bad = str(tmp_path / "truncated.npz")
    for offset in offsets:
        with open(bad, "wb") as f:
            f.write(data[:offset])
        with pytest.raises(ValueError, match="truncated|damaged|not a .npz|no minitransformer checksum") as err:
            ck.load_checkpoint(bad)
        assert bad in str(err.value)


def test_flipped_byte_anywhere_is_refused(saved, tmp_path):
    path = saved[0]
    data = Path(path).read_bytes()
    rng = np.random.default_rng(1)
    bad = str(tmp_path / "flipped.npz")
    offsets = set(rng.integers(0, len(data), size=40).tolist()) | {len(data) - 1, len(data) // 2}
    for offset in sorted(offsets):
        b = bytearray(data)
        b[offset] ^= 0x01
        with open(bad, "wb") as f:
            f.write(bytes(b))
        with pytest.raises(ValueError, match="checksum|damaged|not a .npz") as err:
            ck.load_checkpoint(bad)
        assert bad in str(err.value)


def test_altered_array_with_valid_zip_is_refused(saved, tmp_path):
    """Rewrite one weight inside the zip (fresh, valid CRCs): only the checksum can notice."""
    path = saved[0]
    bad = str(tmp_path / "edited.npz")
    with np.load(path) as archive:
        arrays = {k: archive[k] for k in archive.files}
    name = next(k for k in arrays if k.startswith("param/"))
    arrays[name] = arrays[name] + 1
    np.savez(bad, **arrays)
    with pytest.raises(ValueError, match="no minitransformer checksum"):
        ck.load_checkpoint(bad)
    # ... and with the original digest appended, the content no longer matches it
    with open(path, "rb") as f:
        tail = f.read()[-(ck._TRAILER + 2):]
    with open(bad, "r+b") as f:
        f.seek(-2, os.SEEK_END)
        f.write(tail)
    with pytest.raises(ValueError, match="checksum mismatch"):
        ck.load_checkpoint(bad)


def test_pickled_object_is_refused_without_unpickling(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    inside = str(tmp_path / "object_array.npz")
    np.savez(inside, meta=np.array([Evil()], dtype=object), format_version=np.array(1))
    with pytest.raises(ValueError, match="pickled Python objects") as err:
        ck.load_checkpoint(inside)
    assert inside in str(err.value)

    whole = str(tmp_path / "pickle.npz")
    with open(whole, "wb") as f:
        pickle.dump({"weights": Evil()}, f)
    with pytest.raises(ValueError, match="not a .npz archive.*without unpickling") as err:
        ck.load_checkpoint(whole)
    assert whole in str(err.value)
    assert not marker.exists()                              # nothing was executed


def test_wrong_version_is_refused(saved, tmp_path, monkeypatch):
    _, model, opt, sched, _ = saved
    monkeypatch.setattr(ck, "FORMAT_VERSION", 99)
    future = str(tmp_path / "future.npz")
    save_state(future, model, opt, sched)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="format version 99 is not supported") as err:
        ck.load_checkpoint(future)
    assert future in str(err.value)


def test_other_files_are_refused_by_name(tmp_path):
    npy = str(tmp_path / "array.npy")
    np.save(npy, np.zeros(3))
    with pytest.raises(ValueError, match="single .npy array"):
        ck.load_checkpoint(npy)
    plain = str(tmp_path / "plain.npz")
    np.savez(plain, a=np.zeros(2))
    with pytest.raises(ValueError, match="no minitransformer checksum"):
        ck.load_checkpoint(plain)
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        ck.load_checkpoint(str(tmp_path / "missing.npz"))
    with pytest.raises(IsADirectoryError, match="is a folder"):
        ck.load_checkpoint(str(tmp_path))


# ------------------------------------------------------------------------------------------ atomic writes

def test_failed_write_leaves_previous_checkpoint_whole(saved, monkeypatch):
    path, model, opt, sched, _ = saved
    before = Path(path).read_bytes()

    def half_then_fail(f, arrays):
        f.write(b"PK\x03\x04 half an archive")
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(ck, "_write_npz", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        save_state(path, model, opt, sched)
    monkeypatch.undo()
    assert Path(path).read_bytes() == before
    ck.load_checkpoint(path)                                # still loads
    leftovers = [n for n in os.listdir(os.path.dirname(path)) if n.endswith(ck.TEMP_SUFFIX)]
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


def test_written_file_is_a_plain_zip_with_the_digest_as_comment(saved):
    with zipfile.ZipFile(saved[0]) as z:
        assert z.comment.startswith(b"minitransformer-sha256:")
        assert z.testzip() is None


# ------------------------------------------------------------------------------------------ keeping K, averaging

def test_manager_keeps_last_k_and_latest(tmp_path):
    model = small_model()
    manager = ck.CheckpointManager(tmp_path / "run", keep=2)
    for step in (10, 20, 30):
        for p in model.parameters():
            p.data += 1.0
        manager.save(step, weights=model.state_dict())
    names = sorted(os.listdir(tmp_path / "run"))
    assert names == ["checkpoint-20.npz", "checkpoint-30.npz", "checkpoint.npz"]
    latest = ck.load_checkpoint(manager.latest)
    assert latest.step == 30
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(latest.weights[name], value)


def test_latest_is_a_file_of_its_own(tmp_path):
    """Restoring a backup with ``cp backup/checkpoint.npz run/checkpoint.npz`` writes into the existing file.
    Were checkpoint.npz a hard link to checkpoint-<step>.npz, that would silently rewrite the step file too."""
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
    step_20 = ck.load_checkpoint(tmp_path / "run" / "checkpoint-20.npz")
    assert step_20.step == 20                               # the step file is untouched
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(step_20.weights[name], value)


def test_last_checkpoints_up_to_a_step(tmp_path):
    model = small_model()
    manager = ck.CheckpointManager(tmp_path, keep=5)
    for step in (2, 4, 6, 8):
        manager.save(step, weights=model.state_dict())
    names = [os.path.basename(p) for p in ck.last_checkpoints(tmp_path, 2, up_to_step=6)]
    assert names == ["checkpoint-4.npz", "checkpoint-6.npz"]
    assert [os.path.basename(p) for p in ck.last_checkpoints(tmp_path, 3, up_to_step=3)] == ["checkpoint-2.npz"]
    assert ck.last_checkpoints(tmp_path, 2, up_to_step=1) == []
    assert ck.step_of_file(tmp_path / "checkpoint-6.npz") == 6 and ck.step_of_file(manager.latest) is None


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
    assert [os.path.basename(p) for p in paths] == ["checkpoint-2.npz", "checkpoint-3.npz"]
    avg = ck.average_checkpoints(paths)
    for name in avg:
        expected = ((states[1][name].astype(np.float64) + states[2][name]) / 2).astype(np.float32)
        np.testing.assert_array_equal(avg[name], expected)
        assert avg[name].dtype == np.float32
    with pytest.raises(ValueError, match="at least one"):
        ck.average_checkpoints([])


def test_average_refuses_different_models(tmp_path):
    a = str(tmp_path / "a.npz")
    b = str(tmp_path / "b.npz")
    ck.save_checkpoint(a, weights={"w": np.zeros((2, 2))})
    ck.save_checkpoint(b, weights={"w": np.zeros((3, 2))})
    with pytest.raises(ValueError, match="shape"):
        ck.average_checkpoints([a, b])
