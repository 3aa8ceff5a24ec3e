#include "io/quantization_config.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "io/json_file.h"

namespace tachyon {

namespace {

using nlohmann::json;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The first of `keys` present in `j` (tools spell some keys two ways), or nullptr.
const json* find_any(const json& j, std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    auto it = j.find(key);
    if (it != j.end() && !it->is_null()) return &*it;
  }
  return nullptr;
}

Result<int> int_key(const json& q, std::initializer_list<const char*> keys, const std::string& where) {
  const json* v = find_any(q, keys);
  if (v == nullptr) {
    return make_error(ErrorCode::kCorruptFile, "{}: quantization_config.{} is missing", where, *keys.begin());
  }
  if (!v->is_number_integer() || v->get<int64_t>() < INT32_MIN || v->get<int64_t>() > INT32_MAX) {
    return make_error(ErrorCode::kCorruptFile, "{}: quantization_config.{} is {}, expected an integer of 32 bits", where,
                      *keys.begin(), json_excerpt(*v));
  }
  return v->get<int>();
}

Result<bool> bool_key(const json& q, const char* key, bool absent, const std::string& where) {
  const json* v = find_any(q, {key});
  if (v == nullptr) return absent;
  if (!v->is_boolean()) {
    return make_error(ErrorCode::kCorruptFile, "{}: quantization_config.{} is {}, expected true or false", where, key,
                      json_excerpt(*v));
  }
  return v->get<bool>();
}

Result<std::string> string_key(const json& q, std::initializer_list<const char*> keys, const std::string& absent,
                               const std::string& where) {
  const json* v = find_any(q, keys);
  if (v == nullptr) return absent;
  if (!v->is_string()) {
    return make_error(ErrorCode::kCorruptFile, "{}: quantization_config.{} is {}, expected a string", where,
                      *keys.begin(), json_excerpt(*v));
  }
  return v->get<std::string>();
}

Result<std::vector<std::string>> string_list(const json& q, const char* key, const std::string& where) {
  std::vector<std::string> out;
  const json* v = find_any(q, {key});
  if (v == nullptr) return out;
  if (!v->is_array()) {
    return make_error(ErrorCode::kCorruptFile, "{}: quantization_config.{} is a {}, expected a list of names", where,
                      key, v->type_name());
  }
  for (const json& e : *v) {
    if (!e.is_string()) {
      return make_error(ErrorCode::kCorruptFile, "{}: quantization_config.{} holds {}, expected names", where, key,
                        json_excerpt(e));
    }
    out.push_back(e.get<std::string>());
  }
  return out;
}

// bits == 4 and a group size of at least one input (per-channel int4, group_size -1, has no
// kernel here).
Status check_int4(const CheckpointQuantization& c, const char* method, const std::string& where) {
  if (c.bits != 4) {
    return make_error(ErrorCode::kUnsupported, "{}: quantization_config.bits is {}; only 4-bit {} is supported", where,
                      c.bits, method);
  }
  if (c.group_size <= 0) {
    return make_error(ErrorCode::kUnsupported,
                      "{}: quantization_config.group_size is {}; {} needs a positive group size (per-channel int4 "
                      "is not supported)", where, c.group_size, method);
  }
  return Status::Ok();
}

Result<CheckpointQuantization> read_awq(const json& q, const std::string& where) {
  CheckpointQuantization c;
  c.method = CheckpointQuantMethod::kAwqGemm;
  TACHYON_ASSIGN_OR_RETURN(c.bits, int_key(q, {"bits", "w_bit"}, where));
  TACHYON_ASSIGN_OR_RETURN(c.group_size, int_key(q, {"group_size", "q_group_size"}, where));
  TACHYON_RETURN_IF_ERROR(check_int4(c, "AWQ", where));
  TACHYON_ASSIGN_OR_RETURN(bool zero_point, bool_key(q, "zero_point", true, where));
  if (!zero_point) {
    return make_error(ErrorCode::kUnsupported, "{}: quantization_config.zero_point is false; only AWQ with zero "
                      "points is supported", where);
  }
  TACHYON_ASSIGN_OR_RETURN(std::string version, string_key(q, {"version"}, "gemm", where));
  if (lower(version) != "gemm") {
    return make_error(ErrorCode::kUnsupported, "{}: quantization_config.version is '{}'; only the AutoAWQ 'gemm' "
                      "layout is supported", where, version);
  }
  TACHYON_ASSIGN_OR_RETURN(c.dense_modules, string_list(q, "modules_to_not_convert", where));
  return c;
}

// The engine's own: "format" "ternary", bits 2, group_size 32, 64, 128 or 256.
Result<CheckpointQuantization> read_tachyon(const json& q, const std::string& where) {
  CheckpointQuantization c;
  TACHYON_ASSIGN_OR_RETURN(std::string format, string_key(q, {"format"}, "", where));
  if (lower(format) != "ternary") {
    return make_error(ErrorCode::kUnsupported, "{}: quantization_config.format '{}' of quant_method 'tachyon' is not "
                      "supported (ternary)", where, format);
  }
  c.method = CheckpointQuantMethod::kTernary;
  TACHYON_ASSIGN_OR_RETURN(c.bits, int_key(q, {"bits"}, where));
  TACHYON_ASSIGN_OR_RETURN(c.group_size, int_key(q, {"group_size"}, where));
  if (c.bits != 2) {
    return make_error(ErrorCode::kUnsupported, "{}: quantization_config.bits is {}; ternary weights take 2", where,
                      c.bits);
  }
  if (c.group_size != 32 && c.group_size != 64 && c.group_size != 128 && c.group_size != 256) {
    return make_error(ErrorCode::kUnsupported, "{}: quantization_config.group_size is {}; ternary takes 32, 64, 128 "
                      "or 256", where, c.group_size);
  }
  TACHYON_ASSIGN_OR_RETURN(c.dense_modules, string_list(q, "modules_to_not_convert", where));
  return c;
}

Result<CheckpointQuantization> read_gptq(const json& q, const std::string& where) {
  CheckpointQuantization c;
  c.method = CheckpointQuantMethod::kGptq;
  TACHYON_ASSIGN_OR_RETURN(c.bits, int_key(q, {"bits"}, where));
  TACHYON_ASSIGN_OR_RETURN(c.group_size, int_key(q, {"group_size"}, where));
  TACHYON_ASSIGN_OR_RETURN(bool desc_act, bool_key(q, "desc_act", false, where));
  if (desc_act) {
    return make_error(ErrorCode::kUnsupported, "{}: quantization_config.desc_act is true: act-order GPTQ is not "
                      "supported", where);
  }
  TACHYON_RETURN_IF_ERROR(check_int4(c, "GPTQ", where));
  TACHYON_ASSIGN_OR_RETURN(std::string format, string_key(q, {"checkpoint_format", "format"}, "gptq", where));
  if (lower(format) == "gptq") {
    c.gptq_format = GptqFormat::kV1;
  } else if (lower(format) == "gptq_v2") {
    c.gptq_format = GptqFormat::kV2;
  } else {
    return make_error(ErrorCode::kUnsupported, "{}: quantization_config.checkpoint_format is '{}'; supported are "
                      "'gptq' and 'gptq_v2'", where, format);
  }
  TACHYON_ASSIGN_OR_RETURN(c.dense_modules, string_list(q, "modules_to_not_convert", where));
  return c;
}

// Whether a config group's input_activations are quantized with one static scale per tensor
// (dynamic false, strategy "tensor", 8 bits of `type`, symmetric).
bool static_tensor_activations(const json* activations, const char* type) {
  if (activations == nullptr || !activations->is_object()) return false;
  const auto is = [&](const char* key, const json& want) {
    const json* v = find_any(*activations, {key});
    return v != nullptr && *v == want;
  };
  const json* symmetric = find_any(*activations, {"symmetric"});
  return is("num_bits", 8) && is("type", type) && is("strategy", "tensor") && is("dynamic", false) &&
         (symmetric == nullptr || *symmetric == true);
}

// The observer a static group names (informational).
std::string observer_of(const json* activations) {
  const json* o = activations != nullptr && activations->is_object() ? find_any(*activations, {"observer"}) : nullptr;
  return o != nullptr && o->is_string() ? o->get<std::string>() : std::string();
}

// A config group's "targets" when each is a full module name (not "Linear" or a "re:" pattern):
// appended to `names`; false otherwise.
bool collect_module_names(const json& group, std::vector<std::string>& names) {
  const json* targets = group.is_object() ? find_any(group, {"targets"}) : nullptr;
  if (targets == nullptr || !targets->is_array() || targets->empty()) return false;
  for (const json& t : *targets) {
    if (!t.is_string()) return false;
    const std::string name = t.get<std::string>();
    if (name == "Linear" || name.starts_with("re:") || name.find('.') == std::string::npos) return false;
    names.push_back(name);
  }
  return true;
}

// Static groups beside groups without static scales: those must name their modules (which then
// run per token / unrounded); without a static group, the others are the whole checkpoint.
Status check_unscaled_groups(CheckpointQuantization& c, bool other_groups, bool names_only,
                             std::vector<std::string> names, const std::string& where) {
  if (!c.static_activations || !other_groups) return Status::Ok();
  if (!names_only) {
    return make_error(ErrorCode::kUnsupported, "{}: config groups mix static activation scales with other input "
                      "activations by class or pattern; supported is a static group beside groups whose targets are "
                      "module names", where);
  }
  c.unscaled_modules = std::move(names);
  return Status::Ok();
}

// compressed-tensors "float-quantized": every config group's weights fp8 e4m3 (num_bits 8, type
// float) per channel or per tensor. Static fp8 input activations per tensor (FP8 W8A8 with an
// input_scale per module) run as such; dynamic ones (per token) run unquantized: the weights are
// what the checkpoint stores, the activations keep the model's precision.
Result<CheckpointQuantization> read_compressed_fp8(const json& q, const std::string& where) {
  CheckpointQuantization c;
  c.method = CheckpointQuantMethod::kFp8Channel;
  c.bits = 8;
  const json* groups = find_any(q, {"config_groups"});
  if (groups == nullptr || !groups->is_object() || groups->empty()) {
    return make_error(ErrorCode::kCorruptFile, "{}: quantization_config.config_groups is missing or empty", where);
  }
  std::vector<std::string> other_targets;  // of the groups without static scales
  bool other_names_only = true;
  bool other_groups = false;
  for (const auto& [name, group] : groups->items()) {
    const json* weights = group.is_object() ? find_any(group, {"weights"}) : nullptr;
    const auto is = [](const json& j, const char* key, const json& want) {
      const json* v = find_any(j, {key});
      return v != nullptr && *v == want;
    };
    if (weights == nullptr || !weights->is_object() || !is(*weights, "num_bits", 8) || !is(*weights, "type", "float") ||
        !(is(*weights, "strategy", "channel") || is(*weights, "strategy", "tensor"))) {
      return make_error(ErrorCode::kUnsupported, "{}: quantization_config.config_groups.{}.weights {}: supported is "
                        "fp8 (num_bits 8, type float) per channel or per tensor", where, name,
                        weights != nullptr ? excerpt(weights->dump()) : "missing");
    }
    const json* activations = find_any(group, {"input_activations"});
    const bool quantized = activations != nullptr && activations->is_object();
    const bool static_fp8 = static_tensor_activations(activations, "float");
    if (quantized && !static_fp8 && !is(*activations, "dynamic", true)) {
      return make_error(ErrorCode::kUnsupported, "{}: quantization_config.config_groups.{}.input_activations {}: "
                        "supported are 16-bit, dynamic, or static fp8 per tensor", where, name,
                        excerpt(activations->dump()));
    }
    if (static_fp8) {
      c.static_activations = true;
      c.activation_observer = observer_of(activations);
    } else {
      other_groups = true;
      other_names_only = other_names_only && collect_module_names(group, other_targets);
    }
  }
  TACHYON_RETURN_IF_ERROR(check_unscaled_groups(c, other_groups, other_names_only, std::move(other_targets), where));
  TACHYON_ASSIGN_OR_RETURN(c.dense_modules, string_list(q, "ignore", where));
  return c;
}

// compressed-tensors: every config group must quantize weights to symmetric int8 per channel,
// stored unpacked ("int-quantized" / "naive-quantized"), and either leave activations alone
// (W8A16) or quantize them to symmetric int8 per token, dynamically (W8A8); all groups alike.
Result<CheckpointQuantization> read_compressed_tensors(const json& q, const std::string& where) {
  CheckpointQuantization c;
  c.method = CheckpointQuantMethod::kInt8Channel;
  c.bits = 8;
  TACHYON_ASSIGN_OR_RETURN(std::string format, string_key(q, {"format"}, "", where));
  if (format == "float-quantized") return read_compressed_fp8(q, where);
  if (format != "int-quantized" && format != "naive-quantized") {
    return make_error(ErrorCode::kUnsupported, "{}: compressed-tensors format '{}' is not supported ('int-quantized' "
                      "int8 per channel and 'float-quantized' fp8 are)", where, format);
  }
  const json* groups = find_any(q, {"config_groups"});
  if (groups == nullptr || !groups->is_object() || groups->empty()) {
    return make_error(ErrorCode::kCorruptFile, "{}: quantization_config.config_groups is missing or empty", where);
  }
  bool first = true;
  std::vector<std::string> token_targets;  // of the per-token groups
  bool token_names_only = true, token_groups = false;
  for (const auto& [name, group] : groups->items()) {
    const std::string at = fmt::format("{}: quantization_config.config_groups.{}", where, name);
    const json* weights = group.is_object() ? find_any(group, {"weights"}) : nullptr;
    if (weights == nullptr || !weights->is_object()) {
      return make_error(ErrorCode::kCorruptFile, "{}.weights is missing", at);
    }
    const json* activations = find_any(group, {"input_activations"});
    // Read leniently (a wrong JSON type is just "not what is supported"): nlohmann's typed
    // accessors would throw.
    auto is = [](const json& j, const char* key, const json& want) {
      const json* v = find_any(j, {key});
      return v != nullptr && *v == want;
    };
    const bool int8_channel = is(*weights, "num_bits", 8) && is(*weights, "type", "int") &&
                              is(*weights, "strategy", "channel") && is(*weights, "symmetric", true);
    const bool int8_tokens = activations != nullptr && activations->is_object() && is(*activations, "num_bits", 8) &&
                             is(*activations, "type", "int") && is(*activations, "strategy", "token") &&
                             is(*activations, "dynamic", true) && is(*activations, "symmetric", true);
    const bool int8_static = static_tensor_activations(activations, "int");
    const bool quantized_activations = activations != nullptr && !activations->is_null();
    if (!int8_channel || (quantized_activations && !int8_tokens && !int8_static)) {
      return make_error(ErrorCode::kUnsupported, "{}: weights {}{}; supported is symmetric int8 per channel with "
                        "16-bit activations, dynamic symmetric int8 activations per token or static ones per tensor",
                        at, excerpt(weights->dump()),
                        quantized_activations ? " with input activations " + excerpt(activations->dump()) : "");
    }
    const CheckpointQuantMethod method =
        int8_tokens || int8_static ? CheckpointQuantMethod::kW8A8 : CheckpointQuantMethod::kInt8Channel;
    if (!first && method != c.method) {
      return make_error(ErrorCode::kUnsupported, "{}: config groups mix 16-bit and int8 activations", at);
    }
    c.method = method;
    if (int8_static) {
      c.static_activations = true;
      c.activation_observer = observer_of(activations);
    } else if (int8_tokens) {
      token_groups = true;
      token_names_only = token_names_only && collect_module_names(group, token_targets);
    }
    first = false;
  }
  TACHYON_RETURN_IF_ERROR(check_unscaled_groups(c, token_groups, token_names_only, std::move(token_targets), where));
  TACHYON_ASSIGN_OR_RETURN(c.dense_modules, string_list(q, "ignore", where));
  return c;
}

}  // namespace

