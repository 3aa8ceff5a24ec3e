#include "tokenizer_test_util.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "io/gguf.h"
#include "test_util.h"

namespace tachyon::testing {
namespace {

std::string tokenizers_dir() { return shared_dir().value_or("") + "/tokenizers"; }

Result<std::unique_ptr<Tokenizer>> load_gguf(const std::string& file) {
  TACHYON_ASSIGN_OR_RETURN(GgufFile gguf, GgufFile::open(tokenizers_dir() + "/llama.cpp-vocab/" + file));
  return Tokenizer::from_gguf(gguf);
}

Result<std::unique_ptr<Tokenizer>> load_llama3() {
  const std::string dir = tokenizers_dir() + "/llama3";
  TACHYON_ASSIGN_OR_RETURN(auto specials, read_hf_special_tokens(dir + "/tokenizer_config.json"));
  TiktokenOptions options;
  options.bos_token = "<|begin_of_text|>";
  options.eos_tokens = {"<|eot_id|>", "<|end_of_text|>"};
  options.add_bos = true;
  return Tokenizer::from_tiktoken(dir + "/tokenizer.model", std::string(kLlama3Pattern), specials, options);
}

Result<std::unique_ptr<Tokenizer>> load_qwen() {
  // Qwen's own code defines these after the 151,643 ranks.
  std::map<std::string, int32_t> specials = {
      {"<|endoftext|>", 151643}, {"<|im_start|>", 151644}, {"<|im_end|>", 151645}};
  for (int i = 0; i < 205; ++i) specials.emplace("<|extra_" + std::to_string(i) + "|>", 151646 + i);
  TiktokenOptions options;
  options.eos_tokens = {"<|endoftext|>"};
  return Tokenizer::from_tiktoken(tokenizers_dir() + "/qwen/qwen.tiktoken", std::string(kQwen2Pattern), specials,
                                  options);
}

Result<std::unique_ptr<Tokenizer>> load(const std::string& name) {
  if (name == "gpt2-gguf") return load_gguf("ggml-vocab-gpt-2.gguf");
  if (name == "llama-spm-gguf") return load_gguf("ggml-vocab-llama-spm.gguf");
  if (name == "phi-3-gguf") return load_gguf("ggml-vocab-phi-3.gguf");
  if (name == "falcon-gguf") return load_gguf("ggml-vocab-falcon.gguf");
  if (name == "mpt-gguf") return load_gguf("ggml-vocab-mpt.gguf");
  if (name == "llama3-tiktoken") return load_llama3();
  if (name == "qwen-tiktoken") return load_qwen();
  if (name == "gpt2-files") {
    return Tokenizer::from_gpt2_files(tokenizers_dir() + "/gpt2/encoder.json", tokenizers_dir() + "/gpt2/vocab.bpe");
  }
  if (name == "codellama-hf") return Tokenizer::from_hf_json(tokenizers_dir() + "/codellama-hf/tokenizer.json", "");
  if (name == "llama2-bin") {
    return Tokenizer::from_llama2c(tokenizers_dir() + "/llama2-sentencepiece/tokenizer.bin", 32000);
  }
  if (name == "stories260k") {
    return Tokenizer::from_llama2c(shared_dir().value_or("") + "/models/stories260K/tok512.bin", 512);
  }
  if (name == "tiny-bytelevel-hf") {
    return Tokenizer::from_hf_json(fixture_dir() + "/tiny_bytelevel/tokenizer.json",
                                   fixture_dir() + "/tiny_bytelevel/tokenizer_config.json");
  }
  if (name == "tiny-metaspace-hf") {
    return Tokenizer::from_hf_json(fixture_dir() + "/tiny_metaspace/tokenizer.json", "");
  }
  return make_error(ErrorCode::kNotFound, "no test tokenizer named '{}'", name);
}

}  // namespace

bool tokenizer_needs_shared(const std::string& name) { return name.rfind("tiny-", 0) != 0; }

const Tokenizer* shared_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  if (auto it = cache.find(name); it != cache.end()) return it->second.get();
  auto loaded = load(name);
  if (!loaded.ok()) {
    ADD_FAILURE() << "loading tokenizer " << name << ": " << loaded.status().to_string();
    return nullptr;
  }
  const Tokenizer* raw = loaded->get();
  cache.emplace(name, std::move(loaded).value());
  return raw;
}

std::string fixture_dir() { return source_dir() + "/tests/fixtures/tokenizer"; }

std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> read_vocab_test_inputs(const std::string& path) {
  const std::string text = read_file_bytes(path);
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t hit = text.find(separator, pos);
    if (hit == std::string::npos) break;
    out.push_back(text.substr(pos, hit - pos));
    pos = hit + separator.size();
  }
  return out;  // the empty tail after the last separator is not a test
}

std::vector<std::vector<int32_t>> read_vocab_test_outputs(const std::string& path) {
  std::istringstream in(read_file_bytes(path));
  std::vector<std::vector<int32_t>> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::vector<int32_t> ids;
    int64_t id = 0;
    while (fields >> id) ids.push_back(static_cast<int32_t>(id));
    out.push_back(std::move(ids));
  }
  return out;
}

std::string ids_to_string(const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) {
    if (!out.empty()) out.push_back(' ');
    out += std::to_string(id);
  }
  return out;
}

std::string escape_bytes(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buffer[8];
      std::snprintf(buffer, sizeof(buffer), "\\x%02X", c);
      out += buffer;
    }
  }
  return out;
}

}  // namespace tachyon::testing
