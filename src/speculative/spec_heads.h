// Proposal heads over the target's own features (the head proposer, head_proposer.h): K small
// residual blocks that continue the target's final hidden state one token at a time, each reading
// the hidden state the block before left and the embedding of the token proposed before it (a
// regressive connection, as in Clover), and sharing the target's embedding table and LM head.
// Head i (0-based) turns (x_i, t_i) into (x_{i+1}, t_{i+1}):
//
//   n  = rms_norm(x_i, in_norm_i)
//   gu = x_proj_i · n + e_proj_i · embed(t_i)          [2 * ffn]: gate half, then up half
//   x_{i+1} = x_i + down_proj_i · (silu(gate) * up)
//   t_{i+1} = argmax lm_head(rms_norm(x_{i+1}, out_norm_i))
//
// with x_0 the target's final hidden row (after its final norm) at the position that sampled the
// sequence's last token t_0.
//
// The file: one safetensors file whose "__metadata__" has format = "tachyon-spec-heads",
// version = "1", num_heads, hidden_size, ffn_size, vocab_size (the target's) and rms_norm_eps, and
// for each head i the tensors heads.<i>.in_norm.weight [hidden], heads.<i>.x_proj.weight
// [2 * ffn, hidden], heads.<i>.e_proj.weight [2 * ffn, hidden], heads.<i>.down_proj.weight
// [hidden, ffn] and heads.<i>.out_norm.weight [hidden], in f32, f16 or bf16; nothing else.
// tools/train/train_heads.py writes it.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "model/model_config.h"

namespace tachyon {

struct SpecHead {
  Tensor in_norm;    // [hidden]
  Tensor x_proj;     // [2 * ffn, hidden]
  Tensor e_proj;     // [2 * ffn, hidden]
  Tensor down_proj;  // [hidden, ffn]
  Tensor out_norm;   // [hidden]
};

struct SpecHeads {
  int hidden_size = 0;
  int ffn_size = 0;
  int vocab_size = 0;
  float rms_norm_eps = 1e-5f;
  std::vector<SpecHead> heads;  // K of them, on the target's device
  std::string path;

  static constexpr int kMaxHeads = 32;
};

// Reads and checks heads for `target` (a file, or a directory holding heads.safetensors): the
// format and version, the sizes against the target's hidden size and vocabulary, every tensor's
// shape and dtype, every value finite. The tensors are copied to `device`. Errors name the file
// and what is wrong.
Result<SpecHeads> load_spec_heads(const std::string& path, const ModelConfig& target, Device device);

}  // namespace tachyon
