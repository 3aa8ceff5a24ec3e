#include "model/quantized_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <algorithm>
#include <cmath>
#include <memory>

#include "io/json_file.h"
#include "io/safetensors_writer.h"
#include "quant/quantize.h"

namespace tachyon {

namespace fs = std::filesystem;

namespace {

// Files of a model directory that travel with its weights unchanged.
constexpr const char* kCopiedFiles[] = {
    "tokenizer.json",     "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
    "tokenizer.model",    "vocab.json",            "merges.txt",              "added_tokens.json",
    "chat_template.json", "chat_template.jinja",
};

Weight packed_weight(QuantWeight q) {
  Weight w;
  w.quant = std::make_shared<const QuantWeight>(std::move(q));
  return w;
}

Result<std::optional<Weight>> read_int4(const WeightSource& source, const CheckpointQuantization& q,
                                        const std::string& module, int64_t out, int64_t in) {
  if (!source.has(module + ".qweight")) return std::optional<Weight>();  // stored dense
  auto tensor = [&](const char* suffix) -> Result<Tensor> {
    const std::string name = module + "." + suffix;
    if (!source.has(name)) {
      return make_error(ErrorCode::kNotFound, "tensor '{}' is missing ({}.qweight is present)", name, module);
    }
    return source.tensor(name);
  };
  TACHYON_ASSIGN_OR_RETURN(Tensor qweight, tensor("qweight"));
  TACHYON_ASSIGN_OR_RETURN(Tensor qzeros, tensor("qzeros"));
  TACHYON_ASSIGN_OR_RETURN(Tensor scales, tensor("scales"));
  Tensor g_idx;  // GPTQ only; optional
  if (q.method == CheckpointQuantMethod::kGptq && source.has(module + ".g_idx")) {
    TACHYON_ASSIGN_OR_RETURN(g_idx, tensor("g_idx"));
  }
  const GptqZeros zeros = q.gptq_format == GptqFormat::kV1 ? GptqZeros::kStoredMinusOne : GptqZeros::kStored;
  Result<QuantWeight> w = q.method == CheckpointQuantMethod::kAwqGemm
                              ? unpack_awq_gemm(qweight, qzeros, scales, out, in, q.group_size)
                              : unpack_gptq(qweight, qzeros, scales, g_idx, out, in, q.group_size, zeros);
  if (!w.ok()) return w.status().with_context(module);
  return std::optional<Weight>(packed_weight(std::move(w).value()));
}

Result<std::optional<Weight>> read_int8(const WeightSource& source, const std::string& module, int64_t out,
                                        int64_t in) {
  const TensorMeta* meta = source.find(module + ".weight");
  if (meta == nullptr || !meta->supported || meta->dtype != DType::kI8) return std::optional<Weight>();
  TACHYON_ASSIGN_OR_RETURN(Tensor weight, source.tensor(module + ".weight"));
  if (!source.has(module + ".weight_scale")) {
    return make_error(ErrorCode::kNotFound, "{}: tensor '{}.weight_scale' is missing (the weight is int8)", module,
                      module);
  }
  TACHYON_ASSIGN_OR_RETURN(Tensor scale, source.tensor(module + ".weight_scale"));
  auto w = unpack_int8_channel(weight, scale, out, in);
  if (!w.ok()) return w.status().with_context(module);
  return std::optional<Weight>(packed_weight(std::move(w).value()));
}

Result<std::optional<Weight>> read_fp8(const WeightSource& source, const std::string& module, int64_t out,
                                       int64_t in) {
  const TensorMeta* meta = source.find(module + ".weight");
  if (meta == nullptr || !meta->supported || meta->dtype != DType::kF8E4M3) return std::optional<Weight>();
  TACHYON_ASSIGN_OR_RETURN(Tensor weight, source.tensor(module + ".weight"));
  if (!source.has(module + ".weight_scale")) {
    return make_error(ErrorCode::kNotFound, "{}: tensor '{}.weight_scale' is missing (the weight is fp8)", module,
                      module);
  }
  TACHYON_ASSIGN_OR_RETURN(Tensor scale, source.tensor(module + ".weight_scale"));
  auto w = unpack_fp8_channel(weight, scale, out, in);
  if (!w.ok()) return w.status().with_context(module);
  return std::optional<Weight>(packed_weight(std::move(w).value()));
}

// A module's static activation scale, <module>.input_scale: one finite, positive value (shape []
// or [1], any float dtype), set on its packed weight.
Status read_input_scale(const WeightSource& source, const CheckpointQuantization& q, const std::string& module,
                        std::optional<Weight>& w) {
  if (!w || !w->quant) return Status::Ok();
  if (std::find(q.unscaled_modules.begin(), q.unscaled_modules.end(), module) != q.unscaled_modules.end()) {
    return Status::Ok();  // a group without static scales names it
  }
  const std::string name = module + ".input_scale";
  if (!source.has(name)) {
    return make_error(ErrorCode::kNotFound, "{}: tensor '{}' is missing (the config gives static activation scales)",
                      module, name);
  }
  TACHYON_ASSIGN_OR_RETURN(Tensor t, source.tensor(name));
  const bool float_dtype = t.dtype() == DType::kF32 || t.dtype() == DType::kF16 || t.dtype() == DType::kBF16;
  if (t.numel() != 1 || t.dim() > 1 || !float_dtype) {
    return make_error(ErrorCode::kCorruptFile, "{}: '{}' is {} {}; expected one float", module, name,
                      dtype_name(t.dtype()), t.shape_string());
  }
  const float scale = t.to_f32().data<float>()[0];
  if (!std::isfinite(scale) || scale <= 0.0f) {
    return make_error(ErrorCode::kCorruptFile, "{}: '{}' is {}; expected a finite scale > 0", module, name, scale);
  }
  auto scaled = std::make_shared<QuantWeight>(*w->quant);
  scaled->input_scale = scale;
  w->quant = std::move(scaled);
  return Status::Ok();
}

Result<std::optional<Weight>> read_ternary(const WeightSource& source, const CheckpointQuantization& q,
                                           const std::string& module, int64_t out, int64_t in) {
  if (!source.has(module + ".weight_packed")) return std::optional<Weight>();  // stored dense
  TACHYON_ASSIGN_OR_RETURN(Tensor packed, source.tensor(module + ".weight_packed"));
  if (!source.has(module + ".weight_scale")) {
    return make_error(ErrorCode::kNotFound, "{}: tensor '{}.weight_scale' is missing ({}.weight_packed is present)",
                      module, module, module);
  }
  TACHYON_ASSIGN_OR_RETURN(Tensor scale, source.tensor(module + ".weight_scale"));
  auto w = unpack_ternary(packed, scale, out, in, q.group_size);
  if (!w.ok()) return w.status().with_context(module);
  return std::optional<Weight>(packed_weight(std::move(w).value()));
}

// What a checkpoint is made of, in memory until written.
class TensorList {
 public:
  TensorList(CheckpointQuantization& quantization) : q_(quantization) {}