std::string CheckpointQuantization::describe() const {
  switch (method) {
    case CheckpointQuantMethod::kNone: return "dense";
    case CheckpointQuantMethod::kAwqGemm: return fmt::format("int4 awq g{}", group_size);
    case CheckpointQuantMethod::kGptq:
      return fmt::format("int4 gptq{} g{}", gptq_format == GptqFormat::kV2 ? "_v2" : "", group_size);
    case CheckpointQuantMethod::kInt8Channel: return "int8 per channel";
    case CheckpointQuantMethod::kW8A8:
      if (!static_activations) return "w8a8";
      return unscaled_modules.empty()
                 ? "w8a8 (static activation scales)"
                 : fmt::format("w8a8 (static activation scales; {} modules per token)", unscaled_modules.size());
    case CheckpointQuantMethod::kFp8Channel:
      if (!static_activations) return "fp8 per channel";
      return unscaled_modules.empty() ? "fp8 per channel (static activation scales)"
                                      : fmt::format("fp8 per channel (static activation scales; {} modules "
                                                    "16-bit activations)", unscaled_modules.size());
    case CheckpointQuantMethod::kTernary: return fmt::format("ternary g{}", group_size);
  }
  return "?";
}

Result<CheckpointQuantization> read_quantization_config(const json& config, const std::string& path) {
  auto it = config.find("quantization_config");
  if (it == config.end() || it->is_null()) return CheckpointQuantization();
  if (!it->is_object()) {
    return make_error(ErrorCode::kCorruptFile, "{}: quantization_config is a {}, expected an object", path,
                      it->type_name());
  }
  const json& q = *it;
  TACHYON_ASSIGN_OR_RETURN(std::string method, string_key(q, {"quant_method"}, "", path));
  method = lower(method);
  if (method == "awq") return read_awq(q, path);
  if (method == "gptq") return read_gptq(q, path);
  if (method == "compressed-tensors") return read_compressed_tensors(q, path);
  if (method == "tachyon") return read_tachyon(q, path);
  return make_error(ErrorCode::kUnsupported, "{}: quantization_config.quant_method '{}' is not supported (awq, gptq, "
                    "compressed-tensors int8 / w8a8 / fp8, tachyon ternary)", path, method);
}

