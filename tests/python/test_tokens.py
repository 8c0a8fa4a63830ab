"""Token datasets and windows from Python (issue 36): a Megatron .bin/.idx pair
written here, imported by `stoker pack --from megatron`, read back as
stoker.Loader(uri, batch_size=B, sequence_length=L) windows of shape
(B, L + 1); JSONL token lists through `stoker pack --tokens`; resume of a
run of 4 loader processes on 2, and of 8 Loader and Mix processes on 4 and 16."""

import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import stoker

from conftest import SOURCE_DIR, run_python


def stoker_bin():
    binary = os.environ.get("STOKER_BIN")
    if binary:
        return binary
    built = SOURCE_DIR / "build" / "stoker"
    if built.exists():
        return str(built)
    pytest.skip("STOKER_BIN (the stoker command) not set; ctest sets it")


def write_megatron(prefix, docs, dtype=np.uint16, code=8):
    """megatron/core/datasets/indexed_dataset.py's layout: one sequence a document."""
    lengths = np.array([len(d) for d in docs], dtype=np.int32)
    itemsize = np.dtype(dtype).itemsize
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1]) * itemsize]).astype(np.int64)
    doc_index = np.arange(len(docs) + 1, dtype=np.int64)
    with open(f"{prefix}.bin", "wb") as f:
        for d in docs:
            f.write(np.asarray(d, dtype=dtype).tobytes())
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(docs)))
        f.write(struct.pack("<Q", len(doc_index)))
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())
        f.write(doc_index.tobytes())


def named_docs(n, seed=3):
    """Token t of document d is d * 1000 + t: every token names its place."""
    rng = np.random.default_rng(seed)
    return [[d * 1000 + t for t in range(int(rng.integers(1, 200)))] for d in range(n)]


