"""The method posttrain adds to vLLM's worker, to load new weights into the running engine.

vLLM instantiates this class inside its worker (``worker_extension_cls``) and calls its methods by
name through ``LLM.collective_rpc``: a named method, so nothing is pickled and vLLM's insecure
serialisation stays off. This module must not import vLLM or posttrain's heavier modules: the
worker imports it by its dotted name.
"""

from __future__ import annotations


class WeightSync:
    """Mixed into vLLM's worker; ``self.model_runner.model`` is the engine's model."""

    def posttrain_load_weights(self, weights: list) -> int:
        """Copy ``weights`` (``(hf_name, tensor)`` pairs, Hugging Face parameter names) into the
        engine's model in place; returns how many tensors were given.

        The model runner's in-place reload runs the model's own ``load_weights`` (which maps the
        names onto vLLM's fused qkv and gate_up layers) and then redoes the processing that
        followed the first load: the CPU backend repacks linear weights for its kernels, after
        which a plain ``load_weights`` would no longer find its weight loaders.
        """
        self.model_runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        _retie_output_embeddings(self.model_runner.get_model())
        return len(weights)


def _retie_output_embeddings(model) -> None:
    """Point a tied LM head at the reloaded input embeddings and redo its kernel preparation.

    A tied head receives no tensor of its own (the checkpoint has none), so the reload restores
    its previous one; on CPU that includes the head's packed copy of the old embeddings.
    """
    config = getattr(model, "config", None)
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if not getattr(config, "tie_word_embeddings", False) or head is None or embed is None:
        return
    head.weight = embed.weight
    method = getattr(head, "quant_method", None)
    if method is not None:
        method.process_weights_after_loading(head)
