// llama2.c checkpoints (Karpathy's run.c format), fp32 only: the legacy export (version 0: a
// header of 7 int32, then the arrays in run.c's order including the unused RoPE tables) and the
// version 1 export ("ak42" magic, header padded to 256 bytes, shared-classifier byte, arrays in
// export.py's v1 order). Version 2 (Q8_0) is refused with Unsupported.
//
// Tensors are exposed under Hugging Face Llama names and shapes ([out_features, in_features]),
// each a zero-copy view into the mapping; lm_head.weight is the embedding itself when the
// classifier is shared. The q/k projection rows stay in llama2.c's order: its RoPE rotates
// adjacent pairs (2i, 2i+1) of each head, like Meta's checkpoints and GGUF llama files, not the
// half-split order of Hugging Face's transformers. The model applies the matching RoPE; this
// reader never permutes or copies weights.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "core/status.h"
#include "io/weight_source.h"

namespace tachyon {

struct Llama2cConfig {
  int version = 0;  // 0: legacy export, 1: "ak42" v1 export
  int dim = 0;          // model width (hidden_size)
  int hidden_dim = 0;   // feed-forward width (intermediate_size)
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int vocab_size = 0;   // always positive here (the legacy sign flag is decoded)
  int seq_len = 0;      // trained context length
  bool shared_classifier = true;  // lm_head is the token embedding

  int head_size() const { return dim / n_heads; }
  int kv_dim() const { return n_kv_heads * head_size(); }
  // Fixed by run.c (not stored in the file).
  static constexpr float kRmsNormEps = 1e-5f;
  static constexpr float kRopeTheta = 10000.0f;
};

class Llama2cCheckpoint : public WeightSource {
 public:
  // CorruptFile (with expected vs actual byte counts) when the size does not match the header;
  // Unsupported for version 2 and unknown versions.
  static Result<std::shared_ptr<Llama2cCheckpoint>> open(const std::string& path);

  const std::string& path() const { return path_; }
  const Llama2cConfig& config() const { return config_; }
  const std::shared_ptr<MappedFile>& mapped_file() const { return file_; }

  std::vector<std::string> tensor_names() const override;
  const TensorMeta* find(const std::string& name) const override;
  Result<Tensor> tensor(const std::string& name) const override;
  std::string describe() const override;

 private:
  Llama2cCheckpoint() = default;
  Status parse();
  // Registers tensor `name` ([shape] f32) stored at `byte_offset`.
  void add(const std::string& name, std::vector<int64_t> shape, uint64_t byte_offset);

  std::string path_;
  std::shared_ptr<MappedFile> file_;
  Llama2cConfig config_;
  std::vector<TensorMeta> metas_;
  std::vector<uint64_t> offsets_;  // byte offset of each tensor, parallel to metas_
  std::map<std::string, size_t> index_;
};

// The llama2.c tokenizer beside a checkpoint: `tokenizer.bin` in the same directory, else
// `tok{vocab_size}.bin` (when vocab_size > 0), else the only `tok*.bin` there. NotFound when
// there is none; InvalidArgument when several `tok*.bin` fit and none is preferred. The
// tokenizer module parses the file.
Result<std::string> find_llama2c_tokenizer(const std::string& checkpoint_path, int vocab_size = 0);

}  // namespace tachyon
