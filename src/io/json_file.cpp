#include "io/json_file.h"

#include <algorithm>

#include "core/mapped_file.h"

namespace tachyon {
namespace {

// 1-based line and column of byte `byte` of `text`.
std::pair<size_t, size_t> line_and_column(std::string_view text, size_t byte) {
  size_t line = 1, column = 1;
  for (size_t k = 0; k < std::min(byte, text.size()); ++k) {
    if (text[k] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

}  // namespace

Status check_json_depth(std::string_view text, const std::string& origin) {
  int depth = 0;
  bool in_string = false;
  for (size_t k = 0; k < text.size(); ++k) {
    const char c = text[k];
    if (in_string) {
      if (c == '\\') ++k;  // the escaped character cannot end the string
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        const auto [line, column] = line_and_column(text, k);
        return make_error(ErrorCode::kCorruptFile,
                          "{}: JSON nested deeper than {} levels (the limit) at line {}, column {} (byte {})", origin,
                          kMaxJsonDepth, line, column, k);
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return Status::Ok();
}

Result<nlohmann::json> parse_json(std::string_view text, const std::string& origin) {
  TACHYON_RETURN_IF_ERROR(check_json_depth(text, origin));
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte is 1-based and points one past the character where parsing stopped.
    const size_t byte = std::min(e.byte == 0 ? size_t{0} : e.byte - 1, text.size());
    const auto [line, column] = line_and_column(text, byte);
    return make_error(ErrorCode::kCorruptFile, "{}: invalid JSON at line {}, column {} (byte {}): {}", origin, line,
                      column, byte, excerpt(e.what()));
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kCorruptFile, "{}: invalid JSON: {}", origin, excerpt(e.what()));
  }
}

Result<nlohmann::json> read_json_file(const std::string& path) {
  TACHYON_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_json(text, path);
}

}  // namespace tachyon
