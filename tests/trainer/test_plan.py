"""`hybridflow plan`: a run config mapped onto the memory plan, and the command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.models import build_tiny_causal_lm
from hybridflow.planning import ModelShape, engine_weight_bytes, fsdp_shard_bytes, parameter_shapes
from tests.trainer._runs import write_task
from trainer import main as trainer_main
from trainer.config import load_config
from trainer.plan import VLLM_CPU_RUNTIME_BYTES, main, plan_memory, policy_shape

REPO_ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_task(tmp_path_factory.mktemp("plan_task"))


def _overrides(task: Path, *extra: str) -> list[str]:
    return [
        f"data.train_files=[{task / 'train.parquet'}]",
        "data.max_prompt_length=16",
        "data.max_response_length=48",
        "data.train_batch_size=16",
        "rollout.n=4",
        "rollout.kv_cache_bytes=100000000",
        "resharding.bucket_bytes=4000000",
        "model.tiny.vocab_size=5000",
        "model.tiny.hidden_size=128",
        "model.tiny.num_heads=4",
        "model.tiny.num_kv_heads=2",
        "model.tiny.intermediate_size=256",
        "actor.ppo_mini_batch_size=64",
        "actor.ppo_micro_batch_size=8",
        *extra,
    ]


def _phases(config) -> dict:
    (process,) = plan_memory(config).processes
    return {phase.phase: phase for phase in process.phases}


def test_config_values_and_shard_sizes_reach_the_plan(task: Path) -> None:
    config = load_config(
        None, _overrides(task, "rollout.max_num_seqs=1", "rollout.max_num_batched_tokens=16")
    )
    phases = _phases(config)
    # A small engine batch keeps sampling below the weight push. Its gather memory is the 4 MB ring
    # buffer alone: the largest tensors (embedding and head, 5000 x 128 fp32 = 2.56 MB) fit in it.
    generation = phases["generation"]
    assert generation.moment == "weight push"
    assert generation.components["KV cache"] == 100_000_000
    assert generation.components["gather buffer"] == 4_000_000
    # The actor's shard is its real parameter shapes split over the 2 ranks of the default pool.
    shard = fsdp_shard_bytes(parameter_shapes(policy_shape(config)).values(), 2, 4)
    assert phases["update"].components["actor params"] == shard
    assert phases["update"].components["actor optimizer"] == 2 * shard


def test_a_tensor_larger_than_the_bucket_gets_its_own_buffer(task: Path) -> None:
    config = load_config(None, _overrides(task, "resharding.bucket_bytes=1000000"))
    # The embedding and the head (5000 x 128 fp32) are each gathered whole into their own allocation.
    assert _phases(config)["generation"].components["gather buffer"] == 1_000_000 + 5000 * 128 * 4


def test_the_peak_phase_follows_the_config(task: Path) -> None:
    big_cache = load_config(None, _overrides(task, "rollout.kv_cache_bytes=4000000000"))
    assert plan_memory(big_cache).processes[0].peak().phase == "generation"
    big_batches = load_config(None, _overrides(task, "actor.ppo_micro_batch_size=32"))
    peak = plan_memory(big_batches).processes[0].peak()
    # 32 rows x 64 tokens: the logits of 1024 tokens over 5000 words under grad (20 bytes each).
    assert (peak.phase, peak.moment) == ("update", "head backward, 2048 tokens")
    assert peak.components["logits"] == 1024 * 5000 * 20


def test_offload_frees_the_device_only_on_gpu(task: Path) -> None:
    offload = ("actor.optimizer_offload=true", "actor.param_offload=true")
    on_cpu = _phases(load_config(None, _overrides(task, *offload)))["generation"].components
    on_gpu = _phases(load_config(None, _overrides(task, *offload, "resource.use_gpu=true")))
    # On CPU the moves are no-ops; on GPU the optimizer state leaves before the push and the shards
    # after it, and the sleeping engine's weights are off the device while training.
    assert on_cpu["actor optimizer"] > 0
    assert on_gpu["generation"].components["actor optimizer"] == 0
    assert on_gpu["generation"].components["engine weights"] > 0
    assert on_gpu["update"].components.get("engine weights", 0) == 0


def test_kept_kv_cache_and_the_reference_batching(task: Path) -> None:
    kept = _phases(load_config(None, _overrides(task, "resharding.free_kv_cache=false")))
    assert kept["update"].components["KV cache"] == 100_000_000
    assert "KV cache" not in _phases(load_config(None, _overrides(task)))["update"].components
    # The reference forward takes the ref section's rows per micro-batch (3 x 64 tokens), the
    # log-prob forward (two optimizer steps per batch need one) the actor's (8 rows by default).
    ref_run = _phases(
        load_config(
            None,
            _overrides(
                task,
                "actor.use_kl_loss=true",
                "ref.forward_micro_batch_size=3",
                "actor.ppo_mini_batch_size=32",
            ),
        )
    )
    assert ref_run["ref"].moment == "forward, 192 tokens"
    assert ref_run["log_prob"].moment == "forward, 512 tokens"


def test_cli_prints_the_table_and_exits_0(task: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*_overrides(task), "--device-memory", "8GiB"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "actor_rollout: 2 rank(s); per rank, host memory of the process (cpu)"
    assert "generation" in out.splitlines()[1] and "update" in out.splitlines()[1]
    assert "peak: " in out and "fits in 8.00 GiB" in out
    assert main([*_overrides(task), "--device-memory", "100MiB"]) == 1
    assert "does NOT fit in 100.0 MiB" in capsys.readouterr().out


def test_cli_names_the_bad_key(task: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_overrides(task, "actor.ppo_micro_batch_size=7")) == 2
    assert "actor.ppo_micro_batch_size: 7 * data-parallel world 2 does not divide" in capsys.readouterr().err
    assert main(_overrides(task, f"model.path={tmp_path}")) == 2
    assert f"model.path: '{tmp_path / 'config.json'}' not found" in capsys.readouterr().err


def test_hybridflow_plan_and_python_m_trainer_plan(task: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["hybridflow", "plan", *_overrides(task)])
    with pytest.raises(SystemExit) as exit_info:
        trainer_main.cli()
    assert exit_info.value.code == 0
    assert "peak: " in capsys.readouterr().out
    result = subprocess.run(
        [sys.executable, "-m", "trainer.plan", *_overrides(task)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "peak: " in result.stdout


def test_a_teacher_adds_its_shard_and_its_forward(task: Path, tmp_path: Path) -> None:
    # A teacher of its own shape (3 layers, hidden 64): only its config.json is read.
    teacher_model = build_tiny_causal_lm(vocab_size=5000, hidden_size=64, num_layers=3, intermediate_size=96)
    teacher_model.config.save_pretrained(tmp_path / "teacher")
    shapes = parameter_shapes(ModelShape.from_hf_config(teacher_model.config.to_dict())).values()
    keys = [f"teacher.path={tmp_path / 'teacher'}", "teacher.forward_micro_batch_size=2"]
    colocated = _phases(load_config(None, _overrides(task, *keys)))
    # In the actor's processes: its shard over the 2 ranks in every phase, and a forward of 2 rows x 64 tokens.
    assert colocated["teacher"].moment == "forward, 128 tokens"
    assert colocated["update"].components["teacher params"] == fsdp_shard_bytes(shapes, 2, 4)
    pool = ["resource.pools={teacher_pool: {nodes: 1, slots_per_node: 1}}", "resource.placement={teacher: teacher_pool}"]
    actor, teacher = plan_memory(load_config(None, _overrides(task, *keys, *pool))).processes
    assert (actor.roles, teacher.roles, teacher.ranks) == ("actor_rollout", "teacher", 1)
    assert all("teacher params" not in phase.components for phase in actor.phases)
    by_phase = {phase.phase: phase for phase in teacher.phases}
    # On a pool of its own: the whole model on its one rank, in every phase; idle while the actor trains.
    whole = fsdp_shard_bytes(shapes, 1, 4)
    assert all(phase.components["teacher params"] == whole for phase in teacher.phases)
    assert (by_phase["update"].moment, by_phase["update"].components) == ("idle", {"teacher params": whole})
    assert by_phase["teacher"].moment == "forward, 128 tokens"


def test_a_rollout_pool_of_its_own_holds_the_engine_and_keeps_it(task: Path) -> None:
    pool = ["resource.pools={rollout_pool: {nodes: 1, slots_per_node: 1}}", "resource.placement={rollout: rollout_pool}"]
    config = load_config(None, _overrides(task, "rollout.engine=vllm", *pool))
    actor, rollout = plan_memory(config).processes
    assert (actor.roles, actor.ranks, rollout.roles, rollout.ranks) == ("actor_rollout", 2, "rollout", 1)
    # The actor's processes hold no engine; in generation they gather each tensor into the 4 MB buffer
    # and rank 0 packs it into the 4 MB bucket it broadcasts. They do not sample.
    engine_parts = {"engine weights", "engine runtime", "KV cache", "engine reload copies", "receive bucket"}
    assert all(not engine_parts & set(phase.components) for phase in actor.phases)
    by_phase = {phase.phase: phase for phase in actor.phases}
    assert by_phase["generation"].moment == "weight push"
    assert by_phase["generation"].components["gather buffer"] == 4_000_000
    assert by_phase["generation"].components["send bucket"] == 4_000_000
    # The engine's one rank holds the whole model and its 100 MB KV cache in every phase: nothing else
    # runs there, so nothing is released between generations (colocated, the cache goes while training).
    weights = engine_weight_bytes(policy_shape(config), 1, 4, host_prepack=True)
    for phase in rollout.phases:
        assert phase.components["engine weights"] == weights
        assert phase.components["KV cache"] == 100_000_000
        assert "actor params" not in phase.components
    by_phase = {phase.phase: phase for phase in rollout.phases}
    assert by_phase["update"].moment == "idle"
    assert by_phase["update"].components == {
        "engine weights": weights,
        "engine runtime": VLLM_CPU_RUNTIME_BYTES,
        "KV cache": 100_000_000,
    }
    # It receives one bucket at a time; a tensor larger than the bucket (the 5000 x 128 fp32 embedding
    # and head, 2.56 MB, against a 1 MB bucket) arrives alone, at its size. (A small engine batch keeps
    # sampling below the push, so the plan shows the push.)
    small_batch = ("rollout.max_num_seqs=1", "rollout.max_num_batched_tokens=16")
    for bucket, received in ((4_000_000, 4_000_000), (1_000_000, 5000 * 128 * 4)):
        keys = _overrides(task, "rollout.engine=vllm", f"resharding.bucket_bytes={bucket}", *small_batch, *pool)
        generation = plan_memory(load_config(None, keys)).processes[1].phases[0]
        assert (generation.phase, generation.moment) == ("generation", "weight push")
        assert generation.components["receive bucket"] == received
    # The HF engine keeps no cache between generations, wherever it runs.
    hf = load_config(None, _overrides(task, "rollout.engine=hf", *pool))
    _, hf_rollout = plan_memory(hf).processes
    assert {phase.phase for phase in hf_rollout.phases if "KV cache" in phase.components} == {"generation"}

