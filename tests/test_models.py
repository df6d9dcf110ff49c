from pathlib import Path

import pytest
import torch

from posttrain.config import ModelSection
from posttrain.models import ModelLoadError, Policy, load_model, resolve_model_path


def test_tiny_random_is_seeded_and_uses_the_chat_template():
    policy = Policy.load(ModelSection(name="tiny-random"))
    assert policy.model.config.num_hidden_layers == 2
    text = policy.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")


def test_unknown_names_are_clear_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="unknown model 'smollm3'"):
        resolve_model_path("smollm3")
    with pytest.raises(ModelLoadError, match="no config.json"):
        resolve_model_path(str(tmp_path))


def test_a_run_directory_names_the_model_of_its_newest_checkpoint(tmp_path):
    import shutil

    run = tmp_path / "sft-run"
    for step in (2, 10):  # numeric order, not by name: step-10 is the newest
        shutil.copytree(resolve_model_path("tiny-random"), run / "checkpoints" / f"step-{step:06d}" / "model")
    (run / "checkpoints" / "step-000011.tmp" / "model").mkdir(parents=True)  # half-written: never taken
    assert resolve_model_path(str(run)) == str(run / "checkpoints" / "step-000010" / "model")
    policy = Policy.load(ModelSection(name=str(run)))
    assert policy.model.config.num_hidden_layers == 2
    empty = tmp_path / "no-checkpoint"
    (empty / "checkpoints").mkdir(parents=True)
    with pytest.raises(ModelLoadError, match="run directory without a complete checkpoint"):
        resolve_model_path(str(empty))


def test_lora_trains_only_adapters_and_reference_is_adapter_free():
    import torch

    cfg = ModelSection(name="tiny-random", lora={"enabled": True, "r": 2, "target_modules": ["q_proj", "v_proj"]})
    policy = Policy.load(cfg, need_reference=True)
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    # Move the adapters; the reference (adapters off) must not move with them.
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    mask = torch.ones_like(ids)
    ref_before = policy.reference_logprobs(ids, mask)
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.add_(0.5)
    assert torch.allclose(policy.reference_logprobs(ids, mask), ref_before)
    assert not torch.allclose(policy.logprobs(ids, mask)[0], ref_before)


def test_bad_lora_target_is_named():
    with pytest.raises(ValueError, match="not found in the model"):
        Policy.load(ModelSection(name="tiny-random", lora={"enabled": True, "target_modules": ["c_attn"]}))


def test_no_reference_without_kl():
    policy = Policy.load(ModelSection(name="tiny-random"))
    with pytest.raises(RuntimeError, match="without a reference"):
        import torch

        policy.reference_logprobs(torch.tensor([[1, 2]]), torch.ones(1, 2, dtype=torch.long))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_frozen_weights_packed_once_give_the_same_reference_logprobs(lora):
    from posttrain.models.packed_linear import packing_available

    if not packing_available():
        pytest.skip("this torch build has no oneDNN packed linear")
    ids = torch.randint(0, 49152, (2, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    results = []
    for pack in (False, True):
        torch.manual_seed(0)
        policy = Policy.load(ModelSection(name="tiny-random", pack_weights=pack, lora={"enabled": lora, "r": 4}),
                             need_reference=True)
        frozen = policy._reference if not lora else policy.model
        packed = [m for m in frozen.modules() if type(m) is torch.nn.Linear and "forward" in vars(m)]
        assert bool(packed) == pack and all(not m.weight.requires_grad for m in packed)
        results.append(policy.reference_logprobs(ids, mask))
        # Training still differentiates through the packed layers' live weights.
        lp, _ = policy.logprobs(ids, mask)
        lp.sum().backward()
        assert all(p.grad is not None for p in policy.trainable_parameters())
    torch.testing.assert_close(results[1], results[0], atol=1e-4, rtol=0)


def test_onednn_packing_ops_exist_where_onednn_does():
    """The packed decode path calls private ops (torch.ops.mkldnn._reorder_linear_weight and
    _linear_pointwise). A torch upgrade that removes them must fail here, not silently fall back to
    the 2-3x slower plain weights."""
    import platform

    from posttrain.models.packed_linear import packing_available

    if platform.machine() not in ("x86_64", "AMD64") or not torch.backends.mkldnn.is_available():
        pytest.skip("oneDNN packing is an x86 CPU path; this torch build or machine has no oneDNN")
    assert packing_available(), ("torch.ops.mkldnn._reorder_linear_weight/_linear_pointwise are gone or wrong in "
                                 f"torch {torch.__version__}: port posttrain.models.packed_linear")


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc/self/maps")
def test_loaded_weights_do_not_live_in_the_checkpoint_files_memory_map():
    # Training writes every parameter in place: on a copy-on-write map of the file, the first write
    # to each page would fault it in and copy it (seconds on the first optimiser step).
    path = Path(resolve_model_path("tiny-random")).resolve()
    model = load_model("tiny-random")
    mapped = [line for line in Path("/proc/self/maps").read_text().splitlines() if str(path) in line]
    assert mapped == [], f"{model.name_or_path}'s weights are still a view of its file"
