"""The torch.distributed backend against Gloo, DDP, the hierarchical path and
failures, each in real processes (conftest.launch)."""

import secrets

import pytest

from conftest import describe, expect_success, launch


@pytest.mark.parametrize("nranks", [2, 3])
def test_every_collective_and_dtype_equals_gloo(tmp_path, nranks):
    outcomes = expect_success(launch(tmp_path, "collectives", nranks))
    for outcome in outcomes:
        result = outcome.result
        assert result["backend"] == "pcieipc"
        # 7 dtypes × (5 ops × 3 sizes, a broadcast per root, 3 gathers, 4
        # reduce-scatters), 4 async calls, reduce, scatter, the call after the
        # refusals, and gather on its root.
        assert result["checked"] == 7 * (15 + nranks + 3 + 4) + 7 + (outcome.rank == 0), result
        assert result["mismatches"] == [], result["mismatches"]
        assert result["futures_done"]
        refusals = result["refusals"]
        assert refusals["int8"][0] == "InvalidArgument" and "torch.int8" in refusals["int8"][1]
        assert "reduce op" in refusals["band"][1] and "not supported" in refusals["band"][1]
        assert refusals["send"][0] == "NotImplementedError" and "send is not supported" in refusals["send"][1]
        assert "not contiguous" in refusals["non-contiguous"][1]


def test_host_communicator_takes_buffers_and_refuses_bad_arguments(tmp_path):
    rendezvous = f"pytest-{secrets.token_hex(6)}"
    secret = secrets.token_hex(16)
    outcomes = expect_success(
        launch(tmp_path, "host_communicator", 2, env_of_rank=lambda r: {"RENDEZVOUS": rendezvous, "SECRET": secret})
    )
    for outcome in outcomes:
        result = outcome.result
        assert result["sum_ok"] and result["input_untouched"], result
        assert result["bytearray_max"] and result["all_gather"], result
        errors = result["errors"]
        for label in ("length", "types", "overlap", "op", "root"):
            kind, is_invalid, message = errors[label]
            assert kind == "InvalidArgument" and is_invalid, (label, errors[label])
        assert "got 4 elements, expected 3" in errors["length"][2]
        assert "float32" in errors["types"][2] and "float64" in errors["types"][2]
        assert "overlap" in errors["overlap"][2]
        assert "xor" in errors["op"][2]
        assert "root 2 is out of range" in errors["root"][2]
        assert errors["int8"][0] == "TypeError" and '"b"' in errors["int8"][2]
        assert errors["readonly"][0] == "TypeError" and "writable" in errors["readonly"][2]
        assert errors["strided"][0] == "TypeError" and "contiguous" in errors["strided"][2]
        assert errors["dlpack_readonly_output"][0] == "ValueError", errors["dlpack_readonly_output"]
        assert "read-only" in errors["dlpack_readonly_output"][2]
        for label in ("dlpack_negative_shape", "dlpack_overflowing_shape"):
            assert errors[label] and errors[label][0] == "ValueError", (label, errors[label])
            assert "is not memory that can exist" in errors[label][2], errors[label]
        assert result["dlpack_readonly_input"], result
        assert result["after_errors"], result
        assert result["closed"] == "the communicator is closed"


def test_mismatched_counts_raise_mismatch_error_naming_the_peer(tmp_path):
    outcomes = expect_success(launch(tmp_path, "mismatched", 2, timeout=120))
    for outcome in outcomes:
        result = outcome.result
        assert result["raised"] == "MismatchError", describe(outcomes)
        assert result["peer"] == 1 - outcome.rank
        assert "100" in result["message"] and "101" in result["message"]


class _DictStore:
    def __init__(self):
        self.values = {}

    def set(self, key, value):
        self.values[key] = value.encode()

    def get(self, key):
        return self.values[key]


def _node_ranks(store, size):
    from pcieipc.torch import ProcessGroupPcieipc, _Layout

    ranks = []
    for rank in range(size):
        backend = ProcessGroupPcieipc.__new__(ProcessGroupPcieipc)
        backend._store, backend._layout = store, _Layout(rank, size, size)
        ranks.append(backend)
    return ranks


def test_the_launchers_secret_stays_out_of_the_store(monkeypatch):
    launcher_secret = "0123456789abcdef0123456789abcdef"
    monkeypatch.setenv("PCIEIPC_JOB_SECRET", launcher_secret)
    store = _DictStore()
    first, second = (backend._rendezvous("host") for backend in _node_ranks(store, 2))
    assert first == second and first[1] == launcher_secret
    assert all(launcher_secret not in value.decode() for value in store.values.values()), store.values
    # Without one, the node's first rank makes a secret and the store carries it.
    monkeypatch.delenv("PCIEIPC_JOB_SECRET")
    store = _DictStore()
    first, second = (backend._rendezvous("host") for backend in _node_ranks(store, 2))
    assert first == second and len(first[1]) == 32 and first[1] != launcher_secret