namespace {

// compressed-tensors' input_activations of static per-tensor scales (<module>.input_scale).
json static_activations_json(const char* type, const std::string& observer) {
  return {{"num_bits", 8},         {"type", type},     {"symmetric", true},
          {"strategy", "tensor"},  {"group_size", nullptr}, {"dynamic", false},
          {"observer", observer.empty() ? json("minmax") : json(observer)}};
}

}  // namespace

json quantization_config_json(const CheckpointQuantization& q) {
  json dense = q.dense_modules;
  switch (q.method) {
    case CheckpointQuantMethod::kAwqGemm:
      return {{"quant_method", "awq"}, {"bits", 4},           {"group_size", q.group_size},
              {"zero_point", true},    {"version", "gemm"},   {"modules_to_not_convert", q.dense_modules.empty() ? json() : dense}};
    case CheckpointQuantMethod::kInt8Channel:
    case CheckpointQuantMethod::kW8A8: {
      // Symmetric int8 per output channel, weight [out, in] i8 and weight_scale [out, 1] f32
      // (quant/quantize.h), activations left 16-bit (compressed-tensors' W8A16 "int-quantized")
      // or quantized to int8 per token when the layer runs (W8A8).
      json weights = {{"num_bits", 8},        {"type", "int"},     {"symmetric", true}, {"strategy", "channel"},
                      {"group_size", nullptr}, {"dynamic", false}, {"observer", "minmax"}};
      json activations = nullptr;
      if (q.method == CheckpointQuantMethod::kW8A8 && q.static_activations) {
        activations = static_activations_json("int", q.activation_observer);
      } else if (q.method == CheckpointQuantMethod::kW8A8) {
        activations = {{"num_bits", 8},         {"type", "int"},    {"symmetric", true}, {"strategy", "token"},
                       {"group_size", nullptr}, {"dynamic", true},  {"observer", nullptr}};
      }
      json group = {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", activations},
                    {"output_activations", nullptr}};
      json groups = {{"group_0", group}};
      if (q.static_activations && !q.unscaled_modules.empty()) {
        json per_token = group;
        per_token["targets"] = q.unscaled_modules;
        per_token["input_activations"] = {{"num_bits", 8},         {"type", "int"},   {"symmetric", true},
                                          {"strategy", "token"},   {"group_size", nullptr},
                                          {"dynamic", true},       {"observer", nullptr}};
        groups["group_1"] = per_token;
      }
      json ignore = dense;
      ignore.insert(ignore.begin(), "lm_head");
      return {{"quant_method", "compressed-tensors"}, {"format", "int-quantized"},
              {"quantization_status", "compressed"},  {"config_groups", groups},
              {"ignore", ignore}};
    }
    case CheckpointQuantMethod::kFp8Channel: {
      // fp8 e4m3 per output channel, weight [out, in] F8_E4M3 and weight_scale [out, 1] f32:
      // compressed-tensors' "float-quantized" with 16-bit activations, or static fp8 ones.
      json weights = {{"num_bits", 8},        {"type", "float"},   {"symmetric", true}, {"strategy", "channel"},
                      {"group_size", nullptr}, {"dynamic", false}, {"observer", "minmax"}};
      json activations = q.static_activations ? static_activations_json("float", q.activation_observer) : json();
      json group = {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", activations},
                    {"output_activations", nullptr}};
      json groups = {{"group_0", group}};
      if (q.static_activations && !q.unscaled_modules.empty()) {
        json unrounded = group;
        unrounded["targets"] = q.unscaled_modules;
        unrounded["input_activations"] = nullptr;
        groups["group_1"] = unrounded;
      }
      json ignore = dense;
      ignore.insert(ignore.begin(), "lm_head");
      return {{"quant_method", "compressed-tensors"}, {"format", "float-quantized"},
              {"quantization_status", "compressed"},  {"config_groups", groups},
              {"ignore", ignore}};
    }
    case CheckpointQuantMethod::kTernary:
      // quant/quantize.h's kTernary as stored: <module>.weight_packed [out, in / 4] U8 and
      // <module>.weight_scale [out, in / group_size] F32.
      return {{"quant_method", "tachyon"},
              {"format", "ternary"},
              {"bits", 2},
              {"group_size", q.group_size},
              {"modules_to_not_convert", q.dense_modules.empty() ? json() : dense}};
    default: break;
  }
  return json();
}

}  // namespace tachyon
