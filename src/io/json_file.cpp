#include "io/json_file.h"

#include <algorithm>

#include "core/mapped_file.h"

namespace tachyon {

Result<nlohmann::json> parse_json(std::string_view text, const std::string& origin) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte is 1-based and points one past the character where parsing stopped.
    const size_t byte = std::min(e.byte == 0 ? size_t{0} : e.byte - 1, text.size());
    size_t line = 1, column = 1;
    for (size_t k = 0; k < byte; ++k) {
      if (text[k] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return make_error(ErrorCode::kCorruptFile, "{}: invalid JSON at line {}, column {} (byte {}): {}", origin, line,
                      column, byte, e.what());
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kCorruptFile, "{}: invalid JSON: {}", origin, e.what());
  }
}

Result<nlohmann::json> read_json_file(const std::string& path) {
  TACHYON_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_json(text, path);
}

}  // namespace tachyon
