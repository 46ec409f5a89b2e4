"""An LFM2-shaped GGUF (a hybrid: short-convolution layers with a recurrent state, and attention layers with a KV
cache) with random weights and a byte-level vocabulary, for capturing llama-server's load lines of a hybrid model.
Run: python make_lfm2_gguf.py OUT.gguf"""

import sys

import gguf
import numpy as np

N_EMBD, N_FF, N_HEAD, N_HEAD_KV, L_CACHE = 256, 512, 4, 2, 3
HEAD_DIM = N_EMBD // N_HEAD
ATTENTION = [False, False, True, False, False, True]  # which layers attend; the others convolve
tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁" + c for c in "abcdefghijklmnopqrstuvwxyz"]
types = [2, 3, 3] + [6] * 256 + [1] * 26
n_vocab = len(tokens)
rng = np.random.default_rng(0)


def w(*shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) * 0.02).astype(np.float32)


def ones(n: int) -> np.ndarray:
    return np.ones(n, dtype=np.float32)


out = gguf.GGUFWriter(sys.argv[1], "lfm2")
out.add_name("lfm2-shaped, random weights")
out.add_context_length(4096)
out.add_embedding_length(N_EMBD)
out.add_block_count(len(ATTENTION))
out.add_feed_forward_length(N_FF)
out.add_head_count(N_HEAD)
out.add_head_count_kv([N_HEAD_KV if a else 0 for a in ATTENTION])  # 0: a recurrent (convolution) layer
out.add_layer_norm_rms_eps(1e-5)
out.add_rope_freq_base(1e6)
out.add_uint32("lfm2.shortconv.l_cache", L_CACHE)
out.add_file_type(0)
out.add_tokenizer_model("llama")
out.add_token_list(tokens)
out.add_token_scores([0.0] * n_vocab)
out.add_token_types(types)
out.add_bos_token_id(1)
out.add_eos_token_id(2)
out.add_unk_token_id(0)
out.add_tensor("token_embd.weight", w(n_vocab, N_EMBD))
out.add_tensor("token_embd_norm.weight", ones(N_EMBD))
for i, attends in enumerate(ATTENTION):
    b = f"blk.{i}."
    out.add_tensor(b + "attn_norm.weight", ones(N_EMBD))
    out.add_tensor(b + "ffn_norm.weight", ones(N_EMBD))
    out.add_tensor(b + "ffn_gate.weight", w(N_FF, N_EMBD))
    out.add_tensor(b + "ffn_up.weight", w(N_FF, N_EMBD))
    out.add_tensor(b + "ffn_down.weight", w(N_EMBD, N_FF))
    if attends:
        out.add_tensor(b + "attn_q.weight", w(N_EMBD, N_EMBD))
        out.add_tensor(b + "attn_k.weight", w(N_HEAD_KV * HEAD_DIM, N_EMBD))
        out.add_tensor(b + "attn_v.weight", w(N_HEAD_KV * HEAD_DIM, N_EMBD))
        out.add_tensor(b + "attn_output.weight", w(N_EMBD, N_EMBD))
        out.add_tensor(b + "attn_q_norm.weight", ones(HEAD_DIM))
        out.add_tensor(b + "attn_k_norm.weight", ones(HEAD_DIM))
    else:
        out.add_tensor(b + "shortconv.conv.weight", w(N_EMBD, L_CACHE))
        out.add_tensor(b + "shortconv.in_proj.weight", w(3 * N_EMBD, N_EMBD))
        out.add_tensor(b + "shortconv.out_proj.weight", w(N_EMBD, N_EMBD))
out.write_header_to_file()
out.write_kv_data_to_file()
out.write_tensors_to_file()
out.close()