@pytest.fixture
def megatron(tmp_path):
    docs = named_docs(50)
    write_megatron(tmp_path / "corpus", docs)
    uri = str(tmp_path / "ds")
    r = subprocess.run([stoker_bin(), "pack", "--quiet", "--shard-mib", "0.01",
                        str(tmp_path / "corpus.idx"), uri], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "Megatron" in r.stdout
    return uri, docs


def test_windows_are_megatrons_layout_with_shuffle_off(megatron):
    uri, docs = megatron
    flat = np.concatenate([np.asarray(d) for d in docs])
    L, B = 64, 4
    loader = stoker.Loader(uri, batch_size=B, sequence_length=L, shuffle=False)
    windows = (len(flat) - 1) // L
    assert len(loader) == -(-windows // B)
    k = 0
    for batch in loader:
        tokens = batch["tokens"]
        assert tokens.dtype == np.int64 and tokens.shape[1] == L + 1
        assert tokens.shape[0] == B or k + tokens.shape[0] == windows
        for row, window in zip(tokens, batch["sample_ids"]):
            assert window == k
            np.testing.assert_array_equal(row, flat[k * L:k * L + L + 1])
            k += 1
    assert k == windows


def test_torch_int32_positions_and_shuffle(megatron):
    torch = pytest.importorskip("torch")
    uri, docs = megatron
    L = 32
    loader = stoker.Loader(uri, batch_size=8, sequence_length=L, seed=5, format="torch",
                           sequence_dtype="int32", sequence_positions=True)
    batch = next(iter(loader))
    assert batch["tokens"].shape == (8, L + 1) and batch["tokens"].dtype == torch.int32
    np.testing.assert_array_equal(batch["positions"].numpy(), batch["tokens"].numpy() % 1000)
    assert batch["documents"].shape == (8, L + 1)
    # Shuffled: documents in another order than the dataset's, the same every time.
    again = next(iter(stoker.Loader(uri, batch_size=8, sequence_length=L, seed=5,
                                    format="torch", sequence_dtype="int32")))
    assert torch.equal(batch["tokens"], again["tokens"])
    unshuffled = next(iter(stoker.Loader(uri, batch_size=8, sequence_length=L, shuffle=False)))
    assert not np.array_equal(batch["tokens"].numpy(), unshuffled["tokens"])


def test_state_dict_names_the_sequence_length(megatron):
    uri, _ = megatron
    loader = stoker.Loader(uri, batch_size=2, sequence_length=16, seed=1)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    assert state["sequence_length"] == 16 and state["position"] == 4
    other = stoker.Loader(uri, batch_size=2, sequence_length=32, seed=1)
    with pytest.raises(stoker.InvalidArgumentError, match="sequence_length"):
        other.load_state_dict(state)
    with pytest.raises(stoker.InvalidArgumentError, match="sequence_dtype"):
        stoker.Loader(uri, batch_size=2, sequence_length=16, sequence_dtype="float32")


RANK = r"""
import json, sys, stoker
uri, rank, world, steps, state = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
loader = stoker.Loader(uri, batch_size=3, sequence_length=20, seed=9, rank=rank, world_size=world)
if state != "-":
    loader.load_state_dict(json.loads(state))
out = []
it = iter(loader)
for i in range(steps):
    batch = next(it, None)
    if batch is None:
        break
    out.append(batch["sample_ids"].tolist())
print(json.dumps({"ids": out, "state": loader.state_dict()}))
"""


def spawn_ranks(script, world, args):
    """`world` processes of `script` at once, rank r's argv args(r); their JSON outputs."""
    procs = [subprocess.Popen(["/usr/bin/python3", "-c", script] + args(r), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=dict(os.environ))
             for r in range(world)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    return results


def run_ranks(uri, world, steps, state="-"):
    return spawn_ranks(RANK, world, lambda r: [uri, str(r), str(world), str(steps), state])


def global_stream(results, world, batch):
    """Windows by global position: rank r's j-th window is position j * world + r."""
    stream = {}
    for r, res in enumerate(results):
        flat = [k for b in res["ids"] for k in b]
        for j, k in enumerate(flat):
            stream[j * world + r] = k
    return stream


def test_resume_of_four_processes_on_two(megatron):
    uri, _ = megatron
    whole = global_stream(run_ranks(uri, 1, 10 ** 6), 1, 3)
    first = run_ranks(uri, 4, 2)
    state = first[0]["state"]
    assert state["position"] == 2 * 3 * 4 and state["world_size"] == 4
    rest = run_ranks(uri, 2, 10 ** 6, json.dumps(state))
    got = global_stream(first, 4, 3)
    for p, k in global_stream(rest, 2, 3).items():
        assert state["position"] + p not in got
        got[state["position"] + p] = k
    assert all(whole[p] == k for p, k in got.items())
    assert len(got) >= len(whole) - 1


def test_pack_tokens_from_jsonl_and_a_bad_token(tmp_path):
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps({"tokens": list(range(i, i + 30)), "text": "x"}) + "\n"
                           for i in range(20)))
    uri = str(tmp_path / "ds")
    r = subprocess.run([stoker_bin(), "pack", "--quiet", "--tokens", "--token-dtype", "uint16",
                        str(src), uri], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    info = stoker.inspect(uri)
    assert info["fields"][0]["name"] == "tokens"
    batch = next(iter(stoker.Loader(uri, batch_size=5, sequence_length=29, shuffle=False)))
    flat = np.concatenate([np.arange(i, i + 30) for i in range(20)])
    np.testing.assert_array_equal(batch["tokens"][1], flat[29:59])
    with open(src, "a") as f:
        f.write(json.dumps({"tokens": [1, 70000]}) + "\n")
    r = subprocess.run([stoker_bin(), "pack", "--quiet", "--tokens", "--token-dtype", "uint16",
                        str(src), str(tmp_path / "ds2")], capture_output=True, text=True)
    assert r.returncode != 0
    assert f"{src}:21" in r.stderr, r.stderr


def test_bad_megatron_index_is_named(tmp_path):
    write_megatron(tmp_path / "c", named_docs(3))
    idx = tmp_path / "c.idx"
    data = bytearray(idx.read_bytes())
    data[9] = 7  # the version
    idx.write_bytes(bytes(data))
    r = subprocess.run([stoker_bin(), "pack", "--quiet", "--from", "megatron", str(tmp_path / "c"),
                        str(tmp_path / "ds")], capture_output=True, text=True)
    assert r.returncode != 0
    assert str(idx) in r.stderr and "offset 9" in r.stderr and "version 7" in r.stderr, r.stderr


def test_import_megatron_from_python(tmp_path):
    docs = named_docs(20)
    write_megatron(tmp_path / "p", docs)
    summary = stoker.import_megatron(str(tmp_path / "p"), str(tmp_path / "ds"), shard_bytes=8192)
    # The tokens, and their block checksums (docs/format.md §3.5), which the writer adds.
    assert summary["samples"] == 20
    assert summary["fields"] == ["'tokens' (array uint16[*])", "'tokens_sums' (bytes)"]
    flat = np.concatenate([np.asarray(d) for d in docs])
    batch = next(iter(stoker.Loader(str(tmp_path / "ds"), batch_size=2, sequence_length=100,
                                    shuffle=False)))
    np.testing.assert_array_equal(batch["tokens"][1], flat[100:201])
    # Read as records, the documents come without the checksums, unless named.
    records = next(iter(stoker.Loader(str(tmp_path / "ds"), batch_size=2, shuffle=False,
                                      ragged="offsets")))
    assert "tokens_sums" not in records and "tokens" in records
    named = next(iter(stoker.Loader(str(tmp_path / "ds"), batch_size=2, shuffle=False,
                                    ragged="offsets", fields=["tokens", "tokens_sums"])))
    assert "tokens_sums" in named
    bad = bytearray((tmp_path / "p.idx").read_bytes())
    bad[0:1] = b"X"
    (tmp_path / "p.idx").write_bytes(bytes(bad))
    with pytest.raises(stoker.InvalidArgumentError, match=r"p\.idx: offset 0: magic"):
        stoker.import_megatron(str(tmp_path / "p.idx"), str(tmp_path / "ds2"))


# One process of a run on `world` ranks: a Loader of shuffled windows and a
# Mix of two sources, for `steps` steps each (the Loader stops earlier at the
# end of its epoch) from `state` (null: the start). Prints what each yielded
# and the states after the last step.
WORLD_RANK = r"""
import json, sys, stoker
uri, other, rank, world, steps, state = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
    int(sys.argv[4]), int(sys.argv[5]), json.loads(sys.argv[6])
loader = stoker.Loader(uri, batch_size=3, sequence_length=20, seed=11, rank=rank,
                       world_size=world)
if state:
    loader.load_state_dict(state["loader"])
windows, it = [], iter(loader)
for _ in range(steps):
    batch = next(it, None)
    if batch is None:
        break
    windows.append([batch["sample_ids"].tolist(), batch["tokens"][:, 0].tolist()])
mix = stoker.Mix([(uri, 0.6), (other, 0.4)], batch_size=48, sequence_length=12, seed=5,
                 rank=rank, world_size=world, state=state["mix"] if state else None)
mixed = []
for _ in range(steps):
    b = next(mix)
    mixed.append(list(zip(b["source"].tolist(), b["sample_ids"].tolist(),
                          b["tokens"][:, 0].tolist())))
print(json.dumps({"loader": windows, "mix": mixed,
                  "state": {"loader": loader.state_dict(), "mix": mix.state_dict()}}))
"""


def run_world(uri, other, world, steps, state=None):
    return spawn_ranks(WORLD_RANK, world,
                       lambda r: [uri, other, str(r), str(world), str(steps), json.dumps(state)])


def loader_stream(results, world, start):
    """{global position: (window, first token)}; rank r's j-th window is at
    start + j * world + r."""
    stream = {}
    for r, res in enumerate(results):
        flat = [w for ids, firsts in res["loader"] for w in zip(ids, firsts)]
        for j, w in enumerate(flat):
            stream[start + j * world + r] = tuple(w)
    return stream


def mix_steps(results):
    """Each step's global batch: the ranks' parts joined in rank order."""
    steps = len(results[0]["mix"])
    assert all(len(res["mix"]) == steps for res in results)
    return [[tuple(w) for res in results for w in res["mix"][s]] for s in range(steps)]


def test_run_of_eight_processes_resumes_on_four_and_sixteen(tmp_path):
    # 192 windows of 20 tokens (3841 tokens): 8 whole steps on 8 ranks of 3
    # windows each, saved after 3; the 120 left are 14 steps on 4 ranks and
    # 2 1/3 on 16.
    docs = named_docs(60, seed=8)
    flat = 0
    for d in range(len(docs)):
        docs[d] = docs[d][:max(0, min(len(docs[d]), 3841 - flat))]
        flat += len(docs[d])
    docs = [d for d in docs if d]
    assert flat == 3841
    write_megatron(tmp_path / "corpus", docs)
    uri = str(tmp_path / "ds")
    r = subprocess.run([stoker_bin(), "pack", "--quiet", "--shard-mib", "0.004",
                        str(tmp_path / "corpus.idx"), uri], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    other = str(tmp_path / "other")
    write_megatron(tmp_path / "o", named_docs(7, seed=9))  # a small source: it repeats
    assert subprocess.run([stoker_bin(), "pack", "--quiet", str(tmp_path / "o.idx"), other],
                          capture_output=True, text=True).returncode == 0

    k, rest = 3, 14  # 14 steps of 4 ranks end the Loader's epoch
    whole = run_world(uri, other, 8, k + rest)
    first = run_world(uri, other, 8, k)
    state = first[0]["state"]
    assert all(res["state"] == state for res in first), "every rank saves the same state"
    saved = state["loader"]["position"]
    assert saved == k * 3 * 8 and state["mix"]["step"] == k
    whole_loader = loader_stream(whole, 8, 0)
    assert len(whole_loader) == 192 and sorted(w for w, _ in whole_loader.values()) == \
        list(range(192)), "the uninterrupted run is one shuffled epoch"
    assert [w for _, (w, _) in sorted(whole_loader.items())] != list(range(192))
    assert loader_stream(first, 8, 0) == {p: w for p, w in whole_loader.items() if p < saved}
    whole_mix = mix_steps(whole)
    assert mix_steps(first) == whole_mix[:k]

    for world in (4, 16):
        resumed = run_world(uri, other, world, rest, state)
        got = loader_stream(resumed, world, saved)
        # Each rank gets floor(rest / world) of the epoch's windows (LoaderOptions::
        # sequence_length): on 16 ranks the last 120 % 16 = 8 are not read this epoch.
        end = saved + (192 - saved) // world * world
        assert end == {4: 192, 16: 184}[world]
        assert got == {p: w for p, w in whole_loader.items() if saved <= p < end}, world
        got_mix = mix_steps(resumed)
        assert got_mix == whole_mix[k:k + rest], world
        assert resumed[0]["state"]["mix"]["step"] == k + rest