  void add(const std::string& name, const Tensor& t) {
    if (t.defined()) tensors_.push_back({name, t});
  }
  // A linear layer: dense as <module>.weight (listed as left dense when `listed`), or packed in
  // the checkpoint's layout.
  Status add_linear(const std::string& module, const Weight& w, bool listed) {
    if (!w.quant) {
      add(module + ".weight", w.dense);
      if (listed) q_.dense_modules.push_back(module);
      return Status::Ok();
    }
    const QuantWeight& qw = *w.quant;
    if (qw.format == QuantFormat::kInt4Group && q_.method == CheckpointQuantMethod::kAwqGemm) {
      if (q_.group_size == 0) q_.group_size = qw.group_size;
      if (qw.group_size != q_.group_size) {
        return make_error(ErrorCode::kInvalidArgument, "{}: group size {} differs from the checkpoint's {}", module,
                          qw.group_size, q_.group_size);
      }
      auto t = pack_awq_gemm(qw);
      if (!t.ok()) return t.status().with_context(module);
      add(module + ".qweight", t->qweight);
      add(module + ".qzeros", t->qzeros);
      add(module + ".scales", t->scales);
      return Status::Ok();
    }
    if ((qw.format == QuantFormat::kInt8Channel && q_.method == CheckpointQuantMethod::kInt8Channel) ||
        (qw.format == QuantFormat::kW8A8 && q_.method == CheckpointQuantMethod::kW8A8) ||
        (qw.format == QuantFormat::kFp8Channel && q_.method == CheckpointQuantMethod::kFp8Channel)) {
      const Int8ChannelTensors t = pack_int8_channel(qw);
      add(module + ".weight", t.weight);
      add(module + ".weight_scale", t.weight_scale);
      if (qw.format != QuantFormat::kInt8Channel) {
        // A static activation scale as <module>.input_scale; the modules without one are listed
        // (a config group of their own once some module has one).
        if (qw.input_scale > 0.0f) {
          q_.static_activations = true;
          Tensor scale = Tensor::empty({1}, DType::kF32);
          scale.data<float>()[0] = qw.input_scale;
          add(module + ".input_scale", scale);
        } else {
          q_.unscaled_modules.push_back(module);
        }
      }
      return Status::Ok();
    }
    if (qw.format == QuantFormat::kTernary && q_.method == CheckpointQuantMethod::kTernary) {
      if (q_.group_size == 0) q_.group_size = qw.group_size;
      if (qw.group_size != q_.group_size) {
        return make_error(ErrorCode::kInvalidArgument, "{}: group size {} differs from the checkpoint's {}", module,
                          qw.group_size, q_.group_size);
      }
      add(module + ".weight_packed", qw.packed);
      add(module + ".weight_scale", qw.scales);
      return Status::Ok();
    }
    return make_error(ErrorCode::kUnsupported, "{}: {} weights cannot be written into a {} checkpoint", module,
                      quant_format_name(qw.format), q_.describe());
  }
  const std::vector<NamedTensor>& tensors() const { return tensors_; }