def test_ranks_meet_with_the_launchers_secret_and_not_without_it(tmp_path):
    same = {"PCIEIPC_JOB_SECRET": "0123456789abcdef0123456789abcdef"}
    (tmp_path / "same").mkdir()
    (tmp_path / "other").mkdir()
    outcomes = expect_success(launch(tmp_path / "same", "secret_from_env", 2, timeout=120, env_of_rank=lambda r: same))
    assert [outcome.result.get("sum") for outcome in outcomes] == [[2.0] * 8] * 2, describe(outcomes)
    other = {"PCIEIPC_JOB_SECRET": "fedcba9876543210fedcba9876543210"}
    outcomes = launch(tmp_path / "other", "secret_from_env", 2, timeout=120, env_of_rank=lambda r: same if r == 0 else other)
    for outcome in outcomes:
        assert outcome.result.get("raised") == "RendezvousError", describe(outcomes)


def test_ddp_with_backend_and_hook_equals_gloo_after_200_steps(tmp_path):
    outcomes = expect_success(launch(tmp_path, "ddp", 2, timeout=400))
    for outcome in outcomes:
        result = outcome.result
        assert result["trained"], "the parameters did not move: the comparison would prove nothing"
        assert result["gloo"] and result["pcieipc-hook"] and result["pcieipc-group"], result


def test_two_nodes_of_two_ranks_equal_a_flat_gloo_group(tmp_path):
    outcomes = expect_success(
        launch(tmp_path, "hierarchical", 4, timeout=400, env_of_rank=lambda r: {"PCIEIPC_NODE": f"node{r // 2}"})
    )
    for outcome in outcomes:
        result = outcome.result
        assert result["local_size"] == 2 and result["intra_size"] == 2 and result["inter_size"] == 2, result
        assert result["checked"] >= 7 * 5 * 2 + 4 + 3, result
        assert result["mismatches"] == [], result["mismatches"]


def test_a_rank_killed_mid_training_makes_the_others_raise_naming_it(tmp_path):
    outcomes = launch(tmp_path, "killed", 3, timeout=180)
    victim = outcomes[-1]
    assert victim.returncode == -9, describe(outcomes)
    for outcome in outcomes[:-1]:
        result = outcome.result
        assert result.get("raised") is not None, describe(outcomes)
        assert "rank 2" in result["message"], result
        # The engine watches its peers' processes: a death is seen at once,
        # not after a timeout.
        assert result["seconds"] < 20, result


def test_a_bad_handoff_grid_is_refused_before_any_gpu_is_touched(monkeypatch):
    from pcieipc import CudaCommunicator, InvalidArgument
    from pcieipc.torch import _handoff_blocks

    # Checked before the GPU is opened: refused the same on a machine without one.
    for blocks in (0, 65, -1):
        with pytest.raises(InvalidArgument, match=f"handoff_blocks {blocks}: expected 1 to 64"):
            CudaCommunicator("never-joined", 0, 1, 0, handoff_blocks=blocks)
    monkeypatch.setenv("PCIEIPC_HANDOFF_BLOCKS", "many")
    with pytest.raises(InvalidArgument, match="PCIEIPC_HANDOFF_BLOCKS='many'"):
        _handoff_blocks()
    monkeypatch.setenv("PCIEIPC_HANDOFF_BLOCKS", "8")
    assert _handoff_blocks() == 8
    monkeypatch.delenv("PCIEIPC_HANDOFF_BLOCKS")
    assert _handoff_blocks() is None


def test_bad_copy_engine_settings_are_refused_before_any_gpu_is_touched(monkeypatch):
    from pcieipc import CudaCommunicator, InvalidArgument
    from pcieipc.torch import _bytes_env

    # Checked before the GPU is opened: refused the same on a machine without one.
    for chunk in (0, 15, (1 << 30) + 1, -4):
        with pytest.raises(InvalidArgument, match=f"copy_chunk_bytes {chunk}: expected 16 to 1073741824"):
            CudaCommunicator("never-joined", 0, 1, 0, copy_chunk_bytes=chunk)
    for threshold in (-1, "always", 2.5):
        with pytest.raises(InvalidArgument, match="copy_engines_from .*: expected bytes"):
            CudaCommunicator("never-joined", 0, 1, 0, copy_engines_from=threshold)
    monkeypatch.setenv("PCIEIPC_COPY_CHUNK", "1M")
    assert _bytes_env("PCIEIPC_COPY_CHUNK") == 1 << 20
    monkeypatch.setenv("PCIEIPC_COPY_CHUNK", "never")
    with pytest.raises(InvalidArgument, match="PCIEIPC_COPY_CHUNK='never': expected bytes with an optional K, M or G$"):
        _bytes_env("PCIEIPC_COPY_CHUNK")
    monkeypatch.setenv("PCIEIPC_COPY_ENGINES_FROM", "never")
    assert _bytes_env("PCIEIPC_COPY_ENGINES_FROM", never=True) == "never"
    monkeypatch.setenv("PCIEIPC_COPY_ENGINES_FROM", "2k")
    assert _bytes_env("PCIEIPC_COPY_ENGINES_FROM", never=True) == 2048
    monkeypatch.setenv("PCIEIPC_COPY_ENGINES_FROM", "lots")
    with pytest.raises(InvalidArgument, match='PCIEIPC_COPY_ENGINES_FROM=.lots.: expected bytes with an optional K, M or G, or "never"'):
        _bytes_env("PCIEIPC_COPY_ENGINES_FROM", never=True)
    monkeypatch.delenv("PCIEIPC_COPY_ENGINES_FROM")
    assert _bytes_env("PCIEIPC_COPY_ENGINES_FROM", never=True) is None
