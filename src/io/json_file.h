// Reading JSON files and strings into nlohmann::json with errors as Status: a parse error
// names the file and the line, column and byte where parsing stopped. nlohmann's exceptions
// never escape this file's functions.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace tachyon {

// Parses `text`; `origin` names where it came from in messages (a path, or "path: header").
Result<nlohmann::json> parse_json(std::string_view text, const std::string& origin);
// Reads and parses a whole file. NotFound if the file is absent.
Result<nlohmann::json> read_json_file(const std::string& path);

}  // namespace tachyon