 private:
  CheckpointQuantization& q_;
  std::vector<NamedTensor> tensors_;
};

Status write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.flush();
  if (!f) return make_error(ErrorCode::kIo, "{}: cannot write the file", path.string());
  return Status::Ok();
}

}  // namespace

Result<std::optional<Weight>> read_quantized_linear(const WeightSource& source, const CheckpointQuantization& q,
                                                    const std::string& module, int64_t out, int64_t in) {
  switch (q.method) {
    case CheckpointQuantMethod::kNone: return std::optional<Weight>();
    case CheckpointQuantMethod::kAwqGemm:
    case CheckpointQuantMethod::kGptq: return read_int4(source, q, module, out, in);
    case CheckpointQuantMethod::kInt8Channel: return read_int8(source, module, out, in);
    case CheckpointQuantMethod::kFp8Channel: {
      TACHYON_ASSIGN_OR_RETURN(std::optional<Weight> w, read_fp8(source, module, out, in));
      if (q.static_activations) TACHYON_RETURN_IF_ERROR(read_input_scale(source, q, module, w));
      return w;
    }
    case CheckpointQuantMethod::kTernary: return read_ternary(source, q, module, out, in);
    case CheckpointQuantMethod::kW8A8: {
      // The same stored weight; its activations are quantized when the layer runs.
      TACHYON_ASSIGN_OR_RETURN(std::optional<Weight> w, read_int8(source, module, out, in));
      if (w && w->quant) {
        auto q8 = std::make_shared<QuantWeight>(*w->quant);
        q8->format = QuantFormat::kW8A8;
        w->quant = std::move(q8);
      }
      if (q.static_activations) TACHYON_RETURN_IF_ERROR(read_input_scale(source, q, module, w));
      return w;
    }
  }
  return std::optional<Weight>();
}

Result<SavedCheckpoint> save_quantized_checkpoint(const SaveCheckpointOptions& options, const ModelConfig& config,
                                                  const ModelWeights& weights) {
  const fs::path source(options.source_dir), out(options.out_dir);
  std::error_code ec;
  if (options.method != CheckpointQuantMethod::kAwqGemm && options.method != CheckpointQuantMethod::kInt8Channel &&
      options.method != CheckpointQuantMethod::kW8A8 && options.method != CheckpointQuantMethod::kFp8Channel &&
      options.method != CheckpointQuantMethod::kTernary) {
    return make_error(ErrorCode::kInvalidArgument,
                      "{}: checkpoints are written as AWQ int4, int8, w8a8, fp8 or ternary only", options.out_dir);
  }
  if (fs::exists(out, ec) && fs::equivalent(source, out, ec)) {
    return make_error(ErrorCode::kInvalidArgument, "{}: the output directory is the source model's; choose another",
                      options.out_dir);
  }
  if (fs::exists(out / "model.safetensors.index.json", ec)) {
    return make_error(ErrorCode::kInvalidArgument, "{}: holds a sharded checkpoint (model.safetensors.index.json) "
                      "that would shadow the one written; choose an empty directory", options.out_dir);
  }
  TACHYON_ASSIGN_OR_RETURN(nlohmann::json config_json, read_json_file((source / "config.json").string()));
  if (!config_json.is_object()) {
    return make_error(ErrorCode::kCorruptFile, "{}: expected a JSON object", (source / "config.json").string());
  }

  SavedCheckpoint saved;
  CheckpointQuantization& q = saved.quantization;
  q.method = options.method;
  q.bits = options.method == CheckpointQuantMethod::kAwqGemm ? 4 : 8;
  q.activation_observer = options.activation_observer;
  TensorList list(q);
  list.add("model.embed_tokens.weight", weights.embed_tokens);
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    const LayerWeights& l = weights.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    list.add(p + "input_layernorm.weight", l.attn_norm);
    list.add(p + "post_attention_layernorm.weight", l.ffn_norm);
    list.add(p + "self_attn.q_proj.bias", l.q_bias);
    list.add(p + "self_attn.k_proj.bias", l.k_bias);
    list.add(p + "self_attn.v_proj.bias", l.v_bias);
    list.add(p + "self_attn.o_proj.bias", l.o_bias);
    list.add(p + "self_attn.q_norm.weight", l.q_norm);
    list.add(p + "self_attn.k_norm.weight", l.k_norm);
    struct Named {
      const char* module;
      const Weight* weight;
    };
    for (const Named& m : {Named{"self_attn.q_proj", &l.q_proj}, Named{"self_attn.k_proj", &l.k_proj},
                           Named{"self_attn.v_proj", &l.v_proj}, Named{"self_attn.o_proj", &l.o_proj},
                           Named{"mlp.gate_proj", &l.gate_proj}, Named{"mlp.up_proj", &l.up_proj},
                           Named{"mlp.down_proj", &l.down_proj}}) {
      TACHYON_RETURN_IF_ERROR(list.add_linear(p + m.module, *m.weight, /*listed=*/true));
    }
  }
  list.add("model.norm.weight", weights.final_norm);
  const bool shared_head = weights.lm_head.dense.defined() && weights.embed_tokens.defined() &&
                           weights.lm_head.dense.raw_data() == weights.embed_tokens.raw_data();
  if (!config.tie_word_embeddings && !shared_head) {
    TACHYON_RETURN_IF_ERROR(list.add_linear("lm_head", weights.lm_head, /*listed=*/false));
  }
  if (q.method == CheckpointQuantMethod::kAwqGemm && q.group_size == 0) q.group_size = 128;  // every module dense
  if (!q.static_activations) q.unscaled_modules.clear();  // no static scales: the config's one group says it all

  fs::create_directories(out, ec);
  if (ec) return make_error(ErrorCode::kIo, "{}: cannot create the directory: {}", options.out_dir, ec.message());
  saved.weights_path = (out / "model.safetensors").string();
  TACHYON_RETURN_IF_ERROR(write_safetensors(saved.weights_path, list.tensors()));
  saved.weights_bytes = fs::file_size(saved.weights_path, ec);
  config_json["quantization_config"] = quantization_config_json(q);
  TACHYON_RETURN_IF_ERROR(write_text(out / "config.json", config_json.dump(2) + "\n"));
  for (const char* name : kCopiedFiles) {
    if (!fs::exists(source / name, ec)) continue;
    fs::copy_file(source / name, out / name, fs::copy_options::overwrite_existing, ec);
    if (ec) {
      return make_error(ErrorCode::kIo, "{}: cannot copy {}: {}", options.out_dir, (source / name).string(),
                        ec.message());
    }
  }
  return saved;
}

}  // namespace tachyon
